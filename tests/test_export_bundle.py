"""keras-mha-export on a trained digits run: every mode converted, verified, bundled.

`test_mode_converts_and_meets_its_thresholds` is the independent oracle: it
runs each file with LiteRT directly (tests/export_checks.py), not through
edge_demo, and compares with the manifest's figures.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from edge_bundle import REPO, edge_python
from export_checks import NOISE, litert_outputs, sha256, tflite_runtime_loads

from bundle_contract.bundle import open_bundle
from bundle_contract.manifest import MODES
from bundle_contract.parity import default_thresholds
from edge_demo.runtimes.runtime import select_runtime
from edge_demo.runtimes.score import run_mode
from keras_mha_export.graph import read_graph

FLOATS = {"float16", "float32", "float64"}


pytest_plugins = ["edge_fixtures"]  # digits_export: the digits run exported once per session


@pytest.fixture
def exported(digits_export) -> dict:
    return digits_export


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
    expected = default_thresholds(mode, manifest["eval"]["samples"]).to_json()
    assert entry["thresholds"] == expected
    # Re-run the file with LiteRT here and compare with the float model.
    evaluation = np.load(exported["run"] / "eval.npz")
    probs, inp, out = litert_outputs(exported["out"] / entry["file"], evaluation["x"])
    ref = evaluation["probs"]
    agreement = (probs.argmax(-1) == ref.argmax(-1)).mean()
    accuracy = (probs.argmax(-1) == evaluation["y"]).mean()
    if "max_abs_diff" in expected:
        assert np.abs(probs - ref).max() <= expected["max_abs_diff"]
    else:  # at most 9 of the 360 predictions changed (docs/artifacts.md)
        assert agreement >= expected["min_agreement"] - 1e-9
        assert manifest["eval"]["float_accuracy"] - accuracy <= expected["max_accuracy_drop"] + 1e-9
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
        ["manifest.json", "eval.npz", "labels.json", "attention.npz"]
        + [f"model_{m}.tflite" for m in MODES]
        + [f"model_{m}.deploy.tflite" for m in MODES]
    )
    assert manifest["attention"]["sha256"] == sha256(out / "attention.npz")
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
def test_runtime_claims_match_tflite_runtime_214(exported):
    edge_python("tflite-runtime")  # or missing(...): its venv, when this Python has the wheel
    models = exported["manifest"]["models"]
    loads = tflite_runtime_loads([exported["out"] / e["file"] for e in models.values()])
    assert {m: e["runtimes"]["tflite-runtime"] for m, e in models.items()} == {
        m: loads[e["file"]] for m, e in models.items()
    }
    assert loads["model_int16x8.tflite"] is False  # RSQRT int16 (docs/field_notes.md)
    assert all(e["runtimes"]["ai-edge-litert"] for e in models.values())


@pytest.mark.slow
def test_verified_means_the_device_passes(exported):
    """What export calls verified, the device's own loader and scorer pass, with its figures."""
    bundle = open_bundle(exported["out"])
    runtime = select_runtime("litert")
    for mode in bundle.modes:
        entry = bundle.manifest.models[mode]
        result = run_mode(bundle, mode, runtime)
        assert entry.verified is True and result.passed is True, (mode, result.failures)
        assert result.parity == entry.parity, mode  # same code, same runtime, same figures
        assert entry.verified_with == "ai-edge-litert"


@pytest.mark.slow
def test_benchmark_times_through_the_device_wrapper(exported):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_edge
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    latency = bench_edge.litert_latency({"digits": exported["out"]}, repeats=2)
    assert set(latency["digits"]) == set(MODES)
    assert all(us > 0 for us in latency["digits"].values())


@pytest.mark.parametrize(
    "modes, ranges, ids, written",
    [
        ("float32,dynamic,float16,int8,int16x8", False, False, ["plain"]),
        ("float32,dynamic,float16,int8,int16x8", True, True, ["plain", "ranges", "newton"]),
        ("int16x8", False, True, ["newton"]),  # ai-edge-quantizer's graph only
        ("int8", True, False, ["ranges"]),  # a QAT run's ranges only
        ("float32,int16x8", True, False, ["plain"]),  # images: TF's 16x8 takes the plain graph
    ],
)
def test_each_mode_converts_the_saved_model_it_needs_and_no_other(
    monkeypatch, tmp_path, modes, ranges, ids, written
):
    """export_bundle's conversion writes one SavedModel pair (model and attention
    view) per kind its modes convert, and no other: plain; int8 with a QAT run's
    ranges; int16x8 of a token-id model (its LayerNorms refined). An int16x8-only
    export of a token-id model writes one pair, not two."""
    import types

    from keras_mha_export import bundle

    made, used = [], {}

    def saved_models(model, scratch, view, ranges=None, length=None, newton_steps=0):
        kind = "ranges" if ranges is not None else "newton" if newton_steps else "plain"
        made.append(kind)
        return f"{kind}-model", f"{kind}-view"

    def convert_mode(model, mode, *args, **kwargs):
        used[mode] = model
        return None, ["stub"]

    monkeypatch.setattr(bundle, "saved_models", saved_models)
    monkeypatch.setattr(bundle, "convert_mode", convert_mode)
    x = np.zeros((3, 8), np.int32 if ids else np.float32)
    loaded = types.SimpleNamespace(
        model=None, has_attention=True, length=None, ranges={"r": 1} if ranges else None,
        calibration=x, eval=types.SimpleNamespace(x=x), task="classification", dynamic=False,
        pad_id=None,
    )  # fmt: skip
    selected = tuple(modes.split(","))
    draft = bundle._Draft(loaded, selected, None, 0.0)
    logged = []
    bundle._convert(tmp_path, loaded, selected, draft, logged.append)
    assert made == written
    kinds = bundle.saved_model_kinds(selected, ranges, ids)
    assert used == {mode: f"{kinds[mode]}-model" for mode in selected}
    assert sum("ranges from ranges.json" in line for line in logged) == ("ranges" in written)
