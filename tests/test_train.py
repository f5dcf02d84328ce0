"""keras-mha-train: what a run directory holds, that the model learns, bad input."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from keras_mha import data, fsutil, train

REPO = pathlib.Path(__file__).resolve().parents[1]
RUN_FILES = {
    "model.keras",
    "metrics.json",
    "eval.npz",
    "calibration.npz",
    "labels.json",
    "training_curves.png",
    "attention_heads.png",
}
METRIC_KEYS = {
    "dataset",
    "seed",
    "config",
    "test_accuracy",
    "per_class_accuracy",
    "num_params",
    "train_seconds",
    "epochs_run",
    "versions",
}
# A small, fast text model (for determinism; it does not learn in 2 epochs).
TINY_PRONOUNS = ["--d-model", "16", "--num-heads", "2", "--num-layers", "2", "--ff-dim", "32"]


def run_cli(
    args: list[str], cwd: pathlib.Path = REPO, prelude: str = ""
) -> subprocess.CompletedProcess:
    """`python -m keras_mha.train ARGS` in a fresh process; with `prelude`, that
    code runs first and then `main(ARGS)`."""
    if prelude:
        code = f"{prelude}\nimport sys\nfrom keras_mha.train import main\nsys.exit(main({args!r}))"
        command = [sys.executable, "-c", code]
    else:
        command = [sys.executable, "-m", "keras_mha.train", *args]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def assert_one_line_error(status: int, stderr: str, pattern: str) -> None:
    lines = stderr.strip().splitlines()
    assert status == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("keras-mha-train: error: "), stderr
    assert re.search(pattern, lines[0]), lines[0]


def check_run(run: pathlib.Path, dataset: str) -> dict:
    """Artifacts complete and consistent (docs/artifacts.md); returns metrics."""
    import keras

    expected = RUN_FILES | ({"vocab.json"} if dataset == "pronouns" else set())
    assert {p.name for p in run.iterdir()} == expected
    metrics = json.loads((run / "metrics.json").read_text())
    assert METRIC_KEYS <= set(metrics)
    assert metrics["dataset"] == dataset
    assert set(metrics["versions"]) >= {"keras_mha", "tensorflow", "keras", "numpy", "python"}
    labels = json.loads((run / "labels.json").read_text())
    assert len(labels) == metrics["config"]["num_classes"] == len(metrics["per_class_accuracy"])
    history = metrics["history"]
    assert metrics["epochs_run"] == len(history["loss"]) >= metrics["best_epoch"]
    # Early stopping kept the weights of the epoch with the lowest validation loss.
    assert metrics["best_epoch"] == int(np.argmin(history["val_loss"])) + 1
    best = metrics["best_epoch"] - 1
    assert metrics["validation_accuracy"] == pytest.approx(history["val_accuracy"][best])
    assert metrics["train_seconds"] > 0

    with np.load(run / "eval.npz", allow_pickle=False) as npz:
        x, y, probs = npz["x"], npz["y"], npz["probs"]
        extra = {k: npz[k] for k in npz.files if k not in ("x", "y", "probs")}
    with np.load(run / "calibration.npz", allow_pickle=False) as npz:
        calibration = npz["x"]
    config = metrics["config"]
    if dataset == "digits":
        assert x.dtype == np.float32 and x.shape[1:] == (8, 8)
    else:
        assert x.dtype == np.int32 and x.shape[1:] == (config["sequence_length"],)
    assert y.dtype == np.int32 and y.shape == (len(x),)
    assert probs.dtype == np.float32 and probs.shape == (len(x), len(labels))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    accuracy = (probs.argmax(-1) == y).mean()
    assert metrics["test_accuracy"] == pytest.approx(accuracy)
    for c, value in enumerate(metrics["per_class_accuracy"]):
        assert value == pytest.approx((probs.argmax(-1) == y)[y == c].mean())

    # Calibration: >= 200 inputs from the training split, none from the test split.
    ds = data.load_dataset(dataset, metrics["seed"])
    assert calibration.dtype == x.dtype and calibration.shape[1:] == x.shape[1:]
    assert len(calibration) >= 200
    train_rows = {row.tobytes() for row in ds.x_train}
    assert all(row.tobytes() in train_rows for row in calibration)
    np.testing.assert_array_equal(x, ds.x_test)
    np.testing.assert_array_equal(y, ds.y_test)

    # Reloading model.keras reproduces the parity reference.
    model = keras.saving.load_model(run / "model.keras")
    assert model.count_params() == metrics["num_params"]
    np.testing.assert_allclose(model.predict(x, verbose=0), probs, atol=1e-6, rtol=0)

    for name in ("training_curves.png", "attention_heads.png"):
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in run.parent.iterdir() if p.name.startswith(f".{run.name}.")]
    metrics["_extra"] = extra
    return metrics


# ----------------------------------------------------------- training runs
@pytest.mark.slow
def test_digits_run(digits_run):
    metrics = check_run(digits_run, "digits")
    assert metrics["test_accuracy"] >= 0.85  # chance: 0.10
    assert metrics["distribute"]["replicas"] == 1
    assert metrics["_extra"] == {}


@pytest.mark.slow
def test_pronouns_run(tmp_path):
    """The default text model learns the task; the run holds what the edge demo needs."""
    out = tmp_path / "pronouns"
    metrics = train.train("pronouns", out, epochs=20, batch_size=32, verbose=0)
    saved = check_run(out, "pronouns")
    assert saved["test_accuracy"] == metrics["test_accuracy"]
    assert metrics["test_accuracy"] >= 0.9  # chance: 0.4 (1/2 with two nouns, 1/3 with three)
    assert set(metrics["per_cue_accuracy"]) == set(data.CUES)
    assert min(metrics["per_structure_accuracy"].values()) >= 0.8
    cue, text = saved["_extra"]["cue"], saved["_extra"]["text"]
    with np.load(out / "eval.npz") as npz:
        x, y, probs = npz["x"], npz["y"], npz["probs"]
    correct = probs.argmax(-1) == y
    for name, value in metrics["per_cue_accuracy"].items():
        assert value == pytest.approx(correct[cue == name].mean())
    assert len(metrics["per_structure_accuracy"]) == len(data.STRUCTURES)
    for (name, nouns), value in zip(data.STRUCTURES, metrics["per_structure_accuracy"].values()):
        assert value == pytest.approx(
            correct[(cue == name) & (saved["_extra"]["nouns"] == nouns)].mean()
        )
    # vocab.json alone (plus `re`) turns the sentences back into the model's inputs.
    vocab = json.loads((out / "vocab.json").read_text())
    index = {t: i for i, t in enumerate(vocab["tokens"])}
    for sentence, ids in zip(text, x):
        words = re.findall(vocab["token_pattern"], sentence.lower())
        row = [index.get(w, vocab["unk_id"]) for w in words][: vocab["max_length"]]
        row += [vocab["pad_id"]] * (vocab["max_length"] - len(row))
        assert row == ids.tolist()


@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path):
    """Two runs in fresh processes with one seed agree exactly; the CLI's entry point."""
    args = ["--dataset", "pronouns", "--epochs", "2", *TINY_PRONOUNS, "--seed", "7", "--quiet"]
    results = []
    for name in ("a", "b"):
        proc = run_cli([*args, "--out", str(tmp_path / name)])
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


@pytest.mark.slow
def test_mirrored_strategy_on_two_cpu_devices(tmp_path):
    prelude = (
        "import tensorflow as tf\n"
        "cpu = tf.config.list_physical_devices('CPU')[0]\n"
        "tf.config.set_logical_device_configuration(\n"
        "    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
    )
    out = tmp_path / "mirrored"
    args = ["--dataset", "digits", "--epochs", "6", "--d-model", "16", "--num-heads", "2"]
    proc = run_cli(
        [*args, "--ff-dim", "32", "--distribute", "mirrored", "--quiet", "--out", str(out)],
        prelude=prelude,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = check_run(out, "digits")
    assert metrics["distribute"] == {"strategy": "mirrored", "replicas": 2}
    assert metrics["test_accuracy"] >= 0.6  # chance: 0.10


@pytest.mark.slow
def test_failed_run_leaves_nothing_behind(tmp_path, monkeypatch):
    from keras_mha import plots

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(plots, "save_attention_heads", broken)
    old = tmp_path / "old_run"
    old.mkdir()
    (old / "metrics.json").write_text('{"old": true}')
    tiny = {"d_model": 8, "num_heads": 2, "ff_dim": 8}
    with pytest.raises(RuntimeError, match="disk full"):
        train.train("digits", tmp_path / "new_run", epochs=1, verbose=0, **tiny)
    with pytest.raises(RuntimeError, match="disk full"):
        train.train("digits", old, epochs=1, verbose=0, overwrite=True, **tiny)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old_run"]
    assert [p.name for p in old.iterdir()] == ["metrics.json"]
    assert json.loads((old / "metrics.json").read_text()) == {"old": True}


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--dataset", "mnist"], r"invalid choice: 'mnist'"),
        (["--d-model", "30", "--num-heads", "4"], r"d_model must be divisible by num_heads"),
        (["--epochs", "0"], r"epochs must be a positive integer.*epochs=0"),
        (["--epochs", "-3"], r"epochs must be a positive integer.*epochs=-3"),
        (["--epochs", "ten"], r"argument --epochs: invalid int value"),
        (["--num-heads", "0"], r"num_heads"),
        (["--distribute", "tpu"], r"invalid choice: 'tpu'"),
        (["--dropout", "1.5"], r"dropout"),
        (["--dataset", "pronouns", "--augment"], r"Shift augmentation is for images"),
        (["--seed", "-1"], r"seed must be a non-negative integer"),
    ],
    ids=[
        "unknown-dataset",
        "d-model-not-divisible",
        "zero-epochs",
        "negative-epochs",
        "epochs-not-a-number",
        "zero-heads",
        "unknown-strategy",
        "dropout-too-big",
        "augment-text",
        "negative-seed",
    ],
)
def test_bad_arguments(args, pattern, tmp_path, capsys):
    out = tmp_path / "run"
    status = _main([*args, "--out", str(out)])
    assert_one_line_error(status, capsys.readouterr().err, pattern)
    assert list(tmp_path.iterdir()) == []


def _main(argv: list[str]) -> int:
    try:
        return train.main(argv)
    except SystemExit as exit_:  # argparse exits
        return exit_.code


def test_existing_output_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    status = _main(["--out", str(out)])
    assert_one_line_error(
        status, capsys.readouterr().err, r"exists and is not empty; pass --overwrite"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert (out / "metrics.json").read_text() == "{}"


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("keep me")
    status = _main(["--out", str(out), "--overwrite"])
    assert_one_line_error(status, capsys.readouterr().err, r"not a run directory")
    assert (out / "todo.txt").read_text() == "keep me"


@pytest.mark.parametrize("where", ["under-a-file", "is-a-file"])
def test_unwritable_output(where, tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    out = blocker / "run" if where == "under-a-file" else blocker
    status = _main(["--out", str(out)])
    pattern = r"Cannot write the run directory" if where == "under-a-file" else r"not a directory"
    assert_one_line_error(status, capsys.readouterr().err, pattern)
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]


def test_permission_denied(tmp_path, capsys, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fsutil.tempfile, "mkdtemp", denied)
    status = _main(["--out", str(tmp_path / "run")])
    assert_one_line_error(
        status, capsys.readouterr().err, r"Cannot write the run directory .*: Permission denied"
    )


def test_staging_is_renamed_over_an_old_run(tmp_path):
    old = tmp_path / "run"
    old.mkdir()
    (old / "metrics.json").write_text("old")
    staging = train._staging_dir(old, overwrite=True)
    assert staging.parent == tmp_path and staging.name.startswith(".run.")
    (staging / "metrics.json").write_text("new")
    train.swap_into_place(staging, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (old / "metrics.json").read_text() == "new"
    umask = os.umask(0o022)
    os.umask(umask)
    assert old.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0o700


def test_presets_are_valid_configs():
    for name in data.DATASETS:
        config, settings = train.resolve_settings(name)
        config.validate()
        assert settings.epochs > 0 and settings.patience > 0
    config, _ = train.resolve_settings("pronouns", model_options={"num_heads": 1})
    assert config.num_heads == 1 and config.d_model == train.PRESETS["pronouns"][0]["d_model"]
    with pytest.raises(train.UsageError, match="Unknown model option"):
        train.resolve_settings("digits", model_options={"sequence_length": 9})
