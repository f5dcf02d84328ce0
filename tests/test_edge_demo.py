"""The edge demo: pure-numpy parts in process, the app as the device runs it.

The app runs as a subprocess in TensorFlow-free venvs (`make edge-venvs`):
LiteRT (KERAS_MHA_EDGE_PYTHON, default .venv-edge/bin/python) and
tflite-runtime (KERAS_MHA_TFLITE_PYTHON, default .venv-edge-tflite/bin/python),
with its working directory a temporary copy of edge_demo/ alone.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from keras_mha_edge import bundle as bundle_mod
from keras_mha_edge import runtime as runtime_mod
from keras_mha_edge.app import main
from keras_mha_edge.errors import BadInput
from keras_mha_edge.parity import check_thresholds
from keras_mha_edge.report import render_features, write_json
from keras_mha_edge.runtime import (
    RUNTIMES,
    EdgeModel,
    InferenceError,
    Runtime,
    dequantize,
    quantize,
    to_input,
)
from keras_mha_edge.text import parse_vocab

REPO = pathlib.Path(__file__).resolve().parents[1]
EDGE_VENVS = {
    "litert": ("KERAS_MHA_EDGE_PYTHON", REPO / ".venv-edge" / "bin" / "python"),
    "tflite-runtime": ("KERAS_MHA_TFLITE_PYTHON", REPO / ".venv-edge-tflite" / "bin" / "python"),
}
RUNTIME_NAMES = {"litert": "ai-edge-litert", "tflite-runtime": "tflite-runtime"}
ALL_MODES = ["float32", "dynamic", "float16", "int8", "int16x8"]
# What tflite-runtime 2.14 may not run (FIELD_NOTES.md): TF 2.21's dynamic-range
# models (FULLY_CONNECTED v12, when weights are big enough to be quantized) and
# int16x8 (RSQRT). LiteRT runs everything.
TFLITE_RUNTIME_MAY_SKIP = {"dynamic", "int16x8"}


# --- helpers ------------------------------------------------------------------


def edge_python(runtime: str) -> pathlib.Path:
    """The TensorFlow-free interpreter for `runtime`; fails if the venv is missing."""
    env_var, default = EDGE_VENVS[runtime]
    path = pathlib.Path(os.environ.get(env_var) or default)
    if not path.exists():
        pytest.fail(
            f"{path} not found: run `make edge-venvs` (or set {env_var}); `make test` creates it",
            pytrace=False,
        )
    return path


def run_app(
    python: pathlib.Path, cwd: pathlib.Path, *args: str | os.PathLike, module: bool = True
) -> subprocess.CompletedProcess:
    """`python -m edge_demo ARGS` in `cwd`, without PYTHONPATH leaking in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [str(python), "-m", "edge_demo"] if module else [str(python)]
    return subprocess.run(
        [*command, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def assert_bad_input(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr containing every fragment, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edit_manifest(bundle: pathlib.Path, edit) -> None:
    """Apply `edit(manifest_dict)` to bundle/manifest.json."""
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def match_model_file(bundle: pathlib.Path, mode: str) -> None:
    """Make the manifest's size and sha256 for `mode` match the file (as a forger would)."""
    path = bundle / f"model_{mode}.tflite"

    def edit(manifest):
        manifest["models"][mode].update(bytes=path.stat().st_size, sha256=sha256(path))

    edit_manifest(bundle, edit)


def match_file(bundle: pathlib.Path, key: str) -> None:
    """Make manifest `key` (eval, labels, vocab) sha256 match its file."""
    edit_manifest(bundle, lambda m: m[key].update(sha256=sha256(bundle / m[key]["file"])))


def valid_manifest() -> dict:
    """A manifest dict exactly as docs/artifacts.md shows it (two modes)."""

    def model(mode: str, dtype: str, scale, zero_point, thresholds) -> dict:
        return {
            "file": f"model_{mode}.tflite",
            "sha256": "a" * 64,
            "bytes": 24000,
            "input": {
                "name": "in",
                "shape": [1, 8, 8],
                "dtype": dtype,
                "scale": scale,
                "zero_point": zero_point,
            },
            "output": {
                "name": "out",
                "shape": [1, 10],
                "dtype": dtype,
                "scale": scale,
                "zero_point": zero_point,
            },
            "ops": {"FULLY_CONNECTED": 4},
            "parity": {
                "accuracy": 0.98,
                "agreement": 1.0,
                "max_abs_diff": 0.08,
                "mean_abs_diff": 0.004,
            },
            "thresholds": thresholds,
            "verified": True,
            "runtimes": {"ai-edge-litert": True, "tflite-runtime": True},
        }

    return {
        "format": "keras-mha-bundle",
        "format_version": 1,
        "created_by": {
            "keras_mha": "0.1.0",
            "tensorflow": "2.21.0",
            "keras": "3.15.1",
            "numpy": "2.4.6",
        },
        "created_at": "2026-11-29T18:00:00Z",
        "source_model": {"file": "model.keras", "sha256": "b" * 64, "dataset": "digits"},
        "eval": {
            "file": "eval.npz",
            "sha256": "c" * 64,
            "samples": 360,
            "x_shape": [360, 8, 8],
            "x_dtype": "float32",
            "num_classes": 10,
            "float_accuracy": 0.98,
        },
        "labels": {"file": "labels.json", "sha256": "d" * 64},
        "vocab": None,
        "verified": ["float32", "int8"],
        "models": {
            "int8": model(
                "int8", "int8", 0.0039, -128, {"min_agreement": 0.995, "max_accuracy_drop": 0.005}
            ),
            "float32": model("float32", "float32", None, None, {"max_abs_diff": 1e-5}),
        },
    }


VALID_VOCAB = {
    "tokens": ["<pad>", "<unk>", "the", "cat", "sat", "don't"],
    "pad_id": 0,
    "unk_id": 1,
    "max_length": 4,
    "lowercase": True,
    "token_pattern": "[a-z']+",
}


# --- quantization (in process) ---------------------------------------------------


def test_quantize_known_values_round_half_away_from_zero():
    x = np.array([0.0, 0.25, -0.25, 0.75, 1.0, -1.0, 100.0, -100.0], np.float32)
    q = quantize(x, scale=0.5, zero_point=3, dtype=np.int8)
    # x / 0.5 = 0, 0.5, -0.5, 1.5, 2, -2, 200, -200 -> round half away -> + 3 -> clip
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, [3, 4, 2, 5, 5, 1, 127, -128])


def test_quantize_int16_and_uint8_clip_to_their_ranges():
    x = np.array([-2.0, 0.0, 2.0], np.float32)
    np.testing.assert_array_equal(quantize(x, 1e-5, 0, np.int16), [-32768, 0, 32767])
    np.testing.assert_array_equal(quantize(x, 0.01, 128, np.uint8), [0, 128, 255])


@pytest.mark.parametrize(
    "scale,zero_point,dtype",
    [(1 / 255, -128, np.int8), (3.0518509e-05, 0, np.int16), (0.02, 7, np.int8)],
    ids=["int8-digits-input", "int16-symmetric", "int8-odd-zero-point"],
)
def test_dequantize_inverts_quantize_within_half_a_step(scale, zero_point, dtype):
    x = np.linspace(0.0, 1.0, 101, dtype=np.float32)
    back = dequantize(quantize(x, scale, zero_point, dtype), scale, zero_point)
    assert back.dtype == np.float32
    assert np.abs(back - x).max() <= scale / 2 + 1e-7


def test_dequantize_int8_softmax_output():
    q = np.array([-128, 0, 127], np.int8)
    np.testing.assert_allclose(dequantize(q, 1 / 256, -128), [0.0, 0.5, 255 / 256])


def test_to_input_casts_floats_and_ids_and_refuses_floats_as_ids():
    assert to_input(np.zeros((1, 8, 8), np.float64), "float32", None, None).dtype == np.float32
    ids = to_input(np.array([[2, 3, 0]], np.int64), "int32", None, None)
    assert ids.dtype == np.int32 and ids.tolist() == [[2, 3, 0]]
    with pytest.raises(ValueError, match="takes ids"):
        to_input(np.zeros((1, 3), np.float32), "int32", None, None)


class FakeInterpreter:
    """The interpreter API EdgeModel uses: int8 in (scale 0.5, zp 1), int8 out (1/256, -128).

    invoke() writes q_out[j] = q_in.sum() + j - 128, clipped; fails if the input sums to 99.
    """

    def __init__(self, model_content: bytes, num_threads: int):
        self.threads = num_threads
        self.tensors = {0: np.zeros((1, 3), np.int8), 1: np.zeros((1, 4), np.int8)}

    def allocate_tensors(self) -> None:
        pass

    def get_input_details(self) -> list[dict]:
        return [
            {
                "index": 0,
                "name": "in",
                "shape": np.array([1, 3]),
                "dtype": np.int8,
                "quantization": (0.5, 1),
            }
        ]

    def get_output_details(self) -> list[dict]:
        return [
            {
                "index": 1,
                "name": "out",
                "shape": np.array([1, 4]),
                "dtype": np.int8,
                "quantization": (1 / 256, -128),
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
    assert (
        model._interpreter.threads == 2
        and model.input.scale == 0.5
        and model.output.zero_point == -128
    )
    x = np.array([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
    # q_in = round(x / 0.5) + 1 = [3, 1, 2] (sum 6) and [1, 1, 1] (sum 3)
    probs = model.predict(x)
    expected = (np.array([[6, 7, 8, 9], [3, 4, 5, 6]], np.float32)) / 256
    np.testing.assert_allclose(probs, expected)
    raw, latencies = model.run(model.prepare(x), repeat=3)
    assert raw.dtype == np.int8 and latencies.shape == (6,) and (latencies > 0).all()


def test_edge_model_reports_a_runtime_failure_and_a_manifest_mismatch():
    model = EdgeModel(FAKE_RUNTIME, b"", where="model_fake.tflite")
    with pytest.raises(InferenceError, match="fake failed on sample 1: kernel failed"):
        model.run(np.array([[1, 1, 1], [33, 33, 33]], np.int8))
    spec = bundle_mod.TensorSpec("in", (1, 3), "int8", 0.25, 1)
    with pytest.raises(
        BadInput, match="model_fake.tflite: input tensor differs.*scale 0.5 vs 0.25"
    ):
        runtime_mod._compare(model.where, "input", model.input, spec)


# --- tokenizer (in process) --------------------------------------------------------


def test_tokenizer_lowercases_maps_unknown_and_pads():
    vocab = parse_vocab(VALID_VOCAB, "vocab.json")
    encoded = vocab.encode("The CAT, quietly sat!")
    assert encoded.words == ("the", "cat", "quietly", "sat")
    assert encoded.ids.tolist() == [2, 3, 1, 4]
    assert encoded.unknown == ("quietly",)
    assert not encoded.truncated
    assert vocab.encode("cat").ids.tolist() == [3, 0, 0, 0]
    assert vocab.encode("don't").ids.tolist() == [5, 0, 0, 0]


def test_tokenizer_truncates_and_decode_skips_padding():
    vocab = parse_vocab(VALID_VOCAB, "vocab.json")
    encoded = vocab.encode("the cat sat the cat")
    assert encoded.truncated and encoded.ids.tolist() == [2, 3, 4, 2]
    assert vocab.decode(np.array([3, 4, 0, 0])) == "cat sat"


def test_tokenizer_keeps_case_when_lowercase_is_false():
    vocab = parse_vocab({**VALID_VOCAB, "token_pattern": "[A-Za-z]+", "lowercase": False}, "v")
    assert vocab.encode("The cat").ids.tolist() == [1, 3, 0, 0]


def test_tokenizer_pattern_with_one_group_returns_the_group():
    vocab = parse_vocab({**VALID_VOCAB, "token_pattern": r"#?([a-z]+)"}, "v")
    assert vocab.split("#the cat") == ["the", "cat"]


@pytest.mark.parametrize(
    "change,message",
    [
        pytest.param({"tokens": None}, "'tokens' must be a list of strings", id="tokens-null"),
        pytest.param({"tokens": ["<pad>"]}, "has 1 token(s)", id="one-token"),
        pytest.param({"tokens": ["<pad>", "<unk>", "cat", "cat"]}, "appears twice", id="duplicate"),
        pytest.param({"tokens": ["<pad>", 3]}, "list of strings", id="token-not-string"),
        pytest.param({"pad_id": 9}, "'pad_id'=9 is not a token index", id="pad-id-outside"),
        pytest.param({"unk_id": 0}, "pad_id and unk_id must differ", id="unk-is-pad"),
        pytest.param({"max_length": 0}, "'max_length' must be positive", id="max-length-0"),
        pytest.param({"max_length": "4"}, "'max_length' must be an integer", id="max-length-str"),
        pytest.param({"lowercase": "yes"}, "'lowercase' must be true or false", id="lowercase-str"),
        pytest.param({"token_pattern": "[a-z"}, "not a valid regex", id="bad-regex"),
        pytest.param({"token_pattern": "(a)(b)"}, "at most one group", id="two-groups"),
    ],
)
def test_parse_vocab_refuses(change, message):
    with pytest.raises(BadInput) as info:
        parse_vocab({**VALID_VOCAB, **change}, "vocab.json")
    assert message in str(info.value) and str(info.value).startswith("vocab.json: ")


@pytest.mark.parametrize(
    "field", ["tokens", "pad_id", "unk_id", "max_length", "lowercase", "token_pattern"]
)
def test_parse_vocab_names_a_missing_field(field):
    data = {k: v for k, v in VALID_VOCAB.items() if k != field}
    with pytest.raises(BadInput, match=f"missing field\\(s\\): {field}"):
        parse_vocab(data, "vocab.json")


# --- manifest validation (in process) ------------------------------------------


def test_parse_manifest_reads_the_documented_example():
    manifest = bundle_mod.parse_manifest(valid_manifest())
    int8 = manifest.models["int8"]
    assert int8.input.scale == 0.0039 and int8.input.zero_point == -128
    assert int8.thresholds == {"min_agreement": 0.995, "max_accuracy_drop": 0.005}
    assert manifest.models["float32"].input.scale is None
    assert manifest.eval.x_shape == (360, 8, 8) and manifest.dataset == "digits"
    assert manifest.vocab is None
    assert int8.runtimes == {"ai-edge-litert": True, "tflite-runtime": True}


def _drop(path: str):
    def edit(m):
        *parents, last = path.split(".")
        for key in parents:
            m = m[key]
        del m[last]

    return edit


def _set(path: str, value):
    def edit(m):
        *parents, last = path.split(".")
        for key in parents:
            m = m[key]
        m[last] = value

    return edit


@pytest.mark.parametrize(
    "edit,message",
    [
        (_drop("format"), "missing field 'format'"),
        (_set("format", "other"), "field 'format' is 'other'"),
        (_set("format_version", 2), "format_version' is 2"),
        (_drop("eval"), "missing field 'eval'"),
        (_drop("eval.sha256"), "missing field 'eval.sha256'"),
        (_set("eval.samples", "360"), "'eval.samples' must be an integer"),
        (_set("eval.x_shape", [100, 8, 8]), "eval.x_shape' starts with 100"),
        (_drop("labels"), "missing field 'labels'"),
        (_drop("vocab"), "missing field 'vocab'"),
        (_set("models", {}), "field 'models' is empty"),
        (_drop("models.int8.sha256"), "missing field 'models.int8.sha256'"),
        (_set("models.int8.sha256", "xyz"), "64 lowercase hex"),
        (_set("models.int8.bytes", 0), "'models.int8.bytes' must be an integer >= 1"),
        (_set("models.int8.file", "../model.tflite"), "must name a file inside the bundle"),
        (_drop("models.int8.thresholds"), "missing field 'models.int8.thresholds'"),
        (_set("models.int8.thresholds", {"min_acc": 0.9}), "unknown key 'min_acc'"),
        (_set("models.int8.input.shape", [8, 8, 8]), "input.shape' must be [1, 8, 8]"),
        (_set("models.int8.output.shape", [1, 9]), "output.shape' must be [1, 10]"),
        (_set("models.int8.input.dtype", "int4"), "input.dtype' must be one of"),
        (_set("models.int8.input.zero_point", None), "must both be null or both be set"),
        (_set("models.float32.input.scale", 0.5), "must both be null or both be set"),
        (_set("models.int8.input.scale", -1.0), "input.scale' must be positive"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_parse_manifest_refuses(edit, message):
    data = valid_manifest()
    edit(data)
    with pytest.raises(BadInput) as info:
        bundle_mod.parse_manifest(data, "manifest.json")
    assert message in str(info.value)
    assert str(info.value).startswith("manifest.json: ")


def test_parse_manifest_refuses_a_list():
    with pytest.raises(BadInput, match="expected a JSON object, got list"):
        bundle_mod.parse_manifest([], "manifest.json")


def test_select_modes_order_subset_and_unknown():
    manifest = bundle_mod.parse_manifest(valid_manifest())
    assert bundle_mod.select_modes(manifest, "all") == ("float32", "int8")
    assert bundle_mod.select_modes(manifest, "int8, float32") == ("float32", "int8")
    assert bundle_mod.select_modes(manifest, "int8") == ("int8",)
    with pytest.raises(BadInput, match="'int4' is not a known mode"):
        bundle_mod.select_modes(manifest, "int8,int4")
    with pytest.raises(BadInput, match="'float16' is not in this bundle"):
        bundle_mod.select_modes(manifest, "float16")
    with pytest.raises(BadInput, match="no mode given"):
        bundle_mod.select_modes(manifest, ",")


def _flatbuffer(root: int = 16, size: int = 64) -> bytearray:
    """A minimal buffer with a TFL3 identifier, a root table and a 4-byte vtable."""
    data = bytearray(size)
    data[0:4] = root.to_bytes(4, "little")
    data[4:8] = b"TFL3"
    data[8:12] = (4).to_bytes(2, "little") + (8).to_bytes(2, "little")  # vtable at 8
    data[root : root + 4] = (root - 8).to_bytes(4, "little", signed=True)
    return data


def test_tflite_problem_checks_identifier_and_offsets():
    assert bundle_mod.tflite_problem(bytes(_flatbuffer())) is None
    assert "too short" in bundle_mod.tflite_problem(b"\x00" * 10)
    wrong = _flatbuffer()
    wrong[4:8] = b"TFL2"
    assert "file identifier b'TFL2'" in bundle_mod.tflite_problem(bytes(wrong))
    outside = _flatbuffer()
    outside[0:4] = (10_000).to_bytes(4, "little")
    assert "root table offset 10000" in bundle_mod.tflite_problem(bytes(outside))
    bad_vtable = _flatbuffer()
    bad_vtable[16:20] = (-5000).to_bytes(4, "little", signed=True)
    assert "vtable offset" in bundle_mod.tflite_problem(bytes(bad_vtable))


# --- thresholds, pictures, JSON (in process) ----------------------------------------


def test_check_thresholds_pass_fail_and_nan():
    quantized = {"min_agreement": 0.995, "max_accuracy_drop": 0.005}
    assert check_thresholds(quantized, 0.975, 0.997, 0.1, float_accuracy=0.978) == []
    failures = check_thresholds(quantized, 0.96, 0.99, 0.1, float_accuracy=0.978)
    assert len(failures) == 2 and "agreement 0.9900 < 0.9950" in failures[0]
    assert check_thresholds({"max_abs_diff": 1e-5}, 1, 1, 5e-6, 1) == []
    assert check_thresholds({"max_abs_diff": 1e-5}, 1, 1, 2e-5, 1) != []
    assert check_thresholds({"max_abs_diff": 1e-5}, 1, 1, math.nan, 1) != []
    # 359/360 agreement is exactly the kind of ratio that must not fail on rounding
    assert check_thresholds({"min_agreement": 359 / 360}, 1, 359 / 360, 0, 1) == []


def test_render_features_draws_ink_darkest():
    image = np.zeros((8, 8), np.float32)
    image[2, 3] = 1.0
    image[5, 1] = 0.5
    lines = render_features(image).splitlines()
    assert len(lines) == 10 and lines[0] == "+" + "-" * 16 + "+"
    assert lines[3] == "|      @@        |"
    assert lines[6][3:5] == "=="  # mid grey: level rint(0.5 * 9) = 4
    assert set(lines[1]) == {"|", " "}


def test_write_json_replaces_atomically(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(ValueError):
        write_json(target, {"a": math.nan})  # not JSON: the old file stays
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    assert target.stat().st_mode & 0o044  # readable like a normal file, not mkstemp's 0600


def test_main_usage_errors_are_one_line(capsys, tmp_path):
    assert main([str(tmp_path), "--threads", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--threads" in err[0]
    assert main([str(tmp_path), "--sample", "1", "--text", "hi"]) == 2
    assert "not allowed with" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "exit codes" in capsys.readouterr().out


# --- import hygiene ------------------------------------------------------------------


ALLOWED_TOP_LEVEL = {"numpy", "ai_edge_litert", "tflite_runtime"}


def test_edge_demo_imports_only_stdlib_numpy_and_a_runtime():
    for path in sorted((REPO / "edge_demo").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ALLOWED_TOP_LEVEL, (path.name, name)
    for _name, module, package in RUNTIMES.values():
        assert module.split(".")[0] in ALLOWED_TOP_LEVEL and package in ALLOWED_TOP_LEVEL


def test_starting_the_app_imports_no_runtime_and_no_tensorflow():
    code = (
        "import sys, edge_demo.app\n"
        "heavy = ('tensorflow', 'keras', 'keras_mha', 'ai_edge_litert', 'tflite_runtime')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == "[]"


# --- bundles (slow: train + convert) ----------------------------------------------


@pytest.fixture(scope="session")
def digits_bundle(digits_run, tmp_path_factory) -> pathlib.Path:
    """Every mode of the trained digits run, by `python -m export`. Read-only."""
    from edge_bundle import export_bundle

    return export_bundle(digits_run, tmp_path_factory.mktemp("digits_bundle") / "bundle")


@pytest.fixture(scope="session")
def text_run(tmp_path_factory) -> pathlib.Path:
    from edge_bundle import make_text_run

    return make_text_run(tmp_path_factory.mktemp("text_run") / "run")


@pytest.fixture(scope="session")
def text_bundle(text_run, tmp_path_factory) -> pathlib.Path:
    """A text bundle (vocab.json) in float32, float16 and int8, by `python -m export`. Read-only."""
    from edge_bundle import export_bundle

    out = tmp_path_factory.mktemp("text_bundle") / "bundle"
    return export_bundle(text_run, out, quant="float32,float16,int8")


@pytest.fixture(scope="session")
def app_dir(tmp_path_factory) -> pathlib.Path:
    """A folder holding a copy of edge_demo/ and nothing else: the app as copied to a device."""
    root = tmp_path_factory.mktemp("device")
    shutil.copytree(
        REPO / "edge_demo", root / "edge_demo", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


@pytest.fixture
def bundle_copy(digits_bundle, tmp_path) -> pathlib.Path:
    """A private copy of the digits bundle, for breaking."""
    return shutil.copytree(digits_bundle, tmp_path / "bundle")


@pytest.fixture
def text_copy(text_bundle, tmp_path) -> pathlib.Path:
    return shutil.copytree(text_bundle, tmp_path / "text_bundle")


# --- the TensorFlow-free environments ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
def test_edge_venv_has_no_tensorflow_keras_or_keras_mha(runtime, app_dir):
    python = edge_python(runtime)
    for module in ("tensorflow", "keras", "keras_mha"):
        proc = run_app(python, app_dir, "-c", f"import {module}", module=False)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, module
    runtime_module = RUNTIMES[runtime][1]
    proc = run_app(
        python,
        app_dir,
        "-c",
        f"import {runtime_module}, edge_demo; print(edge_demo.__file__)",
        module=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        pathlib.Path(proc.stdout.strip()).parent == app_dir / "edge_demo"
    )  # the copy, not the repo


# --- the parity run -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
def test_parity_run_in_edge_venv(runtime, digits_bundle, app_dir, tmp_path):
    report = tmp_path / "report.json"
    proc = run_app(edge_python(runtime), app_dir, digits_bundle, "--json", report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "p99 µs" in proc.stdout
    assert proc.stderr == ""  # native INFO chatter is captured too
    result = json.loads(report.read_text())
    manifest = json.loads((digits_bundle / "manifest.json").read_text())
    float_accuracy = manifest["eval"]["float_accuracy"]
    assert result["runtime"]["name"] == RUNTIME_NAMES[runtime]
    assert result["runtime"]["version"] not in ("", "unknown")
    assert list(result["modes"]) == ALL_MODES
    skipped = {mode for mode, entry in result["modes"].items() if entry["skipped"]}
    if runtime == "litert":
        assert skipped == set()
    else:
        assert "int16x8" in skipped and skipped <= TFLITE_RUNTIME_MAY_SKIP
        for mode, entry in manifest["models"].items():  # what the manifest says is honoured
            if entry["runtimes"].get("tflite-runtime") is False:
                assert mode in skipped
    for mode, entry in result["modes"].items():
        if mode in skipped:
            assert entry["passed"] is None and "cannot run" in entry["reason"]
            assert f"{mode}: skipped:" in proc.stdout
            continue
        assert entry["passed"] is True and not entry["skipped"], (mode, entry)
        assert entry["agreement"] >= 0.995, mode
        assert float_accuracy - entry["accuracy"] <= 0.005 + 1e-9, mode
        assert 0 <= entry["mean_abs_diff"] <= entry["max_abs_diff"]
        assert 0 < entry["latency_us_p50"] <= entry["latency_us_p90"] <= entry["latency_us_p99"]
        assert entry["load_ms"] > 0 and entry["peak_rss_mb"] > 0
        assert entry["samples"] == entry["timed_invocations"] == manifest["eval"]["samples"]
        if mode in ("float32", "float16"):
            assert entry["max_abs_diff"] <= manifest["models"][mode]["thresholds"]["max_abs_diff"]
    float32 = result["modes"]["float32"]  # same predictions as Keras
    assert float32["accuracy"] == pytest.approx(float_accuracy, abs=1e-12)
    assert float32["agreement"] == 1.0 and float32["max_abs_diff"] < 1e-5
    assert result["passed"] is True and result["exit_code"] == 0


@pytest.mark.slow
def test_console_script_runs_a_subset(digits_bundle, tmp_path):
    script = pathlib.Path(sys.executable).parent / "keras-mha-edge"
    assert script.exists(), "keras-mha-edge not installed: pip install -e . (make install)"
    report = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(
        [
            str(script),
            str(digits_bundle),
            "--quant",
            "int8,float32",
            "--repeat",
            "2",
            "--threads",
            "2",
            "--json",
            str(report),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()}
    assert not imported & {"tensorflow", "keras", "keras_mha"}
    result = json.loads(report.read_text())
    assert result["runtime"]["threads"] == 2 and result["runtime"]["repeat"] == 2
    modes = result["modes"]
    assert list(modes) == ["float32", "int8"]
    assert modes["int8"]["timed_invocations"] == 2 * modes["int8"]["samples"]


@pytest.mark.slow
def test_parity_failure_exits_1(bundle_copy, app_dir, tmp_path):
    edit_manifest(bundle_copy, _set("models.float16.thresholds", {"max_abs_diff": 1e-9}))
    report = tmp_path / "r.json"
    proc = run_app(
        edge_python("litert"), app_dir, bundle_copy, "--quant", "float16,float32", "--json", report
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "float16: FAIL: max |Δprob|" in proc.stdout
    result = json.loads(report.read_text())
    assert (
        result["modes"]["float16"]["passed"] is False
        and result["modes"]["float32"]["passed"] is True
    )
    assert result["exit_code"] == 1


@pytest.mark.slow
def test_tflite_runtime_load_failure_is_a_skip(bundle_copy, app_dir):
    """Without the manifest's `runtimes`, the child-process probe finds out."""

    def forget_runtimes(manifest):
        for entry in manifest["models"].values():
            del entry["runtimes"]

    edit_manifest(bundle_copy, forget_runtimes)
    proc = run_app(
        edge_python("tflite-runtime"), app_dir, bundle_copy, "--quant", "float32,int16x8"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "int16x8: skipped: tflite-runtime 2.14.0 cannot run it" in proc.stdout
    assert "RSQRT" in proc.stdout
    assert "float32  PASS" in proc.stdout


@pytest.mark.slow
def test_only_unrunnable_modes_is_bad_input(digits_bundle, app_dir):
    proc = run_app(edge_python("tflite-runtime"), app_dir, digits_bundle, "--quant", "int16x8")
    assert_bad_input(proc, "none of the selected modes can run here", "int16x8")


@pytest.mark.slow
@pytest.mark.parametrize(
    "runtime,flag,message",
    [("litert", "tflite-runtime", "needs numpy<2"), ("tflite-runtime", "litert", "cannot import")],
)
def test_asking_for_the_other_runtime_is_bad_input(runtime, flag, message, digits_bundle, app_dir):
    proc = run_app(edge_python(runtime), app_dir, digits_bundle, "--runtime", flag)
    assert_bad_input(proc, message)


@pytest.mark.slow
def test_manifest_quantization_must_match_the_model(bundle_copy, app_dir):
    edit_manifest(bundle_copy, _set("models.int8.input.scale", 0.5))
    proc = run_app(edge_python("litert"), app_dir, bundle_copy, "--quant", "int8")
    assert_bad_input(proc, "model_int8.tflite", "input tensor differs from manifest.json", "scale")


# --- one sample, one sentence ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
def test_sample_shows_the_digit_and_each_prediction(runtime, digits_bundle, app_dir):
    evaluation = np.load(digits_bundle / "eval.npz")
    i = 5
    proc = run_app(edge_python(runtime), app_dir, digits_bundle, "--sample", i)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"label '{int(evaluation['y'][i])}'" in out
    assert out.count("|") >= 16 and "@@" in out  # the 8x8 picture
    reference = int(evaluation["probs"][i].argmax())
    ref_line = next(line for line in out.splitlines() if line.startswith("keras (float reference)"))
    assert ref_line.split()[3] == str(reference)
    assert f"{evaluation['probs'][i].max():.4f}" in ref_line
    may_skip = TFLITE_RUNTIME_MAY_SKIP if runtime == "tflite-runtime" else set()
    for mode in ALL_MODES:
        line = next(line for line in out.splitlines() if line.startswith(mode + " "))
        expected = {"skipped", str(reference)} if mode in may_skip else {str(reference)}
        assert line.split()[1] in expected, line
    if runtime == "tflite-runtime":
        assert "int16x8: skipped:" in out


@pytest.mark.slow
def test_text_is_tokenized_on_the_device_and_matches_keras(text_bundle, text_run, app_dir):
    import keras

    import keras_mha  # noqa: F401  (registers the custom layers)
    from keras_mha_edge.text import load_vocab

    sentence = "The cat SAT on a zebra"
    vocab = load_vocab(text_bundle / "vocab.json")
    ids = vocab.encode(sentence).ids
    model = keras.saving.load_model(text_run / "model.keras")
    probs = model.predict(ids[None], verbose=0)[0]
    labels = json.loads((text_bundle / "labels.json").read_text())
    proc = run_app(edge_python("litert"), app_dir, text_bundle, "--text", sentence)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"= {ids.tolist()}" in proc.stdout and "unknown to the vocabulary: zebra" in proc.stdout
    float32 = next(line for line in proc.stdout.splitlines() if line.startswith("float32 "))
    assert float32.split()[1] == labels[int(probs.argmax())]
    assert float(float32.split()[2]) == pytest.approx(float(probs.max()), abs=1e-4)
    assert (
        next(line for line in proc.stdout.splitlines() if line.startswith("int8 ")).split()[1]
        in labels
    )


@pytest.mark.slow
def test_text_bundle_parity_and_sample_in_tflite_runtime(text_bundle, app_dir):
    """tflite-runtime 2.14 has no int8 DIV (the masked mean pooling): int8 is a skip."""
    python = edge_python("tflite-runtime")
    proc = run_app(python, app_dir, text_bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "int8: skipped:" in proc.stdout  # probed (int8 DIV), or from the manifest
    assert "float32  PASS" in proc.stdout and "float16  PASS" in proc.stdout
    proc = run_app(python, app_dir, text_bundle, "--sample", 0)
    assert proc.returncode == 0 and 'text: "' in proc.stdout
    vocab = json.loads((text_bundle / "vocab.json").read_text())
    first = np.load(text_bundle / "eval.npz")["x"][0]
    words = " ".join(vocab["tokens"][i] for i in first if i != vocab["pad_id"])
    assert f'text: "{words}"' in proc.stdout


@pytest.mark.slow
def test_text_needs_a_text_bundle_and_words(digits_bundle, text_bundle, app_dir):
    python = edge_python("litert")
    assert_bad_input(run_app(python, app_dir, digits_bundle, "--text", "seven"), "--text", "vocab")
    assert_bad_input(
        run_app(python, app_dir, text_bundle, "--text", "!!! 42"), "--text", "no words"
    )
    assert_bad_input(
        run_app(python, app_dir, digits_bundle, "--sample", 360), "--sample", "out of range"
    )
    assert_bad_input(
        run_app(python, app_dir, digits_bundle, "--sample", 1, "--json", "x.json"), "--json"
    )


# --- bad input, tried for real ------------------------------------------------------


def _write(name: str, data: bytes | str):
    def edit(bundle: pathlib.Path) -> None:
        path = bundle / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)

    return edit


def _transform(name: str, fn):
    def edit(bundle: pathlib.Path) -> None:
        path = bundle / name
        path.write_bytes(fn(path.read_bytes()))

    return edit


def _random_bytes(data: bytes) -> bytes:
    return np.random.default_rng(0).integers(0, 256, len(data), dtype=np.uint8).tobytes()


def _flip_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _manifest_edit(edit):
    return lambda bundle: edit_manifest(bundle, edit)


def _npz(bundle_key: str = "eval", **change):
    """Rewrite eval.npz with `change`d arrays (None drops one) and fix its sha256."""

    def edit(bundle: pathlib.Path) -> None:
        with np.load(bundle / "eval.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
        for key, value in change.items():
            if value is None:
                del arrays[key]
            else:
                arrays[key] = value(arrays[key])
        np.savez(bundle / "eval.npz", **arrays)
        match_file(bundle, bundle_key)

    return edit


def _then(*edits):
    def edit(bundle: pathlib.Path) -> None:
        for e in edits:
            e(bundle)

    return edit


BAD_DIGITS_BUNDLES = {
    "zero-byte-model": (
        _write("model_int8.tflite", b""),
        "model_int8.tflite",
        "empty file (0 bytes)",
    ),
    "truncated-model": (
        _transform("model_int8.tflite", lambda d: d[: len(d) // 2]),
        "model_int8.tflite",
        "truncated or replaced",
    ),
    "random-bytes-model": (
        _transform("model_int8.tflite", _random_bytes),
        "model_int8.tflite",
        "not a TFLite model: file identifier",
    ),
    "wrong-identifier-model": (
        _transform("model_int8.tflite", lambda d: d[:4] + b"TFL2" + d[8:]),
        "model_int8.tflite",
        "file identifier b'TFL2'",
    ),
    "checksum-mismatch-model": (
        _transform("model_int8.tflite", _flip_middle),
        "model_int8.tflite",
        "does not match manifest.json",
    ),
    "missing-model": (
        lambda b: (b / "model_float16.tflite").unlink(),
        "model_float16.tflite",
        "not found",
    ),
    "random-bytes-model-with-TFL3-and-matching-manifest": (
        _then(
            _transform(
                "model_int8.tflite", lambda d: (r := _random_bytes(d))[:4] + b"TFL3" + r[8:]
            ),
            lambda b: match_model_file(b, "int8"),
        ),
        "model_int8.tflite",
        "corrupt TFLite flatbuffer",
    ),
    "manifest-missing": (lambda b: (b / "manifest.json").unlink(), "manifest.json", "not found"),
    "manifest-not-json": (_write("manifest.json", "{not json"), "manifest.json", "not valid JSON"),
    "manifest-binary": (
        _write("manifest.json", b"\xff\xfe\x00garbage"),
        "manifest.json",
        "not valid JSON",
    ),
    "manifest-missing-eval-sha256": (
        _manifest_edit(_drop("eval.sha256")),
        "manifest.json",
        "missing field 'eval.sha256'",
    ),
    "manifest-missing-models": (
        _manifest_edit(_drop("models")),
        "manifest.json",
        "missing field 'models'",
    ),
    "manifest-missing-model-file": (
        _manifest_edit(_drop("models.int8.file")),
        "manifest.json",
        "missing field 'models.int8.file'",
    ),
    "eval-missing": (lambda b: (b / "eval.npz").unlink(), "eval.npz", "not found"),
    "eval-checksum-mismatch": (
        _transform("eval.npz", _flip_middle),
        "eval.npz",
        "does not match manifest.json",
    ),
    "eval-not-npz": (
        _then(_write("eval.npz", b"not a zip file"), lambda b: match_file(b, "eval")),
        "eval.npz",
        "not a readable .npz file",
    ),
    "eval-x-wrong-shape": (_npz(x=lambda x: x[:, :, :7]), "eval.npz", "x has shape [360, 8, 7]"),
    "eval-x-wrong-dtype": (
        _npz(x=lambda x: x.astype(np.float64)),
        "eval.npz",
        "x has dtype float64",
    ),
    "eval-y-wrong-dtype": (
        _npz(y=lambda y: y.astype(np.float32)),
        "eval.npz",
        "y must be integer labels",
    ),
    "eval-probs-wrong-shape": (
        _npz(probs=lambda p: p[:, :9]),
        "eval.npz",
        "probs must be float of shape [360, 10]",
    ),
    "eval-probs-missing": (_npz(probs=None), "eval.npz", "missing array(s) probs"),
    "labels-wrong-count": (
        _then(
            _write("labels.json", json.dumps(list("012345678"))), lambda b: match_file(b, "labels")
        ),
        "labels.json",
        "has 9 names",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_DIGITS_BUNDLES))
def test_bad_digits_bundle(case, bundle_copy, app_dir):
    edit, filename, problem = BAD_DIGITS_BUNDLES[case]
    edit(bundle_copy)
    proc = run_app(edge_python("litert"), app_dir, bundle_copy)
    line = assert_bad_input(proc, filename, problem)
    assert str(bundle_copy) in line  # names the file with its path


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda d: d[: len(d) // 2], id="truncated-half"),
        pytest.param(
            lambda d: d[:2000] + _random_bytes(d[2000:2400]) + d[2400:], id="corrupt-middle"
        ),
    ],
)
def test_malformed_model_with_matching_manifest_does_not_crash(cut, runtime, bundle_copy, app_dir):
    """Past every static check (size, sha256, identifier): the runtime sees it, in a child."""
    _transform("model_int8.tflite", cut)(bundle_copy)
    match_model_file(bundle_copy, "int8")
    proc = run_app(edge_python(runtime), app_dir, bundle_copy, "--quant", "float32,int8")
    line = assert_bad_input(proc, "model_int8.tflite", RUNTIME_NAMES[runtime])
    assert "crashed" in line or "cannot load it" in line or "out of memory" in line


@pytest.mark.slow
def test_unknown_mode_is_bad_input(digits_bundle, app_dir):
    proc = run_app(edge_python("litert"), app_dir, digits_bundle, "--quant", "float32,int4")
    assert_bad_input(proc, "--quant", "'int4' is not a known mode")


def _vocab_edit(edit):
    def apply(bundle: pathlib.Path) -> None:
        path = bundle / "vocab.json"
        vocab = json.loads(path.read_text())
        edit(vocab)
        path.write_text(json.dumps(vocab))
        match_file(bundle, "vocab")

    return apply


BAD_TEXT_BUNDLES = {
    "vocab-missing": (lambda b: (b / "vocab.json").unlink(), "vocab.json", "not found"),
    "vocab-not-json": (
        _then(_write("vocab.json", "[1,"), lambda b: match_file(b, "vocab")),
        "vocab.json",
        "not valid JSON",
    ),
    "vocab-missing-token-pattern": (
        _vocab_edit(lambda v: v.pop("token_pattern")),
        "vocab.json",
        "missing field(s): token_pattern",
    ),
    "vocab-missing-tokens-field": (
        _vocab_edit(lambda v: v.pop("tokens")),
        "vocab.json",
        "missing field(s): tokens",
    ),
    "vocab-missing-tokens": (
        _vocab_edit(lambda v: v.update(tokens=v["tokens"][:5])),
        "vocab.json",
        "but 'tokens' has only 5 tokens",
    ),
    "vocab-wrong-max-length": (
        _vocab_edit(lambda v: v.update(max_length=9)),
        "vocab.json",
        "max_length 9 does not match",
    ),
    "vocab-checksum-mismatch": (
        _write("vocab.json", json.dumps({**VALID_VOCAB, "max_length": 6})),
        "vocab.json",
        "does not match manifest.json",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_TEXT_BUNDLES))
def test_bad_text_bundle(case, text_copy, app_dir):
    edit, filename, problem = BAD_TEXT_BUNDLES[case]
    edit(text_copy)
    proc = run_app(edge_python("litert"), app_dir, text_copy, "--text", "the cat")
    assert_bad_input(proc, filename, problem)
