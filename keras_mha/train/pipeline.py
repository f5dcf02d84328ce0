"""`train()`: settings checked, data loaded, model fit, run directory written."""

from __future__ import annotations

import os

from bundle_contract.files import sha256_file
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
    start: str | os.PathLike | None = None,
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
        distribute: `None` (one device), `"mirrored"`
            (`tf.distribute.MirroredStrategy` over every GPU, or every
            logical CPU device when there is no GPU; TensorFlow), or `"data"`
            or `"heads"` (keras.distribution over every device, JAX:
            `keras_mha.train.fit.on_mesh`).
        overwrite: Replace an existing run directory.
        verbose: Keras `fit` verbosity (0 quiet, 1 a progress bar, 2 a line per epoch).
        deterministic: Enable TensorFlow's op determinism for the run, so
            the same seed on the same machine gives the same metrics.
        qat_epochs: Then fine-tune this many epochs with int8's rounding
            in the loop (keras_mha.qat.train.fine_tune_classifier): the run
            gets ranges.json, which the int8 export takes.
        start: A run directory of keras-mha-train on `dataset` (with
            `qat_epochs`): its trained model is fine-tuned with rounding
            instead of a new one trained. Its model, seed and training
            settings are the run's; `implementation` may differ (the
            lesson's per_head graph computes the same weights per head).
            The new run's metrics.json keeps the start's history and
            names it (`start`).
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

    begun = None
    if start is not None:
        overrides = {
            "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate,
            "patience": patience, "augment": shift_augment, "distribute": distribute,
            **{k: v for k, v in model_options.items() if k != "implementation"},
        }  # fmt: skip
        begun, config, settings = _start(start, dataset, seed, qat_epochs, overrides)
        config = _with_implementation(config, model_options.get("implementation"))
    else:
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
        if begun is None:
            fitted = fit(data, config, settings, distribute, verbose, deterministic)
        else:
            fitted = _fitted_from(begun, config, data)
            distribute = begun.metrics["distribute"]["strategy"]
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
        if begun is not None:
            model_sha256 = sha256_file(begun.path / "model.keras")
            metrics["start"] = {"run": str(begun.path), "model_sha256": model_sha256}
        if qat is not None:
            metrics["qat"] = qat
            (writer.staging / "ranges.json").write_bytes(ranges_json(ranges, rule=qat["rule"]))
        write_training_run(writer, data, config, fitted, metrics)
    return metrics


def _start(start, dataset: str, seed: int, qat_epochs: int, overrides: dict):
    """The run `start` names, checked for `train(start=...)`: (run, config, settings)."""
    from bundle_contract.errors import UsageError
    from keras_mha.rundir import read_run
    from keras_mha.train.presets import TrainSettings

    if not qat_epochs:
        raise UsageError("needs --qat EPOCHS: the run's model is trained already", "--start")
    given = [name for name, value in overrides.items() if value is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError("comes from the run --start names", flag)
    run = read_run(start)
    if run.dataset != dataset:
        raise UsageError(f"is a {run.dataset} run; expected a {dataset} run", start)
    if run.config.seed != seed:
        raise UsageError(f"the run --start names was trained with seed {run.config.seed}", "--seed")
    try:
        settings = TrainSettings(**run.metrics["training"])
    except (KeyError, TypeError) as exc:
        raise UsageError(
            f"has no training settings ({exc}): not a keras-mha-train run", start
        ) from None
    return run, run.config, settings


def _with_implementation(config, implementation: str | None):
    import dataclasses

    if implementation is None:
        return config
    config = dataclasses.replace(config, implementation=implementation)
    config.validate()  # ValueError naming what is wrong
    return config


def _fitted_from(run, config, data):
    """`run`'s trained model as `fit` returns one, built with `config` (its
    implementation may differ: the weights are the same variables)."""
    from bundle_contract.errors import UsageError
    from keras_mha.model import build_classifier
    from keras_mha.train.fit import Fitted

    trained = run.load_model()
    model = build_classifier(config)
    try:
        model.set_weights(trained.get_weights())
    except ValueError as exc:  # a model.keras that is not the one metrics.json describes
        raise UsageError(
            f"its model.keras is not its metrics.json's model ({exc})", run.path
        ) from None
    metrics = run.metrics
    fitted = Fitted(
        model=model,
        history=metrics["history"],
        best_epoch=metrics["best_epoch"],
        train_seconds=metrics["train_seconds"],
        train_augmented=metrics["samples"]["train_augmented"],
        replicas=metrics["distribute"]["replicas"],
        test_probs=model.predict(data.x_test, batch_size=256, verbose=0).astype("float32"),
        val_probs=model.predict(data.x_val, batch_size=256, verbose=0),
    )
    return fitted
