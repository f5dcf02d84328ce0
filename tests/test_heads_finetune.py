"""Fine-tuning after pruning: keeps the start when nothing beats it; same machine, same model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_mha import heads
from keras_mha.heads.cli import main
from keras_mha.rundir import read_run


@pytest.mark.slow
def test_finetuned_pruning_is_deterministic_across_processes(augmented_run, tmp_path, figure):
    """Exact equality between two processes on this machine (never across CPUs)."""
    argv = ["prune", str(augmented_run), "--fraction", "0.5", "--split", "validation"]
    finetune = ["--finetune-epochs", "2"]
    assert main([*argv, *finetune, "--out", str(tmp_path / "a")]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha.heads", *argv, *finetune, "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert main([*argv, "--out", str(tmp_path / "c")]) == 0  # no fine-tune
    pruning = [json.loads((tmp_path / n / "metrics.json").read_text())["pruning"] for n in "abc"]
    assert pruning[0]["removed"] == pruning[1]["removed"] == pruning[2]["removed"]
    with np.load(tmp_path / "a" / "eval.npz") as a, np.load(tmp_path / "b" / "eval.npz") as b:
        np.testing.assert_array_equal(a["probs"], b["probs"])
        # The fine-tune changed the model: 2 epochs on a 3-epoch run improve its
        # validation loss on any CPU (else the start is kept and a == c).
        with np.load(tmp_path / "c" / "eval.npz") as c:
            moved = figure(
                "max |Δp| fine-tuned vs not", np.abs(a["probs"] - c["probs"]).max(), "> 1e-3"
            )
            assert moved > 1e-3
    assert pruning[0]["importance_split"] == "validation"
    assert pruning[0]["finetune_epochs"] == 2 and pruning[0]["finetune_learning_rate"] == 5e-4
    assert pruning[0]["finetune"] == pruning[1]["finetune"]
    assert pruning[2]["finetune"] is None
    assert pruning[0]["test_accuracy_finetuned"] == pruning[1]["test_accuracy_finetuned"]
    assert pruning[2]["test_accuracy_finetuned"] is None
    drop = pruning[0]["test_drop"]  # of the fine-tuned model against the source run
    expected = 100 * (pruning[0]["test_accuracy_before"] - pruning[0]["test_accuracy_finetuned"])
    assert drop["points"] == pytest.approx(expected, abs=1e-9)
    assert drop["lost"] - drop["gained"] == round(expected * drop["examples"] / 100)
    assert drop["ci95_points"][0] <= drop["points"] <= drop["ci95_points"][1]
    read_run(tmp_path / "a")  # a pruned run is a run directory like any other
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.slow
def test_finetune_keeps_the_start_when_no_epoch_beats_it(augmented_run, figure):
    run = read_run(augmented_run)
    model, data = run.load_model(), run.load_dataset()
    start = [w.copy() for w in model.get_weights()]
    # A learning rate of 5 wrecks every epoch on any CPU: the starting weights stay.
    result = heads.finetune(model, data, run.metrics, epochs=1, learning_rate=5.0)
    assert result["improved"] is False and result["best_epoch"] == 0
    assert result["best_val_loss"] == result["start_val_loss"]
    for now, before in zip(model.get_weights(), start):
        np.testing.assert_array_equal(now, before)
    # The 3-epoch run is far from converged: its validation loss went 1.45, 1.12,
    # 1.05 on AMD EPYC (2.3 at chance), still falling. Two more gentle epochs
    # lower it on any CPU; rounding does not turn a falling loss around.
    result = heads.finetune(model, data, run.metrics, epochs=2, learning_rate=1e-3)
    figure("val loss best/start", result["best_val_loss"] / result["start_val_loss"], "< 1")
    assert result["improved"] is True and result["best_epoch"] in (1, 2)
    assert result["best_val_loss"] < result["start_val_loss"]
    loss = model.evaluate(data.x_val, data.y_val, verbose=0)[0]
    assert loss == pytest.approx(result["best_val_loss"], rel=1e-4)


def test_finetune_refuses_no_epochs():
    with pytest.raises(ValueError, match="epochs >= 1"):
        heads.finetune(None, None, {}, epochs=0)
