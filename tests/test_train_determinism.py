"""Same seed, same machine: the same run, to the byte (never asserted across CPUs)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_checks import run_module

# A small, fast text model (for determinism; it does not learn in 2 epochs).
TINY_PRONOUNS = ["--d-model", "16", "--num-heads", "2", "--num-layers", "2", "--ff-dim", "32"]


@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path):
    """Two runs in fresh processes on this machine with one seed agree exactly."""
    args = ["--dataset", "pronouns", "--epochs", "2", *TINY_PRONOUNS, "--seed", "7", "--quiet"]
    results = []
    for name in ("a", "b"):
        proc = run_module("keras_mha.train", [*args, "--out", str(tmp_path / name)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "test accuracy" in proc.stdout
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        with np.load(tmp_path / name / "eval.npz") as npz:
            probs = npz["probs"]
        results.append((metrics, probs))
    (a, probs_a), (b, probs_b) = results
    for key in ("test_accuracy", "per_class_accuracy", "per_cue_accuracy", "history", "config"):
        assert a[key] == b[key], key
    np.testing.assert_array_equal(probs_a, probs_b)
    assert a["deterministic"] is True and a["seed"] == 7


def test_op_determinism_is_restored():
    from tensorflow.python.framework import config as tf_config

    from keras_mha.train.determinism import op_determinism

    if tf_config.is_op_determinism_enabled():
        pytest.skip("op determinism already enabled in this process")
    with op_determinism(True):
        assert tf_config.is_op_determinism_enabled()
    assert not tf_config.is_op_determinism_enabled()
    with op_determinism(False):
        assert not tf_config.is_op_determinism_enabled()
