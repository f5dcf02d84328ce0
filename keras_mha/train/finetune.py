"""keras-mha-train --from CHECKPOINT --data FILE: a pretrained encoder
fine-tuned on your labelled text, written as a text-classification run.

    keras-mha-train --from all-MiniLM-L6-v2 --data tickets.csv --out runs/tickets

FILE is a CSV with a header row, or JSON Lines (one object per line), with a
text column and a label column (`--text-column`, `--label-column`; default
`text` and `label`). The rows are split, stratified by label and seeded, into
a held-out test split (`--test-fraction`, default 0.2; at least one row of
every class) that training never sees, and the rest. The encoder (any
checkpoint keras-mha-import takes) gets a classification head on its pooled
sentence vector (Dense + tanh, Dense, softmax: the layout of an imported
classifier) and trained with AdamW on the cross-entropy, every weight but the
embedding layer's: the word-piece, position and segment tables stay as
pretrained, so words no training row has keep their place beside the words
trained on.

The run holds the model, the held-out rows as its eval set (their float
probabilities: the parity reference), training rows for int8 calibration,
the tokenizer and the labels; metrics.json has the held-out accuracy.
keras-mha-export, keras-mha-edge and keras-mha-heads take it as they take an
imported classifier.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import pathlib
import sys
import time

import numpy as np

from bundle_contract.errors import UsageError
from bundle_contract.files import read_utf8

TEXT_COLUMN, LABEL_COLUMN = "text", "label"
TEST_FRACTION = 0.2
# The head starts random and a user's file is small (hundreds of rows): BERT's
# usual 3 epochs at 2e-5 .. 5e-5 leave it short. Measured on all-MiniLM-L6-v2
# (AMD EPYC): the corpus's 29 topics, 391 rows, held-out accuracy 0.74 after 4
# epochs at 5e-5, 0.82 after 6 at 1e-4; the pronoun task (1,200 rows) sits at
# chance for 3 epochs, then reaches 1.0 by the 6th at 1e-4.
EPOCHS = 6
BATCH_SIZE = 16
LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
CALIBRATION = 200  # training rows kept for int8 calibration (export asks for >= 200)
MAX_ROWS = 1_000_000
SUFFIXES = (".csv", ".jsonl", ".json")


# ------------------------------------------------------------------ the data
@dataclasses.dataclass
class Labelled:
    """A user's labelled text: rows in file order, class names sorted."""

    texts: list[str]
    labels: list[str]
    classes: tuple[str, ...]
    sha256: str
    path: pathlib.Path
    text_column: str = TEXT_COLUMN
    label_column: str = LABEL_COLUMN

    @property
    def y(self) -> np.ndarray:
        index = {name: i for i, name in enumerate(self.classes)}
        return np.asarray([index[label] for label in self.labels], np.int32)


def read_labelled(
    path: str | pathlib.Path, text_column: str = TEXT_COLUMN, label_column: str = LABEL_COLUMN
) -> Labelled:
    """The rows of a CSV (header row) or JSON Lines file; a UsageError (one
    line, naming the file and the line) for anything a classifier cannot learn."""
    path = pathlib.Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(f"expected a .csv or .jsonl file, got {path.suffix or 'no suffix'}", path)
    raw, text = read_utf8(path)
    if not text.strip():
        raise UsageError("is empty; expected a header row and labelled rows", path)
    read = _csv_rows if path.suffix.lower() == ".csv" else _jsonl_rows
    rows = read(text, path, text_column, label_column)
    if not rows:
        raise UsageError("has no labelled rows", path)
    if len(rows) > MAX_ROWS:
        raise UsageError(f"has {len(rows)} rows; at most {MAX_ROWS}", path)
    texts = [t for _, t, _ in rows]
    labels = [label for _, _, label in rows]
    counts = {name: labels.count(name) for name in sorted(set(labels))}
    if len(counts) < 2:
        raise UsageError(
            f"every row has label {labels[0]!r}; a classifier needs at least 2 classes", path
        )
    lonely = [name for name, n in counts.items() if n < 2]
    if lonely:
        raise UsageError(
            f"class {lonely[0]!r} has 1 row; every class needs 2 (one to train on, one to "
            "hold out)",
            path,
        )
    sha256 = hashlib.sha256(raw).hexdigest()
    return Labelled(texts, labels, tuple(counts), sha256, path, text_column, label_column)


def _cell(value, line: int, column: str, path: pathlib.Path) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise UsageError(f"line {line}: {column} must be text, got {type(value).__name__}", path)
    value = str(value).strip()
    if not value:
        raise UsageError(f"line {line}: {column} is empty", path)
    return value


def _csv_rows(text: str, path, text_column: str, label_column: str):
    try:
        records = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as error:
        raise UsageError(f"is not valid CSV ({error})", path) from None
    header = [name.strip() for name in records[0]]
    seen = set()
    for name in header:
        if name in seen:
            raise UsageError(f"the header names column {name!r} twice", path)
        seen.add(name)
    where = {}
    for flag, column in (("--text-column", text_column), ("--label-column", label_column)):
        if column not in header:
            raise UsageError(
                f"has no column {column!r} ({flag}); its columns are: {', '.join(header)}", path
            )
        where[column] = header.index(column)
    rows = []
    for line, record in enumerate(records[1:], start=2):
        if not any(cell.strip() for cell in record):
            continue  # a blank line
        if len(record) != len(header):
            raise UsageError(
                f"line {line}: {len(record)} fields, the header has {len(header)}", path
            )
        rows.append(
            (
                line,
                _cell(record[where[text_column]], line, text_column, path),
                _cell(record[where[label_column]], line, label_column, path),
            )
        )
    return rows


def _jsonl_rows(text: str, path, text_column: str, label_column: str):
    rows = []
    for line, record in enumerate(text.splitlines(), start=1):
        if not record.strip():
            continue
        try:
            obj = json.loads(record)
        except ValueError:
            raise UsageError(f"line {line}: not a JSON object", path) from None
        if not isinstance(obj, dict):
            raise UsageError(f"line {line}: not a JSON object", path)
        for flag, column in (("--text-column", text_column), ("--label-column", label_column)):
            if column not in obj:
                raise UsageError(
                    f"line {line}: no key {column!r} ({flag}); it has: {', '.join(obj)}", path
                )
        rows.append(
            (
                line,
                _cell(obj[text_column], line, text_column, path),
                _cell(obj[label_column], line, label_column, path),
            )
        )
    return rows


def split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices: per class, a seeded `test_fraction` (at
    least one row, at most all but one) held out."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        n = min(max(1, round(test_fraction * len(rows))), len(rows) - 1)
        test.extend(rows[:n])
        train.extend(rows[n:])
    return np.sort(np.asarray(train)), np.sort(np.asarray(test))


# ---------------------------------------------------------------- progress
class Progress:
    """Keras's `fit` progress on stderr: epoch, batch, loss and time left,
    rewritten in place on a terminal, a line per epoch otherwise. Training
    calls `fit` once an epoch: the callback keeps its clock across the calls,
    and `epochs` (default: `fit`'s) is the run's."""

    def __init__(self, stream=None, epochs: int | None = None):
        import keras

        stream = sys.stderr if stream is None else stream

        class Callback(keras.callbacks.Callback):
            started = None

            def on_train_begin(cb, logs=None):
                if cb.started is None:  # the first epoch's fit: the run's clock starts
                    cb.started, cb.done = time.perf_counter(), 0
                cb.epochs, cb.steps = epochs or cb.params["epochs"], cb.params["steps"]

            def on_epoch_begin(cb, epoch, logs=None):
                cb.epoch, cb.epoch_started = epoch, time.perf_counter()

            def left(cb, batch: int) -> float:
                remaining = (cb.epochs - cb.epoch - 1) * cb.steps + cb.steps - batch - 1
                return (time.perf_counter() - cb.started) / max(cb.done, 1) * remaining

            def on_train_batch_end(cb, batch, logs=None):
                cb.done += 1
                if not self.tty:
                    return
                stream.write(
                    f"\repoch {cb.epoch + 1}/{cb.epochs}  batch {batch + 1}/{cb.steps}  "
                    f"loss {logs['loss']:.4f}  {cb.left(batch):4.0f} s left "
                )
                stream.flush()

            def on_epoch_end(cb, epoch, logs=None):
                took = time.perf_counter() - cb.epoch_started
                stream.write(
                    f"{chr(13) if self.tty else ''}epoch {epoch + 1}/{cb.epochs}  loss "
                    f"{logs['loss']:.4f}  accuracy {logs.get('accuracy', float('nan')):.4f}  "
                    f"{took:.1f} s  ({cb.left(cb.steps - 1):.0f} s left)\n"
                )
                stream.flush()

        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.callback = Callback()


# ---------------------------------------------------------------- the model
def classifier_config(config, classes: tuple[str, ...]):
    """The encoder's config with a classification head of `classes`; it
    pools as the encoder was trained to (mean for a sentence encoder)."""
    return dataclasses.replace(
        config, labels=tuple(classes), score_activation=None, pair_sep_id=None
    )


def finetune(
    source: str,
    data: Labelled | str | pathlib.Path,
    out: str | pathlib.Path,
    *,
    epochs: int = EPOCHS,
    batch_size: int = BATCH_SIZE,
    learning_rate: float = LEARNING_RATE,
    test_fraction: float = TEST_FRACTION,
    max_length: int = 128,
    seed: int = 0,
    overwrite: bool = False,
    progress=None,
    distribute: str | None = None,
    job=None,
    checkpoint: str | pathlib.Path | None = None,
) -> dict:
    """Fine-tune `source` on `data` (`read_labelled`'s rows, or a file read
    with the default columns); write the run; its metrics.

    `progress`: a stream for the per-epoch progress (None: no output).
    `distribute`: None (one device), or `data` or `heads` over every device
    Keras sees (`keras_mha.distribution.training_distribution`; JAX). Each
    batch is split over the batch axis, which must divide the last batch too:
    when it does not, the training split's last rows (in file order, fewer
    than the batch devices) are left out of every epoch and named in
    metrics.json (`training_rows_left_out`); otherwise the batches are the single-device
    run's. The run holds the gathered weights, as any other run.
    `job`: a `keras_mha.train.job.Job` this process takes part in (default: a
    job of this process alone). Every process trains; process 0 alone reports
    progress, evaluates and writes the run, and the others return
    `{"process": id, "train_loss": [...]}`.
    `checkpoint`: a directory where the training state (weights, optimizer,
    losses) is saved after every epoch; a state saved there by the same run
    (same checkpoint, data, seed and settings) is resumed from its epoch
    (keras_mha.train.checkpoint).

    Every epoch trains the training rows in an order seeded by (seed, epoch)
    (`epoch_rows`), whatever the backend, the devices or the processes: a
    resumed or distributed run sees the batches the single-device run sees.
    """
    import keras

    from keras_mha.pretrained.bert import build_encoder, load_weights
    from keras_mha.pretrained.encoder import load
    from keras_mha.rundir.embedding import write_embedding_run
    from keras_mha.rundir.writing import check_out
    from keras_mha.train.job import Job

    job = Job() if job is None else job
    if job.lead:
        check_out(out, overwrite)
    if not 0.0 < test_fraction < 1.0:
        raise UsageError(f"must be between 0 and 1, got {test_fraction}", "--test-fraction")
    if not isinstance(data, Labelled):
        data = read_labelled(data)
    encoder = load(source, max_length)
    config = classifier_config(encoder.config, data.classes)
    try:
        config.validate()
    except UsageError as error:
        raise UsageError(error.problem, data.path) from None
    y = data.y
    train, test = split(y, test_fraction, seed)
    ids = encoder.tokenize(data.texts)  # padded to the longest row (at most max_length)
    keras.utils.set_random_seed(seed)
    model = build_encoder(config)
    load_weights(model, dataclasses.replace(config, labels=()), encoder.checkpoint.tensors())
    trained, distributed = model, None
    before = keras.distribution.distribution()  # the caller's, set back after
    try:
        if distribute is not None:
            trained, train, distributed = _distributed(model, distribute, batch_size, train, job)
        # The word-piece, position and segment tables (and their LayerNorm) stay as
        # pretrained: a word no training row has keeps its place beside the words
        # trained on, and AdamW skips 12 M of MiniLM's 23 M weights each step.
        embedding = trained.get_layer("embedding")
        embedding.trainable = False
        fingerprint = {
            "source": encoder.checkpoint.source(), "data_sha256": data.sha256,
            "text_column": data.text_column, "label_column": data.label_column,
            "test_fraction": test_fraction, "max_length": max_length, "seed": seed,
            "batch_size": batch_size, "learning_rate": learning_rate,
            "weight_decay": WEIGHT_DECAY, "training_rows": hashlib.sha256(train.tobytes()).hexdigest(),
        }  # fmt: skip
        trained.compile(
            optimizer=keras.optimizers.AdamW(
                learning_rate=learning_rate, weight_decay=WEIGHT_DECAY
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=["accuracy"],
        )
        started = time.perf_counter()
        losses, resumed = _fit_epochs(
            trained, ids, y, train, epochs, batch_size, seed, job, progress,
            None if checkpoint is None else (checkpoint, fingerprint),
        )  # fmt: skip
        seconds = time.perf_counter() - started
        embedding.trainable = True  # the run's model, as any other: every weight trainable
        if trained is not model:
            model.set_weights(job.host_values(trained.weights))  # gathered from the devices
    finally:
        if distribute is not None:
            keras.distribution.set_distribution(before)
    job.leave()  # every process has the weights: process 0 evaluates and writes alone
    if not job.lead:
        return {"process": job.process_id, "train_loss": losses}
    probs = encoder_probs(model, ids[test])
    predicted = probs.argmax(1)
    per_class = {
        name: float((predicted[y[test] == c] == c).mean()) for c, name in enumerate(data.classes)
    }
    rng = np.random.default_rng(seed)
    calibration = ids[np.sort(rng.permutation(train)[:CALIBRATION])]
    metrics = {
        "dataset": data.path.name,
        "data_sha256": data.sha256,
        "seed": seed,
        "config": config.to_dict(),
        "max_length": max_length,
        "source": encoder.checkpoint.source(),
        "fine_tuned": {
            "epochs": epochs,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "weight_decay": WEIGHT_DECAY,
            "frozen": [embedding.name],  # as pretrained; every other weight trained
            "test_fraction": test_fraction,
            "text_column": data.text_column,
            "label_column": data.label_column,
            "backend": keras.backend.backend(),
            **({} if distributed is None else {"distribute": distributed}),
            **(
                {}
                if checkpoint is None
                else {"checkpoint": {"directory": str(checkpoint), "resumed_after_epoch": resumed}}
            ),  # fmt: skip
        },
        "train_size": int(len(train)),
        "test_size": int(len(test)),
        "test_accuracy": float((predicted == y[test]).mean()),
        "per_class_test_accuracy": per_class,
        "train_loss": losses,
        "train_seconds": round(seconds, 2),
    }
    write_embedding_run(
        out,
        model,
        metrics,
        ids[test],
        probs,
        calibration,
        [data.texts[i] for i in test],
        encoder.checkpoint.tokenizer_file.read_bytes(),
        overwrite=overwrite,
        y=y[test],  # the held-out gold labels: export and the device report accuracy on them
    )
    return metrics


def epoch_rows(train: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The training rows in `epoch`'s order: a permutation seeded by (seed,
    epoch), so every backend, device count and process, and a run resumed at
    `epoch`, trains the same batches."""
    return np.random.default_rng([seed, epoch]).permutation(train)


def process_rows(rows: np.ndarray, batch_size: int, processes: int, process_id: int) -> np.ndarray:
    """The rows process `process_id` of `processes` feeds: its part of every
    batch of `batch_size` rows (part p of `processes` equal parts). Keras's
    distribution puts process p's rows at those places of the batch: the mesh
    lists the devices process by process, and the batch axis runs over them.
    Each batch, the last too, must divide by `processes` (the batch axis's
    devices divide it, and they are a multiple of the processes)."""
    if processes == 1:
        return rows
    parts = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        size = len(batch) // processes
        parts.append(batch[process_id * size : (process_id + 1) * size])
    return np.concatenate(parts)


def _fit_epochs(model, ids, y, train, epochs, batch_size, seed, job, progress, checkpoint):
    """Train `model` (compiled) `epochs` epochs, one `fit` call an epoch on
    `epoch_rows`: (the epochs' mean training losses, the epochs a checkpoint
    resumed had done). `checkpoint`: (directory, fingerprint), the state saved
    after each epoch and resumed from."""
    from keras_mha.train.checkpoint import TrainingState

    state = None if checkpoint is None else TrainingState(*checkpoint)
    first, losses = (0, []) if state is None else state.restore(model, epochs, job)
    if first and progress is not None and job.lead:
        progress.write(f"resumed after epoch {first} of {epochs} from {state.directory}\n")
    shown = progress is not None and job.lead  # progress and metrics from one process
    callbacks = [Progress(progress, epochs).callback] if shown else []
    for epoch in range(first, epochs):
        rows = process_rows(
            epoch_rows(train, seed, epoch), batch_size, job.processes, job.process_id
        )
        history = model.fit(
            ids[rows],
            y[rows],
            batch_size=batch_size // job.processes,
            epochs=epoch + 1,
            initial_epoch=epoch,
            shuffle=False,  # epoch_rows is the order
            verbose=0,
            callbacks=callbacks,
        )
        losses.append(float(history.history["loss"][-1]))
        if state is not None:
            state.save(model, epoch + 1, losses, job)
    return losses, first


def _distributed(model, kind: str, batch_size: int, train: np.ndarray, job):
    """(the model to train, on the devices; the training rows; what metrics.json
    says of it): `keras_mha.train.fit.on_mesh`'s clone of `model`, over the
    devices of every process of `job`."""
    from keras_mha.train.fit import on_mesh

    clone, (kept,), mesh = on_mesh(model, kind, batch_size, len(train), local=job.local_devices())
    if job.processes > 1:
        import keras

        keras.distribution.distribution().auto_shard_dataset = False  # process_rows feeds
    (left_out,) = mesh.pop("rows_left_out")
    return (
        clone,
        train[:kept],
        {
            "kind": kind,
            **mesh,
            **({} if job.processes == 1 else {"processes": job.processes}),
            "training_rows_left_out": int(left_out),
        },
    )


def encoder_probs(model, ids: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """The model's probabilities (N, C) float32, inference mode."""
    from keras import ops

    out = [
        ops.convert_to_numpy(model(ids[i : i + batch_size], training=False))
        for i in range(0, len(ids), batch_size)
    ]
    return np.concatenate(out).astype(np.float32)
