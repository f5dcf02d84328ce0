"""Same seed, same machine: the same run, to the byte (never asserted across CPUs).

What two runs write, compared byte for byte (measured with TF 2.21, Keras 3.15):

- byte-identical: eval.npz, calibration.npz (numpy writes its zip entries
  with a fixed 1980 date), labels.json, vocab.json, training_curves.png,
  attention_heads.png, and the weights inside model.keras
  (`model.weights.h5`, byte for byte);
- not byte-identical, and why: metrics.json's `train_seconds` (a wall-clock
  time); in model.keras, `metadata.json`'s `date_saved`, the zip entry date
  Keras gives `model.weights.h5` (the save time), and `config.json`'s
  `shared_object_id` values (Python `id()`s of shared objects, which differ
  between processes). The test requires these to be the only differences.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from run_checks import REPO, run_module

# A small, fast text model (for determinism; it does not learn in 2 epochs).
TINY_PRONOUNS = ["--d-model", "16", "--num-heads", "2", "--num-layers", "2", "--ff-dim", "32"]
# Files of a run directory that differ between two runs, each for a known reason (above).
NOT_BYTE_IDENTICAL = {"metrics.json", "model.keras"}
CLOCK_METRICS = {"train_seconds"}


def _zip_entries(path) -> dict[str, tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(path) as archive:
        return {info.filename: (info, archive.read(info)) for info in archive.infolist()}


def _without_object_ids(config_json: bytes) -> str:
    """config.json with each distinct `shared_object_id` renumbered in order of appearance."""
    numbers: dict[str, int] = {}

    def renumber(match: re.Match) -> str:
        return f'"shared_object_id": {numbers.setdefault(match.group(1), len(numbers))}'

    return re.sub(r'"shared_object_id": (\d+)', renumber, config_json.decode())


def assert_same_keras_file(a, b) -> None:
    """Two model.keras files that differ only by save time and Python object ids."""
    ea, eb = _zip_entries(a), _zip_entries(b)
    assert list(ea) == list(eb) == ["metadata.json", "config.json", "model.weights.h5"]
    assert ea["model.weights.h5"][1] == eb["model.weights.h5"][1]  # the weights, to the byte
    for name, (info_a, _) in ea.items():  # how each entry is stored (contents: below)
        info_b = eb[name][0]
        for field in ("compress_type", "external_attr", "create_system", "flag_bits"):
            assert getattr(info_a, field) == getattr(info_b, field), (name, field)
    meta_a, meta_b = (json.loads(e["metadata.json"][1]) for e in (ea, eb))
    assert set(meta_a) == set(meta_b) and "date_saved" in meta_a
    assert {k: v for k, v in meta_a.items() if k != "date_saved"} == {
        k: v for k, v in meta_b.items() if k != "date_saved"
    }
    config_a, config_b = (_without_object_ids(e["config.json"][1]) for e in (ea, eb))
    assert config_a == config_b


@pytest.mark.slow
def test_same_seed_same_bytes(tmp_path):
    """Two runs in fresh processes on this machine with one seed write the same bytes."""
    args = ["--dataset", "pronouns", "--epochs", "2", *TINY_PRONOUNS, "--seed", "7", "--quiet"]
    for name in ("a", "b"):
        proc = run_module("keras_mha.train", [*args, "--out", str(tmp_path / name)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "test accuracy" in proc.stdout
    a, b = tmp_path / "a", tmp_path / "b"
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    assert {"eval.npz", "calibration.npz", "model.keras", "vocab.json"} <= set(files)
    differ = {name for name in files if (a / name).read_bytes() != (b / name).read_bytes()}
    assert differ <= NOT_BYTE_IDENTICAL, differ  # every other file, to the byte
    assert_same_keras_file(a / "model.keras", b / "model.keras")
    metrics_a, metrics_b = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert CLOCK_METRICS <= set(metrics_a) and set(metrics_a) == set(metrics_b)
    assert {k: v for k, v in metrics_a.items() if k not in CLOCK_METRICS} == {
        k: v for k, v in metrics_b.items() if k not in CLOCK_METRICS
    }
    assert metrics_a["deterministic"] is True and metrics_a["seed"] == 7
    with np.load(a / "eval.npz") as npz:  # not a trivial run: real probabilities
        assert npz["probs"].std() > 0


def test_keras_file_comparison_can_fail(tmp_path):
    """The model.keras comparison catches a changed weight and a changed config value."""
    import keras

    from keras_mha.model import ModelConfig, build_classifier

    config = ModelConfig(d_model=8, num_heads=2, num_layers=1, ff_dim=8, dropout=0.0)
    keras.utils.set_random_seed(0)
    model = build_classifier(config)
    model.save(tmp_path / "a.keras")
    model.save(tmp_path / "b.keras")
    assert_same_keras_file(tmp_path / "a.keras", tmp_path / "b.keras")
    weights = model.get_layer("embedding").kernel
    weights.assign(weights.numpy() + 1e-7)
    model.save(tmp_path / "c.keras")
    with pytest.raises(AssertionError):
        assert_same_keras_file(tmp_path / "a.keras", tmp_path / "c.keras")
    model.get_layer("embedding").trainable = False
    model.save(tmp_path / "d.keras")
    with pytest.raises(AssertionError):
        assert_same_keras_file(tmp_path / "c.keras", tmp_path / "d.keras")


_OP_DETERMINISM = """
from tensorflow.python.framework import config as tf_config
from keras_mha.train.determinism import op_determinism

assert not tf_config.is_op_determinism_enabled(), "on in a fresh process"
with op_determinism(True):
    assert tf_config.is_op_determinism_enabled()
assert not tf_config.is_op_determinism_enabled(), "not restored"
with op_determinism(False):
    assert not tf_config.is_op_determinism_enabled()
print("restored")
"""


@pytest.mark.slow  # a Python child importing a framework
def test_op_determinism_is_restored():
    """In a fresh process: an earlier in-process train() may have left it on in this one."""
    env = {k: v for k, v in os.environ.items() if k != "TF_DETERMINISTIC_OPS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run(
        [sys.executable, "-c", _OP_DETERMINISM],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "restored", proc.stderr[-3000:]
