"""The app as a device runs it: `python -m edge_demo` from a copied folder, in TensorFlow-free venvs.

Subprocesses: LiteRT (KERAS_MHA_EDGE_PYTHON, default .venv-edge/bin/python)
and tflite-runtime (KERAS_MHA_TFLITE_PYTHON, default .venv-edge-tflite/bin/python),
with the working directory a temporary copy of edge_demo/ alone (`app_dir`).
They check the exit-code contract (0 pass, 1 parity failure, 2 bad input in
one line, 130 interrupted) and that TensorFlow, keras and keras_mha are not
importable there. Bad-bundle cases run in process: tests/test_edge_bundle.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from edge_bundle import edge_python, edit_manifest, match_model_file
from export_checks import litert_outputs, tflite_runtime_outputs

from edge_demo.app.report import render_features
from edge_demo.runtimes.runtime import RUNTIMES

pytest_plugins = ["edge_fixtures"]  # bundle fixtures, built once per session

RUNTIME_NAMES = {choice: entry.name for choice, entry in RUNTIMES.items()}
ALL_MODES = ["float32", "dynamic", "float16", "int8", "int16x8"]
# What tflite-runtime 2.14 may not run (docs/field_notes.md): TF 2.21's dynamic-range
# models (FULLY_CONNECTED v12, when weights are big enough to be quantized) and
# int16x8 (RSQRT). LiteRT runs everything.
TFLITE_RUNTIME_MAY_SKIP = {"dynamic", "int16x8"}


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


def _random_bytes(n: int) -> bytes:
    return np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_render_features_draws_ink_darkest():
    image = np.zeros((8, 8), np.float32)
    image[2, 3] = 1.0
    image[5, 1] = 0.5
    lines = render_features(image).splitlines()
    assert len(lines) == 10 and lines[0] == "+" + "-" * 16 + "+"
    assert lines[3] == "|      @@        |"
    assert lines[6][3:5] == "=="  # mid grey: level rint(0.5 * 9) = 4
    assert set(lines[1]) == {"|", " "}


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
def test_edge_venv_has_no_tensorflow_keras_or_keras_mha(runtime, app_dir):
    python = edge_python(runtime)
    for module in ("tensorflow", "keras", "keras_mha"):
        proc = run_app(python, app_dir, "-c", f"import {module}", module=False)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, module
    runtime_module = RUNTIMES[runtime].module
    proc = run_app(
        python,
        app_dir,
        "-c",
        f"import {runtime_module}, edge_demo, bundle_contract; "
        "print(edge_demo.__file__); print(bundle_contract.__file__)",
        module=False,
    )
    assert proc.returncode == 0, proc.stderr
    # the copy of what a device copies (edge_demo.DEVICE_PACKAGES), not the repo
    app, contract = (pathlib.Path(line).parent for line in proc.stdout.split())
    assert (app, contract) == (app_dir / "edge_demo", app_dir / "bundle_contract")
    copied = {p.name for p in app_dir.iterdir() if p.name != "bundle"}  # a test's bundle
    assert copied == {"bundle_contract", "edge_demo"}


# --- the parity run -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
def test_parity_run_in_edge_venv(runtime, digits_bundle, app_dir, tmp_path):
    report = tmp_path / "report.json"
    proc = run_app(edge_python(runtime), app_dir, digits_bundle, "--json", report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "p50 µs" in proc.stdout  # the default (narrow) table
    assert proc.stderr == ""  # native INFO chatter is captured too
    result = json.loads(report.read_text())
    manifest = json.loads((digits_bundle / "manifest.json").read_text())
    float_accuracy = manifest["eval"]["float_accuracy"]
    assert result["runtime"]["name"] == RUNTIME_NAMES[runtime]
    assert result["runtime"]["version"] not in ("", "unknown")
    if runtime == "litert":  # what LiteRT said on fd 2, captured (the arm64 run requires it)
        assert result["runtime"]["delegates"] == ["XNNPACK"]
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
        limits = manifest["models"][mode]["thresholds"]  # what the device enforces
        if "min_agreement" in limits:
            assert entry["agreement"] >= limits["min_agreement"] - 1e-9, mode
            assert float_accuracy - entry["accuracy"] <= limits["max_accuracy_drop"] + 1e-9, mode
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


# --- one sample, one sentence ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
def test_sample_shows_the_digit_and_each_prediction(runtime, digits_bundle, app_dir, tmp_path):
    """Each mode's line is what that mode computes for the sample, on this runtime.

    Whether a quantized mode keeps the float model's prediction on one
    sample is not the contract: it may change up to 1 % of them (the
    manifest's min_agreement, judged on the whole eval set by the parity
    tests). So each line is checked against the mode's own output, computed
    here without edge_demo (LiteRT or tflite-runtime directly). A mode that
    bounds every probability (float32 1e-5, float16 1e-2) must also keep the
    float top class whenever the float model's top two are more than twice
    that bound apart.
    """
    evaluation = np.load(digits_bundle / "eval.npz")
    manifest = json.loads((digits_bundle / "manifest.json").read_text())
    labels = json.loads((digits_bundle / "labels.json").read_text())
    i = 5
    proc = run_app(edge_python(runtime), app_dir, digits_bundle, "--sample", i)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"label '{int(evaluation['y'][i])}'" in out
    assert out.count("|") >= 16 and "@@" in out  # the 8x8 picture
    reference = evaluation["probs"][i].astype(np.float64)
    ref_line = next(line for line in out.splitlines() if line.startswith("keras (float reference)"))
    assert ref_line.split()[3] == labels[int(reference.argmax())]
    assert f"{reference.max():.4f}" in ref_line
    top_two = np.sort(reference)[-2:]
    may_skip = TFLITE_RUNTIME_MAY_SKIP if runtime == "tflite-runtime" else set()
    checked_against_float = []
    for mode in ALL_MODES:
        line = next(line for line in out.splitlines() if line.startswith(mode + " "))
        if mode in may_skip and line.split()[1] == "skipped":
            continue
        path = digits_bundle / manifest["models"][mode]["file"]
        if runtime == "litert":
            probs = litert_outputs(path, evaluation["x"][i : i + 1])[0][0]
        else:
            probs = tflite_runtime_outputs(path, evaluation["x"][i : i + 1], tmp_path)[0]
        label, confidence = line.split()[1], float(line.split()[2])
        assert label == labels[int(probs.argmax())], (mode, line, probs)
        assert confidence == pytest.approx(probs.max(), abs=5e-5), (mode, line, probs)
        bound = manifest["models"][mode]["thresholds"].get("max_abs_diff")
        if bound is not None and top_two[1] - top_two[0] > 2 * bound:
            assert label == labels[int(reference.argmax())], (mode, line)
            checked_against_float.append(mode)
    assert "float32" in checked_against_float  # a digit the float model is sure of
    if runtime == "tflite-runtime":
        assert "int16x8: skipped:" in out


@pytest.mark.slow
def test_text_is_tokenized_on_the_device_and_matches_keras(text_bundle, text_run, app_dir):
    import keras

    import keras_mha  # noqa: F401  (registers the custom layers)
    from bundle_contract.vocab import Vocab

    sentence = "The cat SAT on a zebra"
    vocab = Vocab.load(text_bundle / "vocab.json")
    ids = vocab.encode(sentence)[0]
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
    """tflite-runtime 2.14 runs every mode of the token classifier: it has no int8
    DIV, and the masked mean of a 0/1 float mask needs none (layers.TokenEmbedding)."""
    python = edge_python("tflite-runtime")
    proc = run_app(python, app_dir, text_bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped" not in proc.stdout
    for mode in ("float32", "float16", "int8"):
        assert re.search(rf"^{mode} +PASS ", proc.stdout, re.MULTILINE), proc.stdout
    assert "PASS: 3 of 3 modes run" in proc.stdout
    proc = run_app(python, app_dir, text_bundle, "--sample", 0)
    assert proc.returncode == 0 and 'text: "' in proc.stdout
    vocab = json.loads((text_bundle / "vocab.json").read_text())
    first = np.load(text_bundle / "eval.npz")["x"][0]
    words = " ".join(vocab["tokens"][i] for i in first if i != vocab["pad_id"])
    assert f'text: "{words}"' in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["litert", "tflite-runtime"])
@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda d: d[: len(d) // 2], id="truncated-half"),
        pytest.param(lambda d: d[:2000] + _random_bytes(400) + d[2400:], id="corrupt-middle"),
    ],
)
def test_malformed_model_with_matching_manifest_does_not_crash(
    cut, runtime, bundle_copy, app_dir, request
):
    """Past size, sha256 and identifier: the contract's index check refuses what it can
    see is broken (a truncated file points outside itself); anything else the
    runtime meets first in a child process, never in the app's."""
    path = bundle_copy / "model_int8.tflite"
    path.write_bytes(cut(path.read_bytes()))
    match_model_file(bundle_copy, "int8")
    proc = run_app(edge_python(runtime), app_dir, bundle_copy, "--quant", "float32,int8")
    line = assert_bad_input(proc, "model_int8.tflite")
    static = "corrupt TFLite flatbuffer" in line
    if "truncated-half" in request.node.name:
        assert static and "outside the file" in line, line
    else:
        assert static or (
            RUNTIME_NAMES[runtime] in line
            and ("crashed" in line or "cannot load it" in line or "out of memory" in line)
        ), line


@pytest.mark.slow
def test_bad_bundle_is_exit_2_in_one_line_on_the_device(bundle_copy, app_dir):
    (bundle_copy / "model_int8.tflite").write_bytes(b"")
    proc = run_app(edge_python("litert"), app_dir, bundle_copy)
    assert_bad_input(proc, "keras-mha-edge: error: ", "model_int8.tflite", "empty file")


@pytest.mark.slow
def test_ctrl_c_is_exit_130_and_writes_no_report(digits_bundle, app_dir, tmp_path):
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.Popen(
        [str(edge_python("litert")), "-m", "edge_demo", str(digits_bundle), "--repeat", "1000",
         "--quant", "float32", "--json", str(report)],
        cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().startswith("bundle ")  # running: the header is out
    proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate()
    assert proc.returncode == 130 and stderr.strip() == "keras-mha-edge: interrupted", stderr
    assert list(tmp_path.iterdir()) == []
