"""keras-mha-train: train the small transformer classifier and write a run directory.

    keras-mha-train [--dataset digits|pronouns] [--out DIR] [--epochs N]
                    [--num-heads H] [--d-model D] [--num-layers L] [--seed S]
                    [--distribute mirrored|data|heads] [--overwrite]
    keras-mha-train --start RUN --qat EPOCHS [--attention per_head] [--out DIR]
    keras-mha-train --from all-MiniLM-L6-v2 --data my.csv [--out DIR]
                    [--text-column text] [--label-column label] [--test-fraction 0.2]
                    [--distribute data|heads] [--checkpoint DIR]
                    [--processes N --process-id I --coordinator HOST:PORT]

On JAX, `--distribute data` or `heads` trains the first form over every
device of this process under keras.distribution (docs/distribution.md).
The second form fine-tunes a run trained before with int8's rounding in
the loop (quantization-aware training), instead of training it again: its
dataset, seed, model and settings are the run's; `--attention per_head`
gives each head its own int8 ranges (the weights are the same). The new run
(default `RUN_qat`) names the one it started from. The third form fine-tunes
a pretrained encoder on your labelled text (keras_mha/train/finetune.py): a
text-classification run, like an imported classifier's; on JAX, `--distribute
data` or `heads` trains it over every device (docs/distribution.md), and
with `--processes` over the devices of several processes or hosts
(keras_mha/train/job.py). `--checkpoint DIR` saves the training state after
every epoch; the same command run again resumes from it
(keras_mha/train/checkpoint.py).

The run directory (default `runs/<dataset>`) holds model.keras, metrics.json,
eval.npz, calibration.npz, labels.json, vocab.json (text datasets) and two
plots; docs/artifacts.md describes each file. The run is written into a
temporary directory beside DIR and renamed into place at the end, so a run
that fails or is interrupted leaves no half-written directory.

`--help` and argument errors are answered before TensorFlow is imported.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from bundle_contract.errors import EXIT_FAILED, Parser, nonnegative_int, positive_int, run_main
from bundle_contract.files import check_writable
from keras_mha.quiet_tensorflow import import_tensorflow
from keras_mha.train.presets import DISTRIBUTE, MESH_DISTRIBUTE, describe_presets

PROG = "keras-mha-train"
DATASETS = ("digits", "pronouns")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="Defaults per dataset -- " + describe_presets(),
    )
    parser.add_argument("--dataset", choices=DATASETS, default=None, help="(default: digits)")
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="run directory (default: runs/<dataset>)"
    )
    parser.add_argument(
        "--epochs", type=positive_int, default=None, help="most epochs (default: the dataset's)"
    )
    parser.add_argument(
        "--num-heads", type=positive_int, default=None, help="attention heads per layer"
    )
    parser.add_argument(
        "--d-model", type=positive_int, default=None, help="model width, divisible by the heads"
    )
    parser.add_argument("--num-layers", type=positive_int, default=None, help="encoder blocks")
    parser.add_argument("--ff-dim", type=positive_int, default=None, help="feed-forward size")
    parser.add_argument("--dropout", type=float, default=None, help="dropout rate, in [0, 1)")
    parser.add_argument(
        "--attention",
        choices=("fused", "per_head"),
        default=None,
        help="the attention's implementation: fused (default) or the lesson's per_head, "
        "whose heads get their own int8 ranges with --qat",
    )
    parser.add_argument("--batch-size", type=positive_int, default=None)
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument(
        "--patience", type=positive_int, default=None, help="early-stopping patience in epochs"
    )
    parser.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one-pixel shifted copies of the training images (digits; default: on)",
    )
    parser.add_argument(
        "--seed", type=nonnegative_int, default=0, help="split, weights, shuffling (default: 0)"
    )
    parser.add_argument(
        "--distribute",
        choices=(*DISTRIBUTE, *MESH_DISTRIBUTE),
        default=None,
        help="mirrored: a classifier from scratch under tf.distribute (TensorFlow); data "
        "or heads: over every device under keras.distribution (JAX; heads splits the "
        "attention heads, docs/distribution.md)",
    )
    parser.add_argument(
        "--qat",
        type=nonnegative_int,
        default=0,
        metavar="EPOCHS",
        help="then fine-tune EPOCHS epochs with int8's rounding in the loop (keras_mha.qat); "
        "the run gets ranges.json for its int8 export (default: 0, none)",
    )
    parser.add_argument(
        "--start",
        type=pathlib.Path,
        default=None,
        metavar="RUN",
        help="with --qat: fine-tune RUN's trained classifier with rounding instead of training "
        "a new one (its dataset, seed, model and settings; --attention may differ)",
    )
    tune = parser.add_argument_group("fine-tuning a pretrained encoder on your labels")
    tune.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="CHECKPOINT",
        help="a checkpoint keras-mha-import takes (all-MiniLM-L6-v2 or a directory)",
    )
    tune.add_argument(
        "--data", type=pathlib.Path, default=None, help="your labelled text: .csv or .jsonl"
    )
    tune.add_argument("--text-column", default="text", help="(default: text)")
    tune.add_argument("--label-column", default="label", help="(default: label)")
    tune.add_argument(
        "--test-fraction",
        type=float,
        default=0.2,
        help="held out per class, never trained on (default: 0.2)",
    )
    tune.add_argument(
        "--max-length", type=positive_int, default=128, help="most word pieces (default: 128)"
    )
    tune.add_argument(
        "--checkpoint",
        type=pathlib.Path,
        default=None,
        metavar="DIR",
        help="save the training state here after every epoch; a state of this same run "
        "found there is resumed",
    )
    job = parser.add_argument_group(
        "several processes training one model (with --from and --distribute; JAX)"
    )
    job.add_argument(
        "--processes", type=positive_int, default=1, help="processes in the job (default: 1)"
    )
    job.add_argument("--process-id", type=nonnegative_int, default=None, help="this one's, from 0")
    job.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="process 0's address")
    job.add_argument(
        "--peer-timeout",
        type=positive_int,
        default=None,
        metavar="SECONDS",
        help="how long to wait for the others to join, and to hear nothing from one "
        "before the job stops (default: 60)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing run directory"
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress output (default: a progress bar on a terminal, one line per epoch "
        "otherwise, as in a log)",
    )
    return parser


def progress_verbosity(quiet: bool, stream) -> int:
    """Keras `fit` verbosity: 0 quiet, 1 a progress bar (a terminal), 2 a line per epoch."""
    if quiet:
        return 0
    isatty = getattr(stream, "isatty", None)
    return 1 if isatty is not None and isatty() else 2


# Flags of the from-scratch classifier that a fine-tuned encoder does not take.
SCRATCH_ONLY = (
    "num_heads", "d_model", "num_layers", "ff_dim", "dropout", "attention",
    "patience", "augment",
)  # fmt: skip


def _finetune(args: argparse.Namespace) -> int:
    from bundle_contract.errors import UsageError
    from keras_mha.train import finetune

    if args.data is None:
        raise UsageError("needs --data FILE (your labelled text)", "--from")
    given = [name for name in SCRATCH_ONLY if getattr(args, name) not in (None, False)]
    given += ["start"] if args.start is not None else []
    if given or args.qat or args.dataset is not None:
        flag = "--" + (given[0].replace("_", "-") if given else "qat" if args.qat else "dataset")
        raise UsageError("is for a classifier trained from scratch, not with --from", flag)
    if args.distribute not in (None, *MESH_DISTRIBUTE):
        raise UsageError(
            "is TensorFlow's, for a classifier trained from scratch; with --from: "
            + " or ".join(MESH_DISTRIBUTE)
            + " (JAX)",
            f"--distribute {args.distribute}",
        )
    job = _job(args)
    out = args.out or pathlib.Path(f"runs/{args.data.stem}")
    if job.lead:  # the run and the state are process 0's to write: refused before the job
        from keras_mha.rundir.writing import check_out

        check_writable(out, "--out")
        check_out(out, args.overwrite)
        if args.checkpoint is not None:
            check_writable(args.checkpoint / "state.json", "--checkpoint")
    data = finetune.read_labelled(args.data, args.text_column, args.label_column)  # before TF
    from keras_mha.pretrained.checkpoint import resolve

    resolve(args.source)
    if job.processes > 1 and not args.worker:
        from keras_mha.train.job import supervise

        return supervise(PROG, args.argv, job)  # the worker joins the job
    job.join()  # before JAX makes its devices
    import_tensorflow()
    if args.distribute is not None:
        from keras_mha.train.fit import check_backend_distributes

        check_backend_distributes(args.distribute)  # before the checkpoint is read
    with job.running():
        metrics = finetune.finetune(
            args.source,
            data,
            out,
            epochs=args.epochs or finetune.EPOCHS,
            batch_size=args.batch_size or finetune.BATCH_SIZE,
            learning_rate=args.learning_rate or finetune.LEARNING_RATE,
            test_fraction=args.test_fraction,
            max_length=args.max_length,
            seed=args.seed,
            overwrite=args.overwrite,
            progress=None if args.quiet else sys.stderr,
            distribute=args.distribute,
            job=job,
            checkpoint=args.checkpoint,
        )
    if not job.lead:
        print(f"{job.where}: trained; process 0 writes {out}")
        return 0
    print(
        f"{metrics['dataset']}: held-out accuracy {metrics['test_accuracy']:.4f} "
        f"({metrics['test_size']} rows never trained on; {metrics['train_size']} trained, "
        f"{len(metrics['config']['labels'])} classes), {args.source} fine-tuned "
        f"{metrics['fine_tuned']['epochs']} epochs in {metrics['train_seconds']:.1f} s -> {out}"
    )
    return 0


def _job(args: argparse.Namespace):
    """The job `--processes`, `--process-id` and `--coordinator` describe."""
    from bundle_contract.errors import UsageError
    from keras_mha.train.job import TIMEOUT, Job

    if args.processes == 1:
        for flag in ("process_id", "coordinator", "peer_timeout"):
            if getattr(args, flag) is not None:
                raise UsageError("needs --processes N above 1", "--" + flag.replace("_", "-"))
        return Job()
    if args.distribute not in MESH_DISTRIBUTE:
        raise UsageError(
            "needs --distribute " + " or ".join(MESH_DISTRIBUTE),
            f"--processes {args.processes}",
        )
    if args.process_id is None or args.coordinator is None:
        missing = "--process-id" if args.process_id is None else "--coordinator"
        raise UsageError(f"needs {missing} too", f"--processes {args.processes}")
    if args.process_id >= args.processes:
        raise UsageError(
            f"must be below --processes {args.processes}", f"--process-id {args.process_id}"
        )
    host, _, port = args.coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            "expected HOST:PORT, e.g. 10.0.0.1:29500", f"--coordinator {args.coordinator}"
        )
    backend = configured_backend()
    if backend != "jax":  # before a process is started or a device made
        raise UsageError(
            f"joins JAX processes (jax.distributed), and Keras runs on {backend}: run with "
            "KERAS_BACKEND=jax (the JAX venv, make backend-venvs)",
            f"--processes {args.processes}",
        )
    return Job(args.processes, args.process_id, args.coordinator, args.peer_timeout or TIMEOUT)


def configured_backend() -> str:
    """The backend Keras will load, read as Keras reads it (KERAS_BACKEND, then
    $KERAS_HOME/keras.json, else TensorFlow) without importing Keras."""
    import json

    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as config:
            backend = json.load(config).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    return backend if isinstance(backend, str) and backend else "tensorflow"


def _run(args: argparse.Namespace) -> int:
    if args.source is not None or args.data is not None:
        if args.source is None:
            from bundle_contract.errors import UsageError

            raise UsageError("needs --from CHECKPOINT (the encoder to fine-tune)", "--data")
        return _finetune(args)
    for flag in ("checkpoint", "process_id", "coordinator", "peer_timeout"):
        if getattr(args, flag) is not None or args.processes != 1:
            from bundle_contract.errors import UsageError

            name = "processes" if args.processes != 1 else flag
            raise UsageError("is for fine-tuning (--from)", "--" + name.replace("_", "-"))
    if args.start is not None and args.dataset is None:
        from keras_mha.rundir import read_run  # no TensorFlow: a bad run is answered first

        args.dataset = read_run(args.start).dataset
    args.dataset = args.dataset or "digits"
    default = f"runs/{args.dataset}" if args.start is None else f"{args.start}_qat"
    out = args.out or pathlib.Path(default)
    check_writable(out, "--out")
    import_tensorflow()  # first: its start-up logs filtered (keras_mha/quiet_tensorflow.py)
    if args.distribute in MESH_DISTRIBUTE:
        from keras_mha.train.fit import check_backend_distributes

        check_backend_distributes(args.distribute)
    from keras_mha.train.pipeline import train

    metrics = train(
        args.dataset,
        out,
        epochs=args.epochs,
        seed=args.seed,
        distribute=args.distribute,
        overwrite=args.overwrite,
        verbose=progress_verbosity(args.quiet, sys.stdout),
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        patience=args.patience,
        shift_augment=args.augment,
        num_heads=args.num_heads,
        d_model=args.d_model,
        num_layers=args.num_layers,
        ff_dim=args.ff_dim,
        dropout=args.dropout,
        implementation=args.attention,
        qat_epochs=args.qat,
        start=args.start,
    )
    summary = (
        f"{metrics['dataset']}: test accuracy {metrics['test_accuracy']:.4f}, "
        f"{metrics['num_params']} parameters, {metrics['epochs_run']} epochs in "
        f"{metrics['train_seconds']:.1f} s -> {out}"
    )
    if "per_cue_accuracy" in metrics:
        cues = ", ".join(f"{k} {v:.4f}" for k, v in metrics["per_cue_accuracy"].items())
        summary += f" (per cue: {cues})"
    print(summary)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `keras-mha-train`; returns the exit status."""
    from keras_mha.train.job import JobLost, become_worker, worker_exit

    argv = sys.argv[1:] if argv is None else list(argv)
    worker = become_worker()  # a job's process: its messages go to its supervisor

    def run() -> int:
        args = build_parser().parse_args(argv)
        args.argv, args.worker = argv, worker
        try:
            return _run(args)
        except JobLost as lost:
            print(f"{PROG}: error: {lost}", file=sys.stderr)
            return EXIT_FAILED

    code = run_main(PROG, run)
    if worker:
        worker_exit(code)
        if code:  # not JAX's shutdown barrier: the job is broken, the others stop too
            os._exit(code)
    return code
