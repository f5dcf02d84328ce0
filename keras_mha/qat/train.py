"""Quantization-aware training of a run directory (the command: keras_mha/qat/cli.py).

The model is fine-tuned with int8's rounding in the loop (keras_mha.qat:
each point of our layers rounded to a range chosen on the calibration set),
on whatever Keras backend is active, and written as a new run with its
ranges (ranges.json), which `keras-mha-export --quant int8` then gives the
converter as the tensors' ranges:

- an embedding run (keras-mha-import): distillation, no labels. The student
  starts as the encoder and learns to give, with rounding, the float
  encoder's unit vector (loss: minus the cosine) for sentences cut and joined from
  the calibration sentences (the eval sentences are never seen). The new
  run's eval reference stays the float encoder's vectors, so its int8 is
  checked against the model as it was imported;
- a classification run (keras-mha-train): the task's loss on its training
  data, with rounding (`keras-mha-train --qat EPOCHS` runs this after the
  float training). The eval reference is the fine-tuned model's float
  outputs, as for any run.

Either way, `metrics.json` gets a "qat" section: the rule and the number of
ranges, the steps, the loss before and after, and how close the model with
rounding is to the float reference on the eval set.
"""

from __future__ import annotations

import pathlib

import numpy as np

DEFAULTS = {"rule": "mse", "steps": 400, "batch_size": 16, "learning_rate": 2e-5, "seed": 0}


# ------------------------------------------------------------------- sentences
def distillation_ids(
    calibration: np.ndarray, count: int, seed: int = 0, pad_id: int = 0
) -> np.ndarray:
    """`count` token-id rows (padded with `pad_id` to the calibration's width) made
    from the calibration sentences: each an original, a random span of one, or
    two joined, between the first and last token ([CLS] and [SEP], <s> and </s>)."""
    from bundle_contract.arrays import own_lengths

    rng = np.random.default_rng(seed)
    lengths = own_lengths(calibration, pad_id)
    rows = [calibration[i, : int(n)] for i, n in enumerate(lengths)]
    cls_id, sep_id = int(rows[0][0]), int(rows[0][-1])
    inner = [r[1:-1] for r in rows]
    width = calibration.shape[1]
    out = np.full((count, width), pad_id, "int32")
    for i in range(count):
        kind = rng.integers(3)
        a = inner[rng.integers(len(inner))]
        if kind == 1 and len(a) > 3:
            start = int(rng.integers(0, len(a) - 2))
            a = a[start : start + int(rng.integers(3, len(a) - start + 1))]
        elif kind == 2:
            a = np.concatenate([a, inner[rng.integers(len(inner))]])[: width - 2]
        out[i, : len(a) + 2] = np.concatenate([[cls_id], a, [sep_id]])
    return out


def _dataset(batches: list[np.ndarray], targets: list[np.ndarray]):
    """A Keras PyDataset of (x, target) batches: `fit` on any backend."""
    import keras

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return len(batches)

        def __getitem__(self, index):
            return batches[index], targets[index]

    return Batches()


# -------------------------------------------------------------------- training
def _eval_figures(model, run) -> dict:
    """The model's eval vectors against the float encoder's (eval.npz), by the device's measure."""
    from bundle_contract.tasks.embedding import measure_embeddings
    from keras_mha.pretrained.encoding import embed

    figures = measure_embeddings(embed(model, run.eval.x), run.eval.probs)
    return {
        name: round(float(getattr(figures, name)), 6)
        for name in ("min_cosine", "mean_cosine", "top1")
    }


def distill_encoder(run_dir, out, *, overwrite=False, log=print, **settings) -> dict:
    """An embedding run fine-tuned with rounding by distillation; written to `out`."""
    import keras

    from bundle_contract.arrays import own_lengths
    from keras_mha import qat
    from keras_mha.pretrained.encoding import batches, pad_id_of
    from keras_mha.rundir.embedding import read_embedding_run, write_embedding_run
    from keras_mha.rundir.writing import check_out

    s = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    check_out(out, overwrite)
    keras.utils.set_random_seed(s["seed"])
    run = read_embedding_run(run_dir)
    model = run.load_model()
    calibration = run.calibration
    pad_id = pad_id_of(model)
    recorder = qat.record(model, calibration, lengths=own_lengths(calibration, pad_id))
    ranges = qat.choose_ranges(recorder, s["rule"])
    log(f"{run_dir}: {len(ranges)} ranges by {s['rule']!r} from {len(calibration)} sentences")
    ids = distillation_ids(calibration, s["steps"] * s["batch_size"], s["seed"], pad_id)
    parts = batches(ids, s["batch_size"], pad_id)  # similar lengths, each cut to its longest
    np.random.default_rng(s["seed"]).shuffle(parts)
    xs = [x for _, x in parts]
    teacher = [np.asarray(model(x, training=False)) for x in xs]  # the float vectors
    qat.attach(model, ranges)
    try:
        before = _eval_figures(model, run)
        log(f"  with rounding, before training: eval {before}")
        model.compile(
            optimizer=keras.optimizers.Adam(s["learning_rate"]),
            loss=keras.losses.CosineSimilarity(axis=-1),  # -cosine
        )
        history = model.fit(_dataset(xs, teacher), epochs=1, verbose=0)
        after = _eval_figures(model, run)
    finally:
        qat.detach(model)
    floated = _eval_figures(model, run)
    log(f"  after {len(xs)} steps: eval with rounding {after}; without rounding {floated}")
    report = {
        **{k: s[k] for k in DEFAULTS},
        "ranges": len(ranges),
        "sentences": len(ids),
        "loss": [round(float(v), 6) for v in history.history["loss"]],  # mean -cosine
        "eval_with_rounding_before": before,
        "eval_with_rounding": after,
        "eval_float": floated,
        "backend": keras.backend.backend(),
    }
    metrics = {**run.metrics, "qat": report}
    ranges_json = qat.ranges_json(ranges, rule=s["rule"])
    write_embedding_run(
        out,
        model,
        metrics,
        run.eval.x,
        run.eval.probs,
        calibration,
        list(run.texts),
        (pathlib.Path(run.path) / "tokenizer.json").read_bytes(),
        overwrite=overwrite,
        extra={"ranges.json": ranges_json},
        y=run.gold_labels,
    )
    return report


def fine_tune_classifier(
    fitted, data, calibration, *, epochs, learning_rate, batch_size, rule="mse", seed=0, verbose=0
):
    """`fitted.model` (keras_mha.train.fit) fine-tuned `epochs` epochs with rounding,
    on the task's loss: returns (fitted with the new model's float outputs, ranges, report).

    The ranges are chosen once, on `calibration` before the fine-tuning, and
    kept: they are the ranges the int8 export then takes.
    """
    import dataclasses

    import keras

    from keras_mha import qat

    model = fitted.model
    keras.utils.set_random_seed(seed)
    ranges = qat.choose_ranges(qat.record(model, calibration, seed=seed), rule)

    def accuracy(x, y) -> float:
        return float((model.predict(x, batch_size=256, verbose=0).argmax(-1) == y).mean())

    float_before = accuracy(data.x_test, data.y_test)
    qat.attach(model, ranges)
    try:
        rounded_before = accuracy(data.x_test, data.y_test)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        history = model.fit(
            data.x_train,
            data.y_train,
            validation_data=(data.x_val, data.y_val),
            epochs=epochs,
            batch_size=batch_size,
            shuffle=True,
            verbose=verbose,
        )
        rounded_after = accuracy(data.x_test, data.y_test)
    finally:
        qat.detach(model)
    test_probs = model.predict(data.x_test, batch_size=256, verbose=0).astype("float32")
    val_probs = model.predict(data.x_val, batch_size=256, verbose=0)
    report = {
        "rule": rule,
        "ranges": len(ranges),
        "epochs": epochs,
        "learning_rate": learning_rate,
        "loss": [round(float(v), 6) for v in history.history["loss"]],
        "test_accuracy_float_before": float_before,
        "test_accuracy_with_rounding_before": rounded_before,
        "test_accuracy_with_rounding": rounded_after,
        "backend": keras.backend.backend(),
    }
    fitted = dataclasses.replace(fitted, test_probs=test_probs, val_probs=val_probs)
    return fitted, ranges, report
