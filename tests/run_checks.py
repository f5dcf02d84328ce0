"""Helpers of the training and head-analysis tests: run a command, check a run directory."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

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


def run_module(
    module: str,
    args: list[str],
    cwd: pathlib.Path = REPO,
    prelude: str = "",
    env: dict | None = None,
    **kwargs,
) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` in a fresh process; with `prelude`, that code runs
    first and then `MODULE.cli.main(ARGS)`. `env` replaces the environment."""
    if prelude:
        code = f"{prelude}\nimport sys\nfrom {module}.cli import main\nsys.exit(main({args!r}))"
        command = [sys.executable, "-c", code]
    else:
        command = [sys.executable, "-m", module, *args]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"} if env is None else env
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, check=False, **kwargs
    )


def assert_answered_without_tensorflow(module: str, args: list[str], status: int) -> str:
    """`MODULE.cli.main(ARGS)` in a fresh process (no TF_CPP_MIN_LOG_LEVEL set) exits
    with `status` and never imports TensorFlow or Keras; returns its stdout."""
    code = (
        f"import sys\nfrom {module}.cli import main\nstatus = main(sys.argv[1:])\n"
        "print('imported:', sorted({'tensorflow', 'keras'} & set(sys.modules)))\nsys.exit(status)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == status, done.stderr
    assert "imported: []" in done.stdout, (args, done.stdout[-300:])
    assert len(done.stderr.strip().splitlines()) == (0 if status == 0 else 1), done.stderr
    return done.stdout


def assert_one_line_error(status: int, stderr: str, pattern: str, prog: str) -> None:
    lines = stderr.strip().splitlines()
    assert status == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"{prog}: error: "), stderr
    assert re.search(pattern, lines[0]), lines[0]


def exit_code(main, argv: list[str]) -> int:
    """`main(argv)`, with argparse's SystemExit turned into its code."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def check_run(run: pathlib.Path, dataset: str) -> dict:
    """Artifacts complete and consistent (docs/artifacts.md); returns metrics."""
    import keras

    from keras_mha import data
    from keras_mha.rundir import read_run

    expected = RUN_FILES | ({"vocab.json"} if dataset == "pronouns" else set())
    assert {p.name for p in run.iterdir()} == expected
    read_run(run)  # the one reader accepts it
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
