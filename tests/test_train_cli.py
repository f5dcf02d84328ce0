"""keras-mha-train's command line: one-line errors (exit 2), Ctrl-C (130), quiet, fast help."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from run_checks import (
    REPO,
    assert_answered_without_tensorflow,
    assert_one_line_error,
    exit_code,
    run_module,
)

from keras_mha.train.cli import main, progress_verbosity

PROG = "keras-mha-train"
TINY = ["--d-model", "8", "--num-heads", "2", "--ff-dim", "8", "--quiet"]
# TensorFlow's start-up banner and its C++ log lines (absl format: E0000 00:00:...).
TF_LOG_MARKERS = ("I0000 ", "W0000 ", "E0000 ", "absl::InitializeLog", "cpu_feature_guard")


def fails(argv: list[str], pattern: str, capsys) -> None:
    status = exit_code(main, argv)
    assert_one_line_error(status, capsys.readouterr().err, pattern, PROG)


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--dataset", "mnist"], r"invalid choice: 'mnist'"),
        (["--d-model", "30", "--num-heads", "4"], r"d_model must be divisible by num_heads"),
        (["--epochs", "0"], r"argument --epochs: expected a positive integer, got 0"),
        (["--epochs", "-3"], r"argument --epochs: expected a positive integer, got -3"),
        (["--epochs", "ten"], r"argument --epochs: expected a positive integer, got 'ten'"),
        (["--num-heads", "0"], r"argument --num-heads: expected a positive integer"),
        (["--distribute", "tpu"], r"invalid choice: 'tpu'"),
        (["--dropout", "1.5"], r"dropout"),
        (["--learning-rate", "nan"], r"learning_rate must be positive"),
        (["--dataset", "pronouns", "--augment"], r"Shift augmentation is for images"),
        (["--seed", "-1"], r"argument --seed: expected an integer >= 0"),
        (
            ["--d-model", "100000"],
            r"model too large to train here: d_model 100000, .*TB to train; .* available",
        ),
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
        "learning-rate-nan",
        "augment-text",
        "negative-seed",
        "out-of-memory-model",
    ],
)
def test_bad_arguments(args, pattern, tmp_path, capsys):
    fails([*args, "--out", str(tmp_path / "run")], pattern, capsys)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    fails(["--out", str(out)], r"exists and is not empty; pass --overwrite", capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert (out / "metrics.json").read_text() == "{}"


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("keep me")
    fails(["--out", str(out), "--overwrite"], r"not a run directory", capsys)
    assert (out / "todo.txt").read_text() == "keep me"


@pytest.mark.parametrize("where", ["under-a-file", "is-a-file"])
def test_unwritable_output(where, tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    out = blocker / "run" if where == "under-a-file" else blocker
    pattern = r"is not a directory"
    fails(["--out", str(out)], pattern, capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]


def test_read_only_output(read_only_dir, capsys):
    fails(
        ["--out", str(read_only_dir / "run"), *TINY],
        r"--out .*/ro/run: cannot write in .*/ro \(Read-only file system\)",
        capsys,
    )


@pytest.fixture(scope="module")
def tiny_pronouns(tmp_path_factory):
    """A pronouns run of a tiny model, one epoch: a run --start can name."""
    run = tmp_path_factory.mktemp("start") / "pronouns"
    assert main(["--dataset", "pronouns", *TINY, "--epochs", "1", "--out", str(run)]) == 0
    return run


@pytest.mark.parametrize(
    "extra, pattern",
    [
        ([], r"--start: needs --qat EPOCHS: the run's model is trained already"),
        (["--qat", "1", "--epochs", "2"], r"--epochs: comes from the run --start names"),
        (["--qat", "1", "--d-model", "16"], r"--d-model: comes from the run --start names"),
        (
            ["--qat", "1", "--from", "all-MiniLM-L6-v2", "--data", "my.csv"],
            r"--start: is for a classifier trained from scratch, not with --from",
        ),
    ],
    ids=["no-qat", "epochs", "model", "with-from"],
)
def test_start_refuses_what_the_run_decides(extra, pattern, tmp_path, capsys):
    """Before the run is read (--dataset given, so none is needed to name it)."""
    argv = ["--start", str(tmp_path / "none"), "--dataset", "pronouns", *extra]
    fails([*argv, "--out", str(tmp_path / "q")], pattern, capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "extra, pattern",
    [
        (["--dataset", "digits"], r"is a pronouns run; expected a digits run"),
        (["--seed", "3"], r"--seed: the run --start names was trained with seed 0"),
    ],
    ids=["dataset", "seed"],
)
def test_start_refuses_a_run_of_another_dataset_or_seed(
    tiny_pronouns, extra, pattern, tmp_path, capsys
):
    argv = ["--start", str(tiny_pronouns), "--qat", "1", *extra, "--out", str(tmp_path / "q")]
    fails(argv, pattern, capsys)
    assert list(tmp_path.iterdir()) == []


def test_start_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    fails(
        ["--start", str(tmp_path / "none"), "--qat", "1"], r"does not exist; expected a run", capsys
    )
    assert list(tmp_path.iterdir()) == []


def test_start_writes_beside_the_run_by_default(tiny_pronouns, capsys):
    """Without --out, --start RUN writes RUN_qat: a folder there is refused, not
    replaced, before any training (tests/test_qat_runs.py runs the command)."""
    beside = tiny_pronouns.parent / "pronouns_qat"
    beside.mkdir()
    (beside / "notes.txt").write_text("mine")
    fails(
        ["--start", str(tiny_pronouns), "--qat", "1"],
        r"pronouns_qat: exists and is not empty",
        capsys,
    )
    assert [p.name for p in beside.iterdir()] == ["notes.txt"]


def test_help_and_argument_errors_do_not_import_tensorflow():
    """Answered from argparse alone: no TensorFlow, no Keras (fast, quiet)."""
    help_text = assert_answered_without_tensorflow("keras_mha.train", ["--help"], 0)
    assert "--d-model" in help_text and "Defaults per dataset" in help_text
    assert "--qat EPOCHS" in help_text and "{fused,per_head}" in help_text
    for args in (
        ["--epochs", "ten"],
        ["--dataset", "x"],
        ["--seed", "-2"],
        ["--qat", "-1"],
        ["--attention", "both"],
    ):
        assert_answered_without_tensorflow("keras_mha.train", args, 2)


@pytest.mark.slow
def test_training_stderr_has_no_tensorflow_logs(tmp_path):
    """TF_CPP_MIN_LOG_LEVEL=3 is set before TensorFlow loads: no banner, no E0000 lines."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = run_module(
        "keras_mha.train",
        ["--epochs", "1", *(a for a in TINY if a != "--quiet"), "--out", str(tmp_path / "r")],
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = [
        line[:120] for line in done.stderr.splitlines() if any(m in line for m in TF_LOG_MARKERS)
    ]
    assert not found, found
    # stdout is a pipe here, as in a log: one line per epoch, no progress bar
    epoch_lines = [line for line in done.stdout.splitlines() if " - loss: " in line]
    assert len(epoch_lines) == 1 and epoch_lines[0].startswith("102/102 - "), done.stdout
    assert "━" not in done.stdout and "\r" not in done.stdout and "\b" not in done.stdout


def test_progress_bar_only_on_a_terminal(tmp_path):
    class Terminal:
        def isatty(self):
            return True

    with open(tmp_path / "log", "w") as log:
        assert progress_verbosity(False, log) == 2  # a file: a line per epoch
    assert progress_verbosity(False, Terminal()) == 1
    assert progress_verbosity(True, Terminal()) == 0
    assert progress_verbosity(False, object()) == 2  # no isatty at all


@pytest.mark.slow
def test_ctrl_c_is_one_line_exit_130_and_leaves_nothing(tmp_path):
    out = tmp_path / "run"
    args = ["--epochs", "200", "--patience", "200", *TINY, "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_mha.train", *args],
        cwd=REPO,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The staging directory appears once the settings are checked; then the data
    # loads and training starts. Interrupt while it trains.
    for _ in range(1200):
        if list(tmp_path.glob(".run.*")) or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    assert stderr.strip().splitlines() == [f"{PROG}: interrupted"], stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # neither the run nor its staging directory


@pytest.mark.parametrize("kind", ["MemoryError", "ResourceExhaustedError"])
def test_out_of_memory_while_training_is_one_line(kind, tmp_path, capsys, monkeypatch):
    """Where the estimate cannot tell, running out of memory is still bad input, exit 2."""
    import tensorflow as tf

    from keras_mha import model as model_module

    def too_big(*args, **kwargs):
        if kind == "MemoryError":
            raise MemoryError("Unable to allocate 745. GiB for an array")
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor\nshape")

    monkeypatch.setattr(model_module, "build_classifier", too_big)
    fails(["--out", str(tmp_path / "run"), "--epochs", "1", *TINY], r"out of memory", capsys)
    assert list(tmp_path.iterdir()) == []
