"""Quantization-aware training of run directories, end to end.

`keras-mha-train --qat EPOCHS` (a classifier) and `keras-mha-qat RUN`
(a sentence encoder, by distillation) write a run with ranges.json;
keras-mha-export gives those ranges to the int8 conversion and the bundle
verifies. The eval reference of a classifier is its float model's output
(not the rounded one); an encoder's stays the float encoder's vectors.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from test_heads_encoder import random_encoder, write_tiny_run

from bundle_contract.attention_parity import DEFAULT_THRESHOLDS
from keras_mha import qat
from keras_mha.qat.cli import main
from keras_mha.qat.train import distillation_ids

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        keras.backend.backend() != "tensorflow", reason="the runs export on TensorFlow"
    ),
]


@pytest.fixture(scope="module")
def pronouns_qat(tmp_path_factory):
    from keras_mha.train import train

    out = tmp_path_factory.mktemp("qat") / "pronouns"
    metrics = train(
        "pronouns", out, epochs=3, qat_epochs=1, d_model=16, num_heads=2, ff_dim=16, verbose=0
    )
    return out, metrics


def test_train_qat_writes_ranges_and_float_references(pronouns_qat):
    from keras_mha.rundir import read_run

    out, metrics = pronouns_qat
    report = metrics["qat"]
    assert report["epochs"] == 1 and report["rule"] == "mse"
    assert len(report["loss"]) == 1 and np.isfinite(report["loss"]).all()
    ranges = qat.load_ranges(out / "ranges.json")
    assert len(ranges) == report["ranges"] > 20
    run = read_run(out)
    model = run.load_model()
    floated = keras.ops.convert_to_numpy(model(run.eval.x[:64], training=False))
    # eval.npz is the float model's softmax, not the rounded model's
    np.testing.assert_allclose(run.eval.probs[:64], floated, atol=1e-5)
    qat.attach(model, ranges)
    rounded = keras.ops.convert_to_numpy(model(run.eval.x[:64], training=False))
    qat.detach(model)
    assert np.abs(rounded - floated).max() > 1e-6


def test_export_gives_the_ranges_to_int8_only(pronouns_qat, tmp_path):
    from keras_mha_export.bundle import export_bundle

    out, _ = pronouns_qat
    lines = []
    # three epochs leave the classifier near chance, its classes near ties:
    # parity is not what this checks
    manifest = export_bundle(
        out, tmp_path / "bundle", "float32,int8", log=lines.append, allow_parity_failure=True
    )
    assert set(manifest.models) == {"float32", "int8"}
    assert manifest.models["float32"].verified
    taken = [line for line in lines if "ranges from ranges.json" in line]
    assert len(taken) == 1 and f"takes {len(qat.load_ranges(out / 'ranges.json'))} " in taken[0]
    # the fused graph: int8's attention keeps the tail allowance, no max bound
    assert manifest.models["int8"].attention.thresholds == DEFAULT_THRESHOLDS["int8"]


def test_pronouns_per_head_qat_exports_int8_with_each_heads_own_ranges(
    pronouns_run, tmp_path, figure
):
    """The lesson's per-head graph fine-tuned with rounding (3 epochs, the default
    pronouns model): every head has its own points in ranges.json, and int8
    verifies under the thresholds every int8 model has. It starts from the
    default run's trained weights (`--start`, computed per head: the same
    variables): the command `keras-mha-train --start RUN --qat 3 --attention
    per_head`, instead of training the model again; the start is named and
    left as it was.

    What holds on any CPU, and why: int8 may change at most
    changes_allowed(1500) = 25 of the float model's 1,500 predictions (the 1 %
    rule, bundle_contract/parity.py) of a converged model (test accuracy
    >= 0.99 on every machine measured); started from the default run it
    changed none on Intel Xeon (2026-12-07: oneDNN on, off, capped at AVX2).
    Its attention keeps int8's tail allowance: at most 1 % of a layer's rows
    beyond 64 quanta (none there). The max |Δ| is not asserted: a few rows
    the float model puts most of its weight on decide it, and they move with
    the kernels (0.122-0.147 on those three; 0.25-0.28 on Intel and 0.93 on
    an AMD EPYC when this model was trained per head from scratch,
    docs/quantization.md).
    """
    from keras_mha.train.cli import main as train_main
    from keras_mha_export.bundle import export_bundle

    run = tmp_path / "pronouns"
    started = json.loads((pronouns_run / "metrics.json").read_text())
    argv = ["--start", str(pronouns_run), "--qat", "3", "--attention", "per_head"]
    assert train_main([*argv, "--out", str(run), "--quiet"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["start"]["run"] == str(pronouns_run)
    assert len(metrics["start"]["model_sha256"]) == 64
    assert metrics["history"] == started["history"]  # its training is the start's
    assert metrics["qat"]["epochs"] == 3 and metrics["config"]["implementation"] == "per_head"
    assert json.loads((pronouns_run / "metrics.json").read_text()) == started  # untouched
    # before the rounding, the per-head graph gave the fused run's own test accuracy
    assert metrics["qat"]["test_accuracy_float_before"] == pytest.approx(started["test_accuracy"])
    ranges = qat.load_ranges(run / "ranges.json")
    for block in range(2):  # the preset: 2 blocks of 4 heads
        for i in range(4):
            for point in ("query", "key", "value", "scores", "weights"):
                assert f"transformer_layer_{block}/attention/{point}_{i}" in ranges
    manifest = export_bundle(run, tmp_path / "bundle", "int8", log=lambda line: None)
    entry = manifest.models["int8"]
    attention = entry.attention.parity
    figure("test_accuracy", metrics["test_accuracy"], ">= 0.9")
    figure("int8 agreement", entry.parity.agreement, f">= {entry.thresholds.min_agreement:.4f}")
    figure("int8 attention max |Δ|", attention.max_abs_diff, "reported, not bounded")
    figure("int8 attention rows beyond 64 q", attention.tail_share, "<= 0.01 a layer")
    assert entry.verified and metrics["test_accuracy"] >= 0.9
    assert entry.attention.thresholds == DEFAULT_THRESHOLDS["int8"]
    assert attention.tail_share <= 0.01
    assert entry.attention.faithful is True, entry.attention.misses()  # every int8 bound


def test_a_foreign_ranges_file_is_refused_in_one_line(pronouns_qat, tmp_path):
    import shutil

    from keras_mha_export.cli import main as export_main

    out, _ = pronouns_qat
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    (copy / "ranges.json").write_text(json.dumps({"ranges": {"other/query": [-1, 1]}}))
    assert export_main([str(copy), "--out", str(tmp_path / "b"), "--quant", "int8"]) == 2
    assert not (tmp_path / "b").exists()


def test_ranges_of_another_attention_graph_are_refused_in_one_line(pronouns_qat, tmp_path, capsys):
    """The fused run's ranges given to the same model computed per head (the
    lesson's path): its per-head points have none, the fused names no point."""
    import shutil

    from keras_mha.model import encoder_blocks
    from keras_mha.rundir.reading import load_keras_model
    from keras_mha_export.cli import main as export_main

    out, _ = pronouns_qat
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    model = load_keras_model(copy / "model.keras")
    for block in encoder_blocks(model):
        block.implementation = block.attention.implementation = "per_head"
    model.save(copy / "model.keras")
    capsys.readouterr()
    assert export_main([str(copy), "--out", str(tmp_path / "b"), "--quant", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "name no point of the model's graph" in err[0], err
    assert "attention/query'" in err[0] or "attention/key'" in err[0], err
    assert not (tmp_path / "b").exists()


def test_distillation_sentences_come_from_the_calibration_only():
    calibration = np.array([[101, 5, 6, 7, 8, 102, 0], [101, 9, 10, 102, 0, 0, 0]], "int32")
    ids = distillation_ids(calibration, 50, seed=0)
    assert ids.shape == (50, calibration.shape[1]) and ids.dtype == np.int32
    for row in ids:
        row = row[: int((row != 0).sum())]  # 0-padded at the end
        assert row[0] == 101 and row[-1] == 102
        assert set(row[1:-1].tolist()) <= {5, 6, 7, 8, 9, 10}
    assert len({tuple(r) for r in ids}) > 5  # spans and joins, not only the two


def test_keras_mha_qat_distils_an_encoder_run(tmp_path, capsys):
    from keras_mha.rundir.embedding import read_embedding_run

    source = write_tiny_run(random_encoder(seed=2), tmp_path / "run").path
    out = tmp_path / "qat"
    args = [str(source), "--out", str(out), "--steps", "6", "--batch-size", "4"]
    assert main(args) == 0
    run = read_embedding_run(out)
    report = json.loads((out / "metrics.json").read_text())["qat"]
    assert report["sentences"] == 24 and len(report["loss"]) == 1
    # six steps at 2e-5 barely move the float student (measured: min cosine 1.0000)
    assert report["eval_float"]["min_cosine"] > 0.99
    assert 0.5 < report["eval_with_rounding"]["min_cosine"] <= 1.0 + 1e-6
    # the eval reference stays the float encoder's vectors
    np.testing.assert_array_equal(run.eval.probs, read_embedding_run(source).eval.probs)
    ranges = qat.load_ranges(out / "ranges.json")
    assert report["ranges"] == len(ranges)
    assert any(key.endswith("attention/masked_scores") for key in ranges)
    # an encoder command refuses a classifier run, in one line
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("keras-mha-qat: error:")
