"""keras-mha-export: conversion, graph checks, verification, the bundle, bad input."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from keras_mha_export import MODES, InputError, SourcePaths, export_bundle
from keras_mha_export.cli import main
from keras_mha_export.graph import GraphInfo, OpInfo, TensorInfo, check_graph, read_graph

REPO = pathlib.Path(__file__).resolve().parents[1]
TFLITE_RUNTIME_PYTHON = REPO / ".venv-edge-tflite" / "bin" / "python"
# docs/artifacts.md
THRESHOLDS = {
    "float32": {"max_abs_diff": 1e-5},
    "float16": {"max_abs_diff": 1e-2},
    "dynamic": {"min_agreement": 0.995, "max_accuracy_drop": 0.005},
    "int8": {"min_agreement": 0.995, "max_accuracy_drop": 0.005},
    "int16x8": {"min_agreement": 0.995, "max_accuracy_drop": 0.005},
}
FLOATS = {"float16", "float32", "float64"}
# Lines TensorFlow, the converter or LiteRT print when nobody silences them.
NOISE = ("I0000", "W0000", "WARNING", "Saved artifact", "XNNPACK", "fully_quantize", "absl")


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """main(argv) in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def litert_outputs(path: pathlib.Path, x: np.ndarray) -> tuple[np.ndarray, dict, dict]:
    """Run a .tflite file with LiteRT at batch 1, independently of export.verify."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=1)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    results = []
    for row in x:
        scale, zero_point = inp["quantization"]
        if scale:  # round half away from zero, as TFLite does
            info = np.iinfo(inp["dtype"])
            scaled = row / scale
            q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + zero_point
            row = np.clip(q, info.min, info.max)
        interpreter.set_tensor(inp["index"], row[None].astype(inp["dtype"]))
        interpreter.invoke()
        y = interpreter.get_tensor(out["index"])[0].astype(np.float64)
        scale, zero_point = out["quantization"]
        results.append((y - zero_point) * scale if scale else y)
    return np.array(results), inp, out


def tflite_runtime_loads(paths: list[pathlib.Path]) -> dict[str, bool]:
    """Whether tflite-runtime 2.14 (the edge venv) loads and invokes each model."""
    script = (
        "import json, sys, numpy as np\n"
        "from tflite_runtime.interpreter import Interpreter\n"
        "result = {}\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        it = Interpreter(model_path=path); it.allocate_tensors()\n"
        "        d = it.get_input_details()[0]\n"
        "        it.set_tensor(d['index'], np.zeros(d['shape'], d['dtype'])); it.invoke()\n"
        "        result[path] = True\n"
        "    except Exception:\n"
        "        result[path] = False\n"
        "print(json.dumps(result))\n"
    )
    done = subprocess.run(
        [str(TFLITE_RUNTIME_PYTHON), "-c", script, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return {pathlib.Path(k).name: v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}


def leftovers(directory: pathlib.Path) -> list[str]:
    """Temporary bundle directories left behind in `directory`."""
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


# ----------------------------------------------------------------- the digits run
@pytest.fixture(scope="module")
def exported(digits_run, tmp_path_factory):
    """`python -m export RUN --out B` on the digits run, once, as a user runs it."""
    out = tmp_path_factory.mktemp("export") / "bundle"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha_export", str(digits_run), "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    manifest = json.loads((out / "manifest.json").read_text()) if out.is_dir() else None
    return {
        "out": out,
        "run": digits_run,
        "status": done.returncode,
        "stdout": done.stdout,
        "stderr": done.stderr,
        "manifest": manifest,
    }


@pytest.mark.slow
def test_cli_exports_every_mode_quietly_with_a_summary(exported):
    assert exported["status"] == 0, exported["stderr"]
    assert exported["stderr"] == ""
    stdout = exported["stdout"]
    assert not [line for line in stdout.splitlines() if any(n in line for n in NOISE)], stdout
    table = stdout[stdout.index("mode  ") :]
    header = table.splitlines()[0].split()
    assert header[:6] == ["mode", "bytes", "vs", "float32", "ops", "agreement"]
    assert "accuracy" in header
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:] if line.split()}
    for mode in MODES:
        assert rows[mode][-1] == "yes"
        assert rows[mode][1] == f"{exported['manifest']['models'][mode]['bytes']:,}"
    assert rows["float32"][2] == "1.00x"
    assert exported["manifest"]["verified"] == list(MODES)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_mode_converts_and_meets_its_thresholds(exported, mode):
    manifest = exported["manifest"]
    entry = manifest["models"][mode]
    assert entry["verified"] is True and entry["failures"] == []
    assert entry["thresholds"] == THRESHOLDS[mode]
    # Re-run the file with LiteRT here and compare with the float model.
    evaluation = np.load(exported["run"] / "eval.npz")
    probs, inp, out = litert_outputs(exported["out"] / entry["file"], evaluation["x"])
    ref = evaluation["probs"]
    agreement = (probs.argmax(-1) == ref.argmax(-1)).mean()
    accuracy = (probs.argmax(-1) == evaluation["y"]).mean()
    if "max_abs_diff" in THRESHOLDS[mode]:
        assert np.abs(probs - ref).max() <= THRESHOLDS[mode]["max_abs_diff"]
    else:
        assert agreement >= 0.995
        assert manifest["eval"]["float_accuracy"] - accuracy <= 0.005 + 1e-9
    assert entry["parity"]["agreement"] == pytest.approx(agreement)
    assert entry["parity"]["accuracy"] == pytest.approx(accuracy)
    assert entry["parity"]["max_abs_diff"] == pytest.approx(np.abs(probs - ref).max(), abs=1e-6)
    # The manifest describes the file's own tensors.
    for spec, detail in ((entry["input"], inp), (entry["output"], out)):
        assert spec["shape"] == [int(d) for d in detail["shape"]]
        assert spec["dtype"] == np.dtype(detail["dtype"]).name
        assert spec["name"] == detail["name"]
        if spec["scale"] is None:
            assert detail["quantization"] == (0.0, 0)
        else:
            assert spec["scale"] == pytest.approx(detail["quantization"][0])
            assert spec["zero_point"] == detail["quantization"][1]


@pytest.mark.slow
def test_io_dtypes_per_mode(exported):
    models = exported["manifest"]["models"]
    for mode in ("float32", "dynamic", "float16"):
        assert models[mode]["input"]["dtype"] == models[mode]["output"]["dtype"] == "float32"
        assert models[mode]["input"]["scale"] is None
    for mode, dtype in (("int8", "int8"), ("int16x8", "int16")):
        for side in ("input", "output"):
            assert models[mode][side]["dtype"] == dtype
            assert models[mode][side]["scale"] > 0
    # Quantized weights really shrink the weights; float16 stores float16.
    assert "int8" in models["int8"]["weights"] and "float32" not in models["int8"]["weights"]
    assert "float16" in models["float16"]["weights"]
    assert models["int8"]["bytes"] < models["float32"]["bytes"]


@pytest.mark.slow
def test_graphs_are_builtin_batch_one_and_match_the_manifest(exported):
    from ai_edge_litert.interpreter import Interpreter

    for mode, entry in exported["manifest"]["models"].items():
        model = (exported["out"] / entry["file"]).read_bytes()
        ops = [op["op_name"] for op in Interpreter(model_content=model)._get_ops_details()]
        assert {name: ops.count(name) for name in set(ops)} == entry["ops"], mode
        assert sum(entry["ops"].values()) == entry["op_count"]
        assert not [name for name in ops if "CUSTOM" in name or name.startswith("Flex")], mode
        # A dynamic batch would bring shape arithmetic with it.
        assert not {"SHAPE", "PACK", "STRIDED_SLICE"} & set(ops), mode
        graph = read_graph(model)
        for index in (*graph.inputs, *graph.outputs):
            tensor = graph.tensor(index)
            assert tensor.shape[0] == 1, (mode, tensor)
            assert all(d > 0 for d in (tensor.shape_signature or tensor.shape)), (mode, tensor)
        assert entry["checks"] == {name: True for name in entry["checks"]}


@pytest.mark.slow
def test_int8_model_is_fully_integer(exported):
    graph = read_graph((exported["out"] / "model_int8.tflite").read_bytes())
    floats = [
        (op.name, graph.tensor(i).name)
        for op in graph.ops
        if op.name not in ("QUANTIZE", "DEQUANTIZE")
        for i in (*op.inputs, *op.outputs)
        if i >= 0 and graph.tensor(i).dtype in FLOATS
    ]
    assert floats == []
    assert "DEQUANTIZE" not in {op.name for op in graph.ops}
    assert [graph.tensor(i).dtype for i in graph.inputs] == ["int8"]
    assert [graph.tensor(i).dtype for i in graph.outputs] == ["int8"]


@pytest.mark.slow
def test_manifest_checksums_sizes_and_copies(exported):
    out, run, manifest = exported["out"], exported["run"], exported["manifest"]
    assert manifest["format"] == "keras-mha-bundle" and manifest["format_version"] == 1
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "eval.npz", "labels.json"] + [f"model_{m}.tflite" for m in MODES]
    )
    for entry in manifest["models"].values():
        path = out / entry["file"]
        assert entry["sha256"] == sha256(path)
        assert entry["bytes"] == path.stat().st_size
    for key in ("eval", "labels"):
        assert manifest[key]["sha256"] == sha256(out / manifest[key]["file"])
        assert (out / manifest[key]["file"]).read_bytes() == (
            run / manifest[key]["file"]
        ).read_bytes()
    assert manifest["vocab"] is None
    assert manifest["source_model"] == {
        "file": "model.keras",
        "sha256": sha256(run / "model.keras"),
        "dataset": "digits",
    }
    evaluation = np.load(run / "eval.npz")
    assert manifest["eval"]["samples"] == len(evaluation["x"])
    assert manifest["eval"]["x_shape"] == list(evaluation["x"].shape)
    assert manifest["eval"]["x_dtype"] == "float32"
    assert manifest["eval"]["num_classes"] == 10
    assert manifest["eval"]["float_accuracy"] == pytest.approx(
        (evaluation["probs"].argmax(-1) == evaluation["y"]).mean()
    )
    for name in ("tensorflow", "keras", "keras_mha", "numpy"):
        assert manifest["created_by"][name]


@pytest.mark.slow
@pytest.mark.skipif(
    not TFLITE_RUNTIME_PYTHON.exists(), reason="no .venv-edge-tflite (make edge-venvs)"
)
def test_runtime_claims_match_tflite_runtime_214(exported):
    models = exported["manifest"]["models"]
    loads = tflite_runtime_loads([exported["out"] / e["file"] for e in models.values()])
    assert {m: e["runtimes"]["tflite-runtime"] for m, e in models.items()} == {
        m: loads[e["file"]] for m, e in models.items()
    }
    assert loads["model_int16x8.tflite"] is False  # RSQRT int16 (FIELD_NOTES)
    assert all(e["runtimes"]["ai-edge-litert"] for e in models.values())


# ------------------------------------------------------------- token-id inputs
def toy_tokens(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Padded id sequences (0 = pad); label: more 2s than 3s."""
    rng = np.random.default_rng(seed)
    x = rng.integers(2, 12, (n, 8)).astype("int32")
    lengths = rng.integers(3, 9, n)
    x[np.arange(8)[None, :] >= lengths[:, None]] = 0
    return x, ((x == 2).sum(1) > (x == 3).sum(1)).astype("int32")


@pytest.fixture(scope="module")
def token_files(tmp_path_factory) -> pathlib.Path:
    """A tiny trained token classifier as loose files (no labels.json)."""
    import keras

    from keras_mha.model import ModelConfig, build_classifier

    config = ModelConfig(
        input_kind="tokens",
        sequence_length=8,
        feature_dim=12,
        num_classes=2,
        d_model=16,
        num_heads=2,
        ff_dim=32,
        dropout=0.0,
        seed=0,
    )
    model = build_classifier(config)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    x_train, y_train = toy_tokens(800, seed=0)
    model.fit(x_train, y_train, epochs=10, batch_size=32, verbose=0)
    x, y = toy_tokens(300, seed=1)
    probs = model.predict(x, verbose=0).astype("float32")
    assert (probs.argmax(-1) == y).mean() > 0.95  # the toy task was learned
    out = tmp_path_factory.mktemp("tokens")
    model.save(out / "classifier.keras")
    np.savez(out / "eval.npz", x=x, y=y, probs=probs)
    np.savez(out / "calibration.npz", x=x_train[:256])
    tokens = ["<pad>", "<unk>"] + [f"w{i}" for i in range(2, 12)]
    (out / "vocab.json").write_text(json.dumps({"tokens": tokens, "pad_id": 0, "unk_id": 1}))
    return out


@pytest.mark.slow
def test_token_model_exports_float32_and_integer_int8(token_files, tmp_path):
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli(
        [
            "--model", str(token_files / "classifier.keras"),
            "--calibration", str(token_files / "calibration.npz"),
            "--eval", str(token_files / "eval.npz"),
            "--vocab", str(token_files / "vocab.json"),
            "--quant", "int8,float32",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0, stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verified"] == ["float32", "int8"]
    int8 = manifest["models"]["int8"]
    assert int8["input"] == {**int8["input"], "dtype": "int32", "shape": [1, 8], "scale": None}
    assert int8["output"]["dtype"] == "int8"
    graph = read_graph((out / "model_int8.tflite").read_bytes())
    floats = [
        op.name
        for op in graph.ops
        if op.name not in ("QUANTIZE", "DEQUANTIZE")
        for i in (*op.inputs, *op.outputs)
        if i >= 0 and graph.tensor(i).dtype in FLOATS
    ]
    assert floats == []  # the masked mean (MaskedMeanPooling) stays integer
    assert "CAST" not in int8["ops"] and "GATHER" in int8["ops"]
    # Loose files: labels made from class indices, vocab copied.
    assert json.loads((out / "labels.json").read_text()) == ["0", "1"]
    assert manifest["vocab"]["sha256"] == sha256(token_files / "vocab.json")
    assert manifest["source_model"]["file"] == "classifier.keras"
    evaluation = np.load(token_files / "eval.npz")
    probs, _, _ = litert_outputs(out / "model_int8.tflite", evaluation["x"])
    assert (probs.argmax(-1) == evaluation["probs"].argmax(-1)).mean() >= 0.995
    if TFLITE_RUNTIME_PYTHON.exists():
        loads = tflite_runtime_loads([out / "model_float32.tflite", out / "model_int8.tflite"])
        for mode in ("float32", "int8"):
            claim = manifest["models"][mode]["runtimes"]["tflite-runtime"]
            assert claim == loads[f"model_{mode}.tflite"], mode


@pytest.mark.slow
def test_a_mode_the_converter_cannot_produce_is_one_line(token_files, tmp_path):
    """TF's 16x8 quantizer fails on int32 token inputs: a message, not a trace."""
    out = tmp_path / "bundle"
    source = SourcePaths(
        model=token_files / "classifier.keras",
        calibration=token_files / "calibration.npz",
        eval=token_files / "eval.npz",
    )
    lines: list[str] = []
    manifest = export_bundle(source, out, "float32,int16x8", log=lines.append)
    if "int16x8" in manifest["verified"]:
        pytest.skip("this TensorFlow converts int16x8 with token inputs")
    failure = manifest["failed"]["int16x8"]
    assert failure["stage"] == "convert"
    assert len(failure["reasons"]) == 1 and "\n" not in failure["reasons"][0]
    assert "int16x8" not in manifest["models"] and not (out / "model_int16x8.tflite").exists()
    line = next(line for line in lines if line.split()[:1] == ["int16x8"])
    assert "FAILED" in line and "Traceback" not in "\n".join(lines)
    assert manifest["verified"] == ["float32"]


# -------------------------------------------------------------------- failures
@pytest.mark.slow
def test_converter_errors_become_one_line(digits_run, tmp_path, monkeypatch):
    import types

    import tensorflow as tf

    def broken():
        raise RuntimeError(
            "Could not translate MLIR to FlatBuffer.\n"
            "<unknown>:0: error: loc(fused[\"Neg:\"]): 'tfl.neg' op is neither a custom op "
            "nor a flex op\n<unknown>:0: note: see current operation"
        )

    def from_saved_model(directory):
        return types.SimpleNamespace(target_spec=types.SimpleNamespace(), convert=broken)

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_saved_model", from_saved_model)
    status, stdout, stderr = run_cli(
        [str(digits_run), "--out", str(tmp_path / "b"), "--quant", "int8"]
    )
    assert status == 1
    assert stderr.count("\n") == 1
    assert "int8: the converter cannot produce int8: 'tfl.neg' op is neither" in stderr
    assert "Traceback" not in stdout + stderr
    assert not (tmp_path / "b").exists() and leftovers(tmp_path) == []


@pytest.mark.slow
def test_parity_failure_exits_1_and_writes_nothing(digits_run, tmp_path, monkeypatch):
    from keras_mha_export import verify

    monkeypatch.setitem(verify.THRESHOLDS, "float32", {"max_abs_diff": -1.0})
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli([str(digits_run), "--out", str(out), "--quant", "float32"])
    assert status == 1
    assert "max |Δprob|" in stderr and "float32" in stderr
    assert "NO" in stdout.splitlines()[-1]  # the summary row says so
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.slow
def test_allow_parity_failure_keeps_the_model_unverified(digits_run, tmp_path, monkeypatch):
    from keras_mha_export import verify

    monkeypatch.setitem(verify.THRESHOLDS, "float32", {"max_abs_diff": -1.0})
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "stale.txt").write_text("from an older export")
    argv = [str(digits_run), "--out", str(out), "--quant", "float32,float16"]
    status, _, stderr = run_cli([*argv, "--allow-parity-failure", "--overwrite"])
    assert status == 0, stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verified"] == ["float16"]
    assert manifest["models"]["float32"]["verified"] is False
    assert manifest["failed"]["float32"]["stage"] == "parity"
    assert not (out / "stale.txt").exists()  # --overwrite replaced the directory
    assert leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> pathlib.Path:
    """An untrained digits-shaped run directory: enough to reach every input check."""
    from keras_mha.model import ModelConfig, build_classifier

    model = build_classifier(ModelConfig(d_model=8, num_heads=2, ff_dim=8, dropout=0.0))
    rng = np.random.default_rng(0)
    x = rng.random((40, 8, 8)).astype("float32")
    run = tmp_path_factory.mktemp("tiny") / "run"
    run.mkdir()
    model.save(run / "model.keras")
    probs = model.predict(x, verbose=0).astype("float32")
    np.savez(run / "eval.npz", x=x, y=rng.integers(0, 10, 40).astype("int32"), probs=probs)
    np.savez(run / "calibration.npz", x=x[:16])
    (run / "labels.json").write_text(json.dumps([str(i) for i in range(10)]))
    return run


def _garbage(run):
    (run / "model.keras").write_bytes(b"this is not a zip archive")


def _bad_zip(run):
    with zipfile.ZipFile(run / "model.keras", "w") as archive:
        archive.writestr("config.json", "{not json")


def _unknown_layer(run):
    import keras

    # A layer class Keras cannot find again: unregistered, in no importable module.
    doubler = type("Doubler", (keras.layers.Layer,), {"call": lambda self, x: x * 2})
    doubler.__module__ = "no_such_module_for_keras_mha_tests"
    model = keras.Sequential(
        [keras.Input((8, 8)), doubler(), keras.layers.Flatten(), keras.layers.Dense(10)]
    )
    model.save(run / "model.keras")


def _existing_bundle(run):
    (run / "bundle").mkdir()
    (run / "bundle" / "keep").write_text("an older bundle")


def _npz(name, **change):
    def mutate(run):
        arrays = dict(np.load(run / name))
        for key, fn in change.items():
            if fn is None:
                del arrays[key]
            else:
                arrays[key] = fn(arrays[key])
        np.savez(run / name, **arrays)

    return mutate


BAD_INPUTS = {
    "missing-model": (lambda run: (run / "model.keras").unlink(), [], "model file"),
    "corrupt-model": (_garbage, [], "not a .keras archive"),
    "broken-keras-archive": (_bad_zip, [], "cannot load"),
    "unknown-custom-object": (_unknown_layer, [], "unknown custom object 'Doubler'"),
    "calibration-dtype": (
        _npz("calibration.npz", x=lambda x: x.astype("float64")),
        [],
        "calibration.npz: x is float64",
    ),
    "calibration-shape": (
        _npz("calibration.npz", x=lambda x: x[:, :, :4]),
        [],
        "calibration.npz: x is float32 (16, 8, 4)",
    ),
    "eval-shape": (
        _npz("eval.npz", x=lambda x: x.reshape(len(x), 64)),
        [],
        "eval.npz: x is float32 (40, 64) but the model takes float32 (N, 8, 8)",
    ),
    "eval-dtype": (
        _npz("eval.npz", x=lambda x: x.astype("float16")),
        [],
        "eval.npz: x is float16 (40, 8, 8) but the model takes float32",
    ),
    "eval-without-probs": (_npz("eval.npz", probs=None), [], "has no array 'probs'"),
    "labels-count": (
        lambda run: (run / "labels.json").write_text('["a", "b"]'),
        [],
        "2 class names",
    ),
    "unknown-mode": (lambda run: None, ["--quant", "int8,int4"], "unknown mode 'int4'"),
    "existing-bundle": (
        _existing_bundle,
        [],
        "exists and is not empty (use --overwrite)",
    ),
    "bundle-is-run-dir": (lambda run: None, ["--out", "{run}", "--overwrite"], "holds the"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tiny_run, tmp_path):
    mutate, extra, message = BAD_INPUTS[case]
    run = pathlib.Path(shutil.copytree(tiny_run, tmp_path / "run"))
    mutate(run)
    before = sorted(p.name for p in run.iterdir())
    bundle_before = (
        sorted(p.name for p in (run / "bundle").iterdir()) if (run / "bundle").exists() else None
    )
    status, stdout, stderr = run_cli([str(run), *[arg.format(run=run) for arg in extra]])
    assert status == 2
    assert stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("keras-mha-export: error: ")
    assert message in stderr
    assert sorted(p.name for p in run.iterdir()) == before  # no bundle, no temp dir
    if bundle_before is not None:
        assert sorted(p.name for p in (run / "bundle").iterdir()) == bundle_before


def test_import_module_registers_custom_layers(tiny_run, tmp_path, monkeypatch):
    import keras

    module = "keras_mha_export_test_layers"
    (tmp_path / f"{module}.py").write_text(
        "import keras\n\n\n"
        f"@keras.saving.register_keras_serializable(package={module!r})\n"
        "class Doubler(keras.layers.Layer):\n"
        "    def call(self, x):\n"
        "        return x * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    layers = __import__(module)
    run = pathlib.Path(shutil.copytree(tiny_run, tmp_path / "run"))
    model = keras.Sequential(
        [keras.Input((8, 8)), layers.Doubler(), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    model.save(run / "model.keras")
    # Forget the layer, as a fresh process would.
    monkeypatch.delitem(keras.saving.get_custom_objects(), f"{module}>Doubler")
    monkeypatch.delitem(sys.modules, module)
    status, _, stderr = run_cli([str(run), "--out", str(tmp_path / "b")])
    assert status == 2 and "unknown custom object" in stderr
    status, _, stderr = run_cli([str(run), "--out", str(tmp_path / "b"), "--import-module", module])
    # Loaded now; it fails later, on its 3 outputs against eval's 10 classes.
    assert status == 2 and "does not match eval probs with 10 classes" in stderr, stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{tmp}/nope"], "run directory {tmp}/nope does not exist"),
        ([], "give RUN_DIR, or --model, --calibration and --eval"),
        (["--model", "m.keras", "--out", "{tmp}"], "missing --calibration"),
        (["{tmp}", "--eval", "e.npz"], "not both"),
        (["--model", "m.keras", "--calibration", "c.npz", "--eval", "e.npz"], "--out is required"),
        (["{tmp}", "--bogus"], "unrecognized arguments: --bogus"),
    ],
    ids=["missing-run-dir", "no-source", "model-alone", "run-dir-and-files", "no-out", "bad-flag"],
)
def test_bad_command_lines_are_one_line_exit_2(argv, message, tmp_path, capsys):
    try:
        status = main([arg.format(tmp=tmp_path) for arg in argv])
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert message.format(tmp=tmp_path) in captured.err
    assert list(tmp_path.iterdir()) == []


def test_api_rejects_unknown_modes_and_missing_out(tmp_path):
    with pytest.raises(InputError, match="unknown mode 'int4'"):
        export_bundle(tmp_path, modes=["int4"])
    with pytest.raises(InputError, match="output directory"):
        export_bundle(SourcePaths(tmp_path / "m.keras", tmp_path / "c.npz", tmp_path / "e.npz"))


# ---------------------------------------------------------------- graph checks
def _tensor(index, dtype, shape=(1, 4), signature=None, name=None):
    return TensorInfo(index, name or f"t{index}", shape, signature, dtype, (), (), False)


def test_check_graph_finds_float_islands_custom_ops_and_dynamic_batch():
    # int8 in -> DEQUANTIZE -> NEG (float) -> QUANTIZE -> int8 out
    tensors = (
        _tensor(0, "int8"),
        _tensor(1, "float32"),
        _tensor(2, "float32"),
        _tensor(3, "int8", shape=(1, 4), signature=(-1, 4)),
    )
    ops = (
        OpInfo("DEQUANTIZE", 1, (0,), (1,)),
        OpInfo("NEG", 1, (1,), (2,)),
        OpInfo("QUANTIZE", 1, (2,), (3,)),
        OpInfo("CUSTOM:FlexEinsum", 1, (3,), (3,)),
    )
    graph = GraphInfo(ops, tensors, (0,), (3,), 1)
    problems = check_graph(graph, "int8")
    assert problems["fully_integer"] == ["NEG(t1: float32)", "NEG(t2: float32)"]
    assert problems["builtin_only"] == ["custom op FlexEinsum"]
    assert len(problems["batch_one"]) == 1 and "t3" in problems["batch_one"][0]
    # Float models may be float; a float int8 model input is not allowed.
    assert "fully_integer" not in check_graph(graph, "float32")
    float_io = GraphInfo((OpInfo("ADD", 1, (1, 1), (2,)),), tensors, (1,), (2,), 1)
    assert "model input t1 is float32" in check_graph(float_io, "int8")["fully_integer"]
