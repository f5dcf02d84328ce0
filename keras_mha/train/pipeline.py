"""`train()`: settings checked, data loaded, model fit, run directory written."""

from __future__ import annotations

import os

from keras_mha import data as datasets
from keras_mha.rundir import RunWriter
from keras_mha.train import memory
from keras_mha.train.record import calibration_sample, run_metrics, write_training_run
from keras_mha.train.settings import resolve_settings


def train(
    dataset: str = "digits",
    out: str | os.PathLike | None = None,
    *,
    epochs: int | None = None,
    seed: int = 0,
    distribute: str | None = None,
    overwrite: bool = False,
    verbose: int = 1,
    batch_size: int | None = None,
    learning_rate: float | None = None,
    patience: int | None = None,
    shift_augment: bool | None = None,
    deterministic: bool = True,
    qat_epochs: int = 0,
    **model_options,
) -> dict:
    """Train a classifier on `dataset` and write the run directory `out`.

    Args:
        dataset: `"digits"` or `"pronouns"`.
        out: The run directory; defaults to `runs/<dataset>`. It must not
            exist, be empty, or `overwrite` must be set (and then it must
            look like a run directory: hold metrics.json or model.keras).
        epochs, batch_size, learning_rate, patience, shift_augment: Override
            the dataset's `TrainSettings` in `PRESETS` (`None` keeps them).
        seed: Seeds the split, the initial weights, dropout and shuffling.
        distribute: `None` (one device) or `"mirrored"`
            (`tf.distribute.MirroredStrategy` over every GPU, or every
            logical CPU device when there is no GPU).
        overwrite: Replace an existing run directory.
        verbose: Keras `fit` verbosity (0 quiet, 1 a progress bar, 2 a line per epoch).
        deterministic: Enable TensorFlow's op determinism for the run, so
            the same seed on the same machine gives the same metrics.
        qat_epochs: Then fine-tune this many epochs with int8's rounding
            in the loop (keras_mha.qat.train.fine_tune_classifier): the run
            gets ranges.json, which the int8 export takes.
        **model_options: `ModelConfig` fields (d_model, num_heads,
            num_layers, ff_dim, dropout, positional, ...).

    Returns:
        The metrics written to metrics.json.

    Raises:
        UsageError: For bad input (settings, a model too large for the
            memory, an unwritable `out`), before any training starts.
    """
    from keras_mha.qat import ranges_json
    from keras_mha.qat.train import fine_tune_classifier
    from keras_mha.train.fit import fit

    config, settings = resolve_settings(
        dataset,
        seed=seed,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        patience=patience,
        shift_augment=shift_augment,
        model_options=model_options,
        distribute=distribute,
    )
    memory.check_fits(config, settings.batch_size)
    with RunWriter(f"runs/{dataset}" if out is None else out, overwrite) as writer:
        data = datasets.load_dataset(dataset, seed)
        fitted = fit(data, config, settings, distribute, verbose, deterministic)
        qat = None
        if qat_epochs:
            fitted, ranges, qat = fine_tune_classifier(
                fitted,
                data,
                calibration_sample(data.x_train, config.seed),
                epochs=qat_epochs,
                learning_rate=settings.learning_rate / 10,
                batch_size=settings.batch_size,
                seed=config.seed,
                verbose=verbose,
            )
        metrics = run_metrics(data, config, settings, fitted, distribute, deterministic)
        if qat is not None:
            metrics["qat"] = qat
            (writer.staging / "ranges.json").write_bytes(ranges_json(ranges, rule=qat["rule"]))
        write_training_run(writer, data, config, fitted, metrics)
    return metrics
