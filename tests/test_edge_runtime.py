"""The runtime registry and the model wrapper (EdgeModel), with a fake interpreter; import hygiene."""

from __future__ import annotations

import ast
import subprocess
import sys
import types

import numpy as np
import pytest
from edge_bundle import REPO, example_manifest

import edge_demo.runtimes
from bundle_contract.errors import UsageError
from bundle_contract.tensors import TensorSpec
from edge_demo.runtimes import runtime as runtime_mod
from edge_demo.runtimes.model import EdgeModel, InferenceError
from edge_demo.runtimes.runtime import RUNTIMES, Runtime, RuntimeEntry, select_runtime


class FakeInterpreter:
    """The tf.lite interface: int8 in (scale 0.5, zp 1), int8 out (1/256, -128).

    invoke() writes q_out[j] = q_in.sum() + j - 128, clipped; fails if the input sums to 99.
    """

    def __init__(self, model_content: bytes, num_threads: int):
        self.threads = num_threads
        self.tensors = {0: np.zeros((1, 3), np.int8), 1: np.zeros((1, 4), np.int8)}

    def allocate_tensors(self) -> None:
        pass

    def get_input_details(self) -> list[dict]:
        shape = np.array([1, 3])
        return [
            {"index": 0, "name": "in", "shape": shape, "dtype": np.int8, "quantization": (0.5, 1)}
        ]

    def get_output_details(self) -> list[dict]:
        quantization = (1 / 256, -128)
        shape = np.array([1, 4])
        return [
            {
                "index": 1,
                "name": "out",
                "shape": shape,
                "dtype": np.int8,
                "quantization": quantization,
            }
        ]

    def set_tensor(self, index: int, value: np.ndarray) -> None:
        assert value.dtype == self.tensors[index].dtype and value.shape == self.tensors[index].shape
        self.tensors[index] = value.copy()

    def invoke(self) -> None:
        total = int(self.tensors[0].astype(np.int32).sum())
        if total == 99:
            raise RuntimeError("kernel failed")
        self.tensors[1] = np.clip(total + np.arange(4) - 128, -128, 127).astype(np.int8)[None]

    def get_tensor(self, index: int) -> np.ndarray:
        return self.tensors[index].copy()


FAKE_RUNTIME = Runtime("fake", "0", "fake.interpreter", FakeInterpreter)


def test_edge_model_quantizes_inputs_and_dequantizes_outputs():
    model = EdgeModel(FAKE_RUNTIME, b"", threads=2, where="model_fake.tflite")
    assert model.interpreter.threads == 2
    assert model.input == TensorSpec("in", (1, 3), "int8", 0.5, 1)
    x = np.array([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
    # q_in = round(x / 0.5) + 1 = [3, 1, 2] (sum 6) and [1, 1, 1] (sum 3)
    probs = model.predict(x)
    expected = (np.array([[6, 7, 8, 9], [3, 4, 5, 6]], np.float32)) / 256
    np.testing.assert_allclose(probs, expected)
    raw, latencies = model.run(model.prepare(x), repeat=3)
    assert raw.dtype == np.int8 and latencies.shape == (6,) and (latencies > 0).all()


def test_a_long_timing_loop_reports_its_progress_and_a_short_one_stays_quiet():
    import io

    from edge_demo.runtimes.score import Progress

    model = EdgeModel(FAKE_RUNTIME, b"", where="model_fake.tflite")
    calls = []
    model.run(model.prepare(np.zeros((2, 3), np.float32)), 4, lambda *a: calls.append(a))
    assert [c[:2] for c in calls] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(b[2] >= a[2] >= 0 for a, b in zip(calls, calls[1:]))
    out = io.StringIO()
    quiet = Progress("int8", every=10, stream=out)
    for done, seconds in [(1, 2.0), (2, 4.0), (3, 6.0)]:
        quiet(done, 3, seconds)
    assert out.getvalue() == ""  # under 10 s: nothing
    loud = Progress("int8", every=10, stream=out)
    for done in range(1, 7):  # 4 s a pass
        loud(done, 6, 4.0 * done)
    assert out.getvalue().splitlines() == [
        "int8: pass 3 of 6, 12 s, about 12 s left",
        "int8: pass 6 of 6, 24 s, about 0 s left",
    ]


def test_repeat_is_bounded_in_one_line(capsys):
    from edge_demo.app.cli import MAX_REPEAT, build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["b", "--repeat", str(MAX_REPEAT + 1)])
    assert exc.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--repeat" in line and f"from 1 to {MAX_REPEAT}, got {MAX_REPEAT + 1}" in line
    assert build_parser().parse_args(["b", "--repeat", str(MAX_REPEAT)]).repeat == MAX_REPEAT


def test_edge_model_reports_a_runtime_failure_and_a_manifest_mismatch():
    model = EdgeModel(FAKE_RUNTIME, b"", where="model_fake.tflite")
    with pytest.raises(InferenceError, match="fake failed on sample 1: kernel failed"):
        model.run(np.array([[1, 1, 1], [33, 33, 33]], np.int8))
    entry = example_manifest().models["int8"]
    with pytest.raises(
        UsageError,
        match="model_fake.tflite: input tensor differs.*shape \\[1, 3\\] vs \\[1, 8, 8\\]",
    ):
        model.check_manifest(entry)


def test_a_runtime_that_cannot_load_is_one_line():
    def broken(model_content, num_threads):
        raise ValueError("Model provided has model identifier 'xxxx'\nmore")

    with pytest.raises(UsageError, match="^m.tflite: fake cannot load it \\(Model provided"):
        EdgeModel(Runtime("fake", "0", "fake", broken), b"", where="m.tflite")


def test_a_third_runtime_plugs_in_as_one_entry(monkeypatch):
    """An entry whose module lives in this package (".name"), as the TFLite Micro adapter does."""
    name = f"{edge_demo.runtimes.__name__}.fake_runtime_for_tests"
    module = types.ModuleType(name)
    module.Interpreter = FakeInterpreter
    module.__version__ = "9.9"
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(
        RUNTIMES,
        "fake",
        RuntimeEntry("fake-rt", ".fake_runtime_for_tests", ".fake_runtime_for_tests"),
    )
    runtime = select_runtime("fake")
    assert (runtime.name, runtime.version, runtime.module) == ("fake-rt", "9.9", name)
    assert EdgeModel(runtime, b"").predict(np.zeros((1, 3), np.float32)).shape == (1, 4)


def test_unknown_and_unimportable_runtimes_are_usage_errors(monkeypatch):
    with pytest.raises(UsageError, match="--runtime: unknown runtime 'nope'"):
        select_runtime("nope")
    monkeypatch.setitem(
        RUNTIMES, "missing", RuntimeEntry("missing-rt", "no_such_runtime_module", "x")
    )
    with pytest.raises(UsageError, match="missing-rt: cannot import no_such_runtime_module"):
        select_runtime("missing")
    monkeypatch.setattr(runtime_mod, "RUNTIMES", {"missing": RUNTIMES["missing"]})
    with pytest.raises(UsageError, match="no TFLite runtime found"):
        select_runtime("auto")


# --- import hygiene ------------------------------------------------------------------

ALLOWED_TOP_LEVEL = {"numpy", "ai_edge_litert", "tflite_runtime", "tflite_micro"}
# Hugging Face's tokenizers, for an embedding bundle's tokenizer.json: in one
# module only, imported when such a bundle is opened.
ALLOWED_IN = {"tokenizers": {"subwords.py"}}


def test_edge_demo_imports_only_stdlib_numpy_and_a_runtime():
    """What a device copies (edge_demo.DEVICE_PACKAGES) imports the standard library,
    numpy, a runtime, tokenizers where it reads tokenizer.json, and itself."""
    from edge_demo import DEVICE_PACKAGES

    paths = sorted(p for package in DEVICE_PACKAGES for p in (REPO / package).rglob("*.py"))
    assert len(paths) > 40
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                allowed = (
                    top in ALLOWED_TOP_LEVEL
                    or top in DEVICE_PACKAGES
                    or path.name in ALLOWED_IN.get(top, ())
                )
                assert top in sys.stdlib_module_names or allowed, (path.name, name)
    for entry in RUNTIMES.values():
        for module in (entry.module, entry.package):
            assert module.startswith(".") or module.split(".")[0] in ALLOWED_TOP_LEVEL


def test_starting_the_app_imports_no_runtime_and_no_tensorflow():
    code = (
        "import sys, edge_demo.app.cli\n"
        "heavy = ('tensorflow', 'keras', 'keras_mha', 'ai_edge_litert', 'tflite_runtime',"
        " 'tokenizers')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == "[]"
