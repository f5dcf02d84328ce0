"""keras-mha-heads's commands on a trained run, and their one-line errors."""

from __future__ import annotations

import json
import os
import re
import shutil

import keras
import numpy as np
import pytest
from run_checks import assert_answered_without_tensorflow

from keras_mha import heads
from keras_mha.heads.cli import main
from keras_mha.model import forward
from keras_mha.rundir import read_run


@pytest.mark.slow
def test_cli_importance_curve_prune_plot(digits_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(digits_run, run)
    assert main(["importance", str(run)]) == 0
    result = json.loads((run / "heads" / "importance.json").read_text())
    n_heads = sum(heads.heads_per_layer(keras.saving.load_model(run / "model.keras")))
    assert len(result["heads"]) == n_heads
    for row in result["heads"]:
        assert 0.0 <= row["accuracy_without"] <= 1.0
        assert row["importance"] >= 0.0
    assert (run / "heads" / "importance.png").stat().st_size > 1000

    assert main(["curve", str(run), "--step", "0.5"]) == 0
    curve = json.loads((run / "heads" / "curve.json").read_text())["points"]
    assert curve[0]["fraction"] == 0.0
    assert curve[0]["accuracy"] == pytest.approx(result["test_accuracy"])
    fractions = [p["fraction"] for p in curve]
    assert fractions == sorted(set(fractions)) and fractions[-1] < 1.0
    # Reconstructing a model with nothing removed changes nothing.
    assert curve[0]["accuracy_reconstructed"] == pytest.approx(curve[0]["accuracy"])
    assert all(0.0 <= p["accuracy_reconstructed"] <= 1.0 for p in curve)

    out = tmp_path / "pruned"
    assert main(["prune", str(run), "--fraction", "0.5", "--out", str(out)]) == 0
    pruned_run = read_run(out)  # the one reader accepts the pruned run
    # the source's importance bars, with the removed heads marked
    assert (out / "heads" / "importance_removed.png").stat().st_size > 1000
    metrics = pruned_run.metrics
    assert metrics["pruning"]["heads_after"] == [n_heads - 1]
    assert pruned_run.config.heads_per_layer() == [n_heads - 1]  # the stored config is the new one
    assert metrics["pruning"]["params_after"] < metrics["pruning"]["params_before"]
    assert metrics["num_params"] == metrics["pruning"]["params_after"]
    assert metrics["test_accuracy"] == pytest.approx(
        metrics["pruning"]["test_accuracy_reconstructed"]
    )
    assert metrics["pruning"]["reconstruction"] == {
        "split": "train",
        "examples": metrics["samples"]["train"],
        "ridge": heads.RIDGE,
    }
    with np.load(out / "eval.npz") as ev, np.load(run / "eval.npz") as src:
        np.testing.assert_array_equal(ev["x"], src["x"])
        pruned_model = pruned_run.load_model()
        np.testing.assert_allclose(np.asarray(pruned_model(ev["x"])), ev["probs"], atol=1e-6)
        assert metrics["test_accuracy"] == pytest.approx(
            float((ev["probs"].argmax(-1) == ev["y"]).mean())
        )
    source_run = read_run(run)
    np.testing.assert_array_equal(pruned_run.calibration, source_run.calibration)
    assert pruned_run.labels == source_run.labels

    # Without reconstruction the pruned model is the original with the head masked.
    plain = tmp_path / "plain"
    assert (
        main(["prune", str(run), "--fraction", "0.5", "--no-reconstruct", "--out", str(plain)]) == 0
    )
    pruning = json.loads((plain / "metrics.json").read_text())["pruning"]
    assert pruning["reconstruction"] is None and pruning["test_accuracy_reconstructed"] is None
    assert pruning["removed"] == metrics["pruning"]["removed"]
    (layer, head) = pruning["removed"][0]
    head_masks = [np.ones(n_heads, "float32")]
    head_masks[layer][head] = 0.0
    original = keras.saving.load_model(run / "model.keras")
    with np.load(plain / "eval.npz") as ev:
        masked = np.asarray(forward(original, ev["x"], head_masks=head_masks))
        np.testing.assert_allclose(ev["probs"], masked, atol=1e-5)
        with np.load(out / "eval.npz") as reconstructed:
            assert np.abs(reconstructed["probs"] - ev["probs"]).max() > 1e-3

    assert main(["plot", str(run), "--sample", "2"]) == 0
    assert (run / "heads" / "heads_sample2.png").stat().st_size > 1000


@pytest.mark.slow
def test_view_page_holds_the_keras_models_attention(digits_run, tmp_path):
    """`view` writes the head-view page from the float model: its data is forward()'s."""
    out = tmp_path / "view.html"
    assert main(["view", str(digits_run), "--sample", "5", "--out", str(out)]) == 0
    page = out.read_text()
    start = page.index('<script type="application/json" id="attention-data">')
    payload = page[page.index(">", start) + 1 : page.index("</script>", start)]
    data = json.loads(payload)
    run = read_run(digits_run)
    probs, scores = forward(run.load_model(), run.eval.x[5:6], return_attention_scores=True)
    assert data["mode"] == "keras" and len(data["device"]) == len(scores)
    for shown, expected in zip(data["device"], scores):
        # the page keeps 4 decimals of each weight
        np.testing.assert_allclose(np.array(shown), np.asarray(expected)[0], atol=6e-5)
    assert data["prediction"]["index"] == int(np.asarray(probs)[0].argmax())
    assert data["tokens"] == [f"row {i}" for i in range(run.eval.x.shape[1])]
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?:", page)  # nothing from the network


def test_view_bad_sample_is_one_line(digits_run, tmp_path, capsys):
    out = tmp_path / "view.html"
    assert main(["view", str(digits_run), "--sample", "100000", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--sample must be in [0, " in err
    assert not out.exists()


@pytest.mark.slow
def test_importance_and_curve_on_either_split(augmented_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(augmented_run, run)
    assert main(["importance", str(run)]) == 0  # the training split by default
    on_train = json.loads((run / "heads" / "importance.json").read_text())
    assert main(["importance", str(run), "--split", "validation"]) == 0
    on_val = json.loads((run / "heads" / "importance.json").read_text())
    sizes = json.loads((run / "metrics.json").read_text())["samples"]
    assert (on_train["split"], on_val["split"]) == ("train", "validation")
    # The training split as drawn, not the 5x larger augmented set.
    assert sizes["train_augmented"] == 5 * sizes["train"]
    assert (on_train["split_size"], on_val["split_size"]) == (sizes["train"], sizes["validation"])
    train_scores = [r["importance"] for r in on_train["heads"]]
    val_scores = [r["importance"] for r in on_val["heads"]]
    assert not np.allclose(train_scores, val_scores, atol=1e-4)
    # Files a user can share: a normal file's mode, not a temp file's 0600.
    umask = os.umask(0)
    os.umask(umask)
    assert (run / "heads" / "importance.json").stat().st_mode & 0o777 == 0o666 & ~umask

    argv = ["curve", str(run), "--split", "validation", "--step", "0.5", "--no-reconstruct"]
    assert main(argv) == 0
    curve = json.loads((run / "heads" / "curve.json").read_text())
    assert curve["split"] == "validation" and curve["reconstruction"] is None
    assert all("accuracy_reconstructed" not in p for p in curve["points"])
    assert curve["points"][0]["accuracy"] == pytest.approx(on_train["test_accuracy"])


@pytest.mark.slow
def test_cli_bad_input(digits_run, tmp_path, capsys):
    def fails(argv, match):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith("keras-mha-heads") and "error: " in err and match in err, err

    fails(["importance", str(tmp_path / "nope")], "does not exist; expected a run directory")
    fails(["prune", str(digits_run)], "required: --fraction, --out")
    fails(["importance", str(digits_run), "--split", "test"], "invalid choice: 'test'")
    fails(["plot", str(digits_run), "--sample", "-1"], "expected an integer >= 0")
    fails(
        ["prune", str(digits_run), "--fraction", "0.5", "--finetune-lr", "0", "--out", "o"],
        "--finetune-lr must be > 0",
    )
    fails(["prune", str(digits_run), "--fraction", "1.0", "--out", str(tmp_path / "o")], "[0, 1)")
    fails(["prune", str(digits_run), "--fraction", "-0.1", "--out", str(tmp_path / "o")], "[0, 1)")
    fails(
        ["prune", str(digits_run), "--fraction", "0.9", "--out", str(tmp_path / "o")],
        "is 2 of 2 heads, which would leave a layer with no head",
    )
    assert not (tmp_path / "o").exists()
    assert not list(tmp_path.glob(".o.*"))  # no half-written temp dir left
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    fails(
        ["prune", str(digits_run), "--fraction", "0.5", "--out", str(tmp_path / "full")],
        "pass --overwrite",
    )
    assert (tmp_path / "full" / "x").read_text() == "keep"
    fails(
        ["prune", str(digits_run), "--fraction", "0.5", "--out", str(digits_run)],
        "must differ from the source run",
    )
    fails(["plot", str(digits_run), "--sample", "100000"], "--sample must be in")

    # A run whose eval.npz holds log-probabilities, not probabilities.
    bad = tmp_path / "bad"
    shutil.copytree(digits_run, bad)
    with np.load(bad / "eval.npz") as ev:
        arrays = dict(ev)
    np.savez(bad / "eval.npz", **{**arrays, "probs": np.log(arrays["probs"] + 1e-9)})
    fails(["importance", str(bad)], "eval.npz: probs has negative values")

    # A run whose model has no keras_mha attention.
    plain = tmp_path / "plain"
    shutil.copytree(digits_run, plain)
    inputs = keras.Input((8, 8))
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))
    model.save(plain / "model.keras")
    fails(["importance", str(plain)], "no TransformerEncoderBlock")
    (plain / "model.keras").write_bytes(b"not a zip")
    fails(["importance", str(plain)], "cannot load the model")


def test_help_does_not_import_tensorflow():
    assert "importance" in assert_answered_without_tensorflow("keras_mha.heads", ["--help"], 0)
    assert_answered_without_tensorflow("keras_mha.heads", ["prune", "--help"], 0)
    assert_answered_without_tensorflow("keras_mha.heads", ["prune", "r"], 2)


def test_read_only_outputs_are_refused_before_any_work(read_only_dir, tmp_path, capsys):
    for argv in (
        [
            "prune",
            str(tmp_path / "no-run-needed"),
            "--fraction",
            "0.5",
            "--out",
            str(read_only_dir / "p"),
        ],
        ["plot", str(tmp_path), "--out", str(read_only_dir / "x.png")],
    ):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "(Read-only file system)" in err, err
