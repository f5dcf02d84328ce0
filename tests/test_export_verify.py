"""Verification is the device's: failures, NaN, and the TensorFlow interpreter where LiteRT is absent.

Also what export keeps and its exit status (docs/artifacts.md): the default
`--quant all` keeps the modes that verify and names those it left out; a
mode named with --quant must verify; a mode whose predictions hold and whose
attention view does not is kept, its view marked not faithful, and the
device says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from edge_bundle import example_manifest, run_main
from export_checks import leftovers, run_cli

from bundle_contract.attention_parity import DEFAULT_THRESHOLDS as ATTENTION
from bundle_contract.entries import FileRef, ModeFailure
from bundle_contract.manifest import MODES
from bundle_contract.parity import FLOAT_THRESHOLDS, Parity, Thresholds
from edge_demo.app.cli import main as edge_main
from edge_demo.runtimes.runtime import Runtime, select_runtime


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
    monkeypatch.setitem(FLOAT_THRESHOLDS, "float32", Thresholds(max_abs_diff=-1.0))
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli([str(digits_run), "--out", str(out), "--quant", "float32"])
    assert status == 1
    assert "max |Δprob|" in stderr and "float32" in stderr
    assert "NO" in stdout.splitlines()[-1]  # the summary row says so
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.slow
def test_allow_parity_failure_keeps_the_model_unverified(digits_run, tmp_path, monkeypatch):
    monkeypatch.setitem(FLOAT_THRESHOLDS, "float32", Thresholds(max_abs_diff=-1.0))
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


class NaNInterpreter:
    """LiteRT's interpreter whose outputs are NaN: a float model gone wrong."""

    def __init__(self, **kwargs):
        from ai_edge_litert.interpreter import Interpreter

        self._inner = Interpreter(**kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get_tensor(self, index):
        return np.full_like(self._inner.get_tensor(index), np.nan)


@pytest.mark.slow
def test_nan_outputs_fail_verification(digits_run, tmp_path, monkeypatch):
    """Every threshold misses NaN (float modes' max |Δp| and the others' agreement)."""
    from keras_mha_export import verify

    nan_runtime = Runtime("ai-edge-litert", "nan", "nan", NaNInterpreter)
    monkeypatch.setattr(verify, "verification_runtime", lambda: nan_runtime)
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli([digits_run, "--out", out, "--quant", "float32,dynamic"])
    assert status == 1, stdout + stderr
    assert "NaN or infinite" in stderr and "float32" in stderr and "dynamic" in stderr
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.slow
def test_without_litert_tensorflow_without_default_delegates_verifies(
    digits_run, tmp_path, monkeypatch
):
    from keras_mha_export import verify

    def no_litert(choice):
        from bundle_contract.errors import UsageError

        raise UsageError("cannot import ai_edge_litert.interpreter", "ai-edge-litert")

    monkeypatch.setattr(verify, "select_runtime", no_litert)
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli([digits_run, "--out", out, "--quant", "float32,int8"])
    assert status == 0, stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    for mode in ("float32", "int8"):
        entry = manifest["models"][mode]
        assert entry["verified"] is True
        assert entry["verified_with"] == "tensorflow-builtin-without-default-delegates"
        assert "ai-edge-litert" not in entry["runtimes"]  # not claimed: LiteRT never saw it
    # The device, on LiteRT, gets the same verdict from the same scorer.
    from bundle_contract.bundle import open_bundle
    from edge_demo.runtimes.score import run_mode

    bundle = open_bundle(out)
    for mode in bundle.modes:
        result = run_mode(bundle, mode, select_runtime("litert"))
        assert result.passed, (mode, result.failures)
        assert math.isclose(result.agreement, manifest["models"][mode]["parity"]["agreement"])


# --- what export keeps, and its exit status (docs/artifacts.md) -----------------------


def _page_notes(path) -> list[str]:
    found = re.search(
        r'<script type="application/json" id="attention-data">(.*?)</script>',
        path.read_text(),
        re.S,
    )
    assert found, "no attention-data element"
    return json.loads(found.group(1))["notes"]


@pytest.mark.slow
def test_default_export_keeps_what_verifies_and_names_what_it_left_out(
    digits_run, tmp_path, monkeypatch
):
    """No --quant (all): float16 misses its task bound (1e-9 on every probability,
    which no float16 model meets) and int8 its attention bound (max |Δ| 1e-6,
    where int8 measures hundredths). float16 is left out with its figure and the
    command that keeps it; int8's predictions hold, so it is kept, verified, its
    view marked not faithful with the figure; export exits 0. The device passes
    every kept mode, says int8's view is not faithful, and its head view opens
    on a mode whose view is."""
    monkeypatch.setitem(FLOAT_THRESHOLDS, "float16", Thresholds(max_abs_diff=1e-9))
    strict = dataclasses.replace(ATTENTION["int8"], max_abs_diff=1e-6)
    monkeypatch.setitem(ATTENTION, "int8", strict)
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli([digits_run, "--out", out])
    assert status == 0, stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["requested"] == list(MODES)
    assert manifest["verified"] == ["float32", "dynamic", "int8", "int16x8"]
    assert set(manifest["models"]) == set(manifest["verified"])
    assert list(manifest["failed"]) == ["float16"]
    assert not (out / "model_float16.tflite").exists()
    # The left-out line: the figure against its bound, and the command.
    figure = manifest["failed"]["float16"]["parity"]["max_abs_diff"]
    (line,) = [line for line in stderr.splitlines() if "left out float16" in line]
    assert line.startswith("keras-mha-export: left out float16: ")
    assert f"max |Δprob| {figure:.3g} > 1e-09" in line
    assert line.endswith(
        "to make it hold: --quant float16 --allow-parity-failure keeps it in the bundle, "
        "marked unverified"
    )
    assert "left out: float16" in stdout.strip().splitlines()[-1]
    assert "4/5 modes verified" in stdout.strip().splitlines()[-1]
    # int8: verified on its predictions, its view marked with the figure it missed.
    int8 = manifest["models"]["int8"]
    assert int8["verified"] is True and int8["failures"] == []
    attention = int8["attention"]
    assert attention["faithful"] is False
    assert attention["thresholds"]["max_abs_diff"] == 1e-6
    worst = attention["parity"]["max_abs_diff"]
    assert worst > 1e-6
    missed = f"attention max |Δ| {worst:.3g} > 1e-06"
    (view_line,) = [line for line in stdout.splitlines() if line.startswith("int8: kept")]
    assert missed in view_line and "the device's head view says so" in view_line
    assert view_line.endswith(
        "For a faithful view: its int16x8 (int16 activations), verified in this bundle "
        "with a faithful view: the head view opens on it"
    )
    row = next(line for line in stdout.splitlines() if line.startswith("int8 "))
    assert row.endswith("yes, view not faithful"), row
    for mode in ("float32", "dynamic", "int16x8"):
        assert manifest["models"][mode]["attention"]["faithful"] is True, mode
    # The device: every kept mode passes; int8's view misses, reported, not failed.
    status, device_out, device_err = run_main(edge_main, [out])
    assert status == 0, device_out + device_err
    assert f"note: manifest.json marks int8's attention view as not faithful ({missed}" in (
        device_out
    )
    assert "int8: attention view not faithful (so marked at export; not a failure): " in device_out
    assert "PASS: 4 of 4 modes run meet the manifest's thresholds" in device_out
    # The head view opens on a verified mode whose view is faithful: int16x8, not int8.
    page = tmp_path / "page.html"
    status, device_out, _ = run_main(edge_main, [out, "--sample", "0", "--view", page])
    assert status == 0 and "(attention from int16x8 on" in device_out, device_out
    assert not any("not faithful" in note for note in _page_notes(page))


@pytest.mark.slow
def test_a_named_mode_that_fails_exits_1_and_the_others_are_kept(digits_run, tmp_path, monkeypatch):
    """--quant names float32 and float16; float16 fails: exit 1, as a named mode
    must hold, but the bundle holds float32 (verified) and says what it left out."""
    monkeypatch.setitem(FLOAT_THRESHOLDS, "float16", Thresholds(max_abs_diff=1e-9))
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli([digits_run, "--out", out, "--quant", "float32,float16"])
    assert status == 1, stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verified"] == ["float32"] and list(manifest["failed"]) == ["float16"]
    assert "keras-mha-export: left out float16: max |Δprob| " in stderr
    assert stderr.strip().splitlines()[-1] == (
        "keras-mha-export: not verified, left out of the bundle: float16 (named with --quant)"
    )
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_a_named_mode_whose_view_misses_is_kept_and_the_device_says_so(
    digits_run, tmp_path, monkeypatch
):
    """--quant float32 with an attention bound float32 cannot meet (1e-12; it
    measures about 1e-7): every prediction agrees, so the mode is verified and
    export exits 0, its view marked not faithful. The device's parity run passes
    it and reports the miss (its JSON too); the head view of that mode says, on
    the page and in the command's line, that the view is not faithful, with the
    figure export measured."""
    strict = dataclasses.replace(ATTENTION["float32"], max_abs_diff=1e-12)
    monkeypatch.setitem(ATTENTION, "float32", strict)
    out = tmp_path / "bundle"
    status, stdout, stderr = run_cli([digits_run, "--out", out, "--quant", "float32"])
    assert status == 0 and stderr == "", stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["models"]["float32"]
    assert manifest["verified"] == ["float32"] and manifest["failed"] == {}
    assert entry["verified"] is True and entry["attention"]["faithful"] is False
    assert entry["parity"]["max_abs_diff"] <= 1e-5  # the predictions hold
    worst = entry["attention"]["parity"]["max_abs_diff"]
    missed = f"attention max |Δ| {worst:.3g} > 1e-12"
    assert any(line.startswith("float32: kept") and missed in line for line in stdout.splitlines())
    # The device's parity run: a pass, the miss reported (and in its JSON).
    report = tmp_path / "report.json"
    status, device_out, device_err = run_main(edge_main, [out, "--json", report])
    assert status == 0, device_out + device_err
    assert "float32: attention view not faithful (so marked at export; not a failure): " in (
        device_out
    )
    result = json.loads(report.read_text())["modes"]["float32"]
    assert result["passed"] is True and result["failures"] == []
    assert result["attention_status"] == "failed" and result["attention_faithful"] is False
    assert result["attention_failures"][0].startswith("attention max |Δ| ")
    # The head view of that mode says so, with export's figure.
    page = tmp_path / "page.html"
    status, device_out, _ = run_main(
        edge_main, [out, "--sample", "0", "--view", page, "--quant", "float32"]
    )
    assert status == 0, device_out
    (note,) = [n for n in _page_notes(page) if "not faithful" in n]
    assert note.startswith("float32's attention view is not faithful to the float model: ")
    assert missed in note and "its predictions are verified" in note
    assert note in device_out  # the command's "wrote ..." line names it too


def test_left_out_lines_name_the_figures_and_the_command_that_makes_them_hold(tmp_path):
    """The left-out line of an encoder's int8 or int16x8 gives the rescale and
    int16x8 commands (docs/quantization.md); once rescaled at alpha 0.5, int8's
    gives int16x8; otherwise --allow-parity-failure keeps the mode, marked."""
    from keras_mha_export.summary import left_out

    missed = "min cosine 0.812345 < 0.980000"
    failure = ModeFailure("parity", (missed,), Parity(math.nan, 0.9, 0.1, 0.01), 1000, {})
    example = example_manifest()  # int8 and float32
    encoder = dataclasses.replace(
        example,
        models={"float32": example.models["float32"]},
        eval=dataclasses.replace(example.eval, task="embedding"),
        files={**example.files, "tokenizer": FileRef("tokenizer.json", "e" * 64)},
        failed={"int8": failure, "int16x8": failure},
    )
    run = tmp_path / "mine"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    int8, int16x8 = left_out(encoder, run)
    recipe = (
        f"to make it hold: keras-mha-rescale {run} --out {run}_rescaled --alpha 0.5, then "
        f"keras-mha-export {run}_rescaled --quant int16x8 (docs/quantization.md)"
    )
    assert int8 == f"left out int8: {missed}; {recipe}"
    assert int16x8 == f"left out int16x8: {missed}; {recipe}"
    (run / "metrics.json").write_text(json.dumps({"rescale": {"alpha": 0.5}}))
    int8, int16x8 = left_out(encoder, run)
    assert int8.endswith(f"to make it hold: keras-mha-export {run} --out {run}/bundle_int16x8 "
                         "--quant int16x8 (int16 activations; docs/quantization.md)")  # fmt: skip
    assert int16x8.endswith("--quant int16x8 --allow-parity-failure keeps it in the bundle, "
                            "marked unverified")  # fmt: skip
    # A classifier fine-tuned from an encoder: keras-mha-rescale does not take it
    # (found on a user's CSV: it refuses "a text-classification run").
    tuned = dataclasses.replace(
        encoder, eval=dataclasses.replace(example.eval, task="text-classification")
    )
    int8, int16x8 = left_out(tuned, run)
    assert "keras-mha-rescale" not in int8 + int16x8
    assert int8.endswith("--quant int16x8 (int16 activations; docs/quantization.md)")
    assert int16x8.endswith("--quant int16x8 --allow-parity-failure keeps it in the bundle, "
                            "marked unverified")  # fmt: skip
    # A classifier; a mode kept unverified (--allow-parity-failure) is not left out;
    # a conversion's reason is all there is to say.
    converted = ModeFailure("convert", ("the converter cannot produce dynamic: no",))
    classifier = dataclasses.replace(  # int8 is in `models`: kept unverified
        example, failed={"int8": failure, "float16": failure, "dynamic": converted}
    )
    assert left_out(classifier, run) == [
        f"left out float16: {missed}; to make it hold: --quant float16 --allow-parity-failure "
        "keeps it in the bundle, marked unverified",
        "left out dynamic: the converter cannot produce dynamic: no",
    ]
    assert left_out(classifier, run, converted_only=True) == left_out(classifier, run)[:1]
