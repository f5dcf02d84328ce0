"""Verification is the device's: failures, NaN, and the TensorFlow interpreter where LiteRT is absent."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from export_checks import leftovers, run_cli

from edge_demo.contract.parity import FLOAT_THRESHOLDS, Thresholds
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
        from edge_demo.errors import UsageError

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
    from edge_demo.contract.bundle import open_bundle
    from edge_demo.runtimes.score import run_mode

    bundle = open_bundle(out)
    for mode in bundle.modes:
        result = run_mode(bundle, mode, select_runtime("litert"))
        assert result.passed, (mode, result.failures)
        assert math.isclose(result.agreement, manifest["models"][mode]["parity"]["agreement"])
