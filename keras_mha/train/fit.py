"""Fit the classifier: the optimizer, its schedule, the strategy, early stopping."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from bundle_contract.errors import UsageError, one_line
from keras_mha.train.augment import shift_augment
from keras_mha.train.determinism import op_determinism
from keras_mha.train.presets import MESH_DISTRIBUTE, TrainSettings

if TYPE_CHECKING:
    from keras_mha import data as datasets
    from keras_mha.model import ModelConfig


@dataclasses.dataclass
class Fitted:
    """A trained model and how its training went."""

    model: Any  # keras.Model, weights of the best validation-loss epoch
    history: dict[str, list[float]]
    best_epoch: int  # from 1
    train_seconds: float
    train_augmented: int  # training examples after augmentation
    replicas: int
    test_probs: np.ndarray  # (N, C) float32 softmax on the test split
    val_probs: np.ndarray
    # keras.distribution's (--distribute data|heads): the mesh and the rows left out
    mesh: dict = dataclasses.field(default_factory=dict)


def learning_rate(settings: TrainSettings, train_size: int):
    """Cosine decay over all epochs, after an optional linear warm-up.

    The warm-up takes at most a quarter of the epochs (short test runs).
    """
    import keras

    steps_per_epoch = -(-train_size // settings.batch_size)
    warmup = min(settings.warmup_epochs, settings.epochs // 4) * steps_per_epoch
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else settings.learning_rate,
        decay_steps=max(1, settings.epochs * steps_per_epoch - warmup),
        warmup_target=settings.learning_rate if warmup else None,
        warmup_steps=warmup,
    )


def strategy(distribute: str | None):
    """`tf.distribute` strategy: the default one, or MirroredStrategy over every GPU/CPU."""
    import tensorflow as tf

    if distribute == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy(devices=[d.name for d in devices])
    return tf.distribute.get_strategy()


def fit(
    data: datasets.Dataset,
    config: ModelConfig,
    settings: TrainSettings,
    distribute: str | None = None,
    verbose: int = 1,
    deterministic: bool = True,
) -> Fitted:
    """Train a classifier built from `config` on `data`, seeded by `config.seed`.

    Raises:
        UsageError: The model ran out of memory (where no estimate caught it).
    """
    try:
        return _fit(data, config, settings, distribute, verbose, deterministic)
    except MemoryError as error:
        raise UsageError(
            f"out of memory while training ({one_line(error) or 'MemoryError'})"
        ) from None
    except Exception as error:
        tf = sys.modules.get("tensorflow")  # Keras on JAX or PyTorch may run without it
        if tf is not None and isinstance(error, tf.errors.ResourceExhaustedError):
            raise UsageError(
                f"out of memory while training: {one_line(error.message)[:200]}"
            ) from None
        raise


def _fit(data, config, settings, distribute, verbose, deterministic) -> Fitted:
    import keras

    from keras_mha.model import build_classifier

    keras.utils.set_random_seed(config.seed)
    mesh = {}
    before = keras.distribution.distribution()  # the caller's, set back after
    # TensorFlow's strategy and op determinism; XLA on JAX's CPU is deterministic
    tensorflow = keras.backend.backend() == "tensorflow"
    if distribute == "mirrored" and not tensorflow:
        raise UsageError(
            f"is tf.distribute's, on TensorFlow, not {keras.backend.backend()}: "
            "use --distribute data or heads (keras.distribution)",
            "--distribute mirrored",
        )
    with op_determinism(deterministic and tensorflow):
        chosen = strategy(distribute) if tensorflow else None
        x_train, y_train = data.x_train, data.y_train
        x_val, y_val = data.x_val, data.y_val
        if settings.shift_augment:
            x_train, y_train = shift_augment(x_train, y_train)
        try:
            with chosen.scope() if chosen is not None else contextlib.nullcontext():
                model = trained = build_classifier(config)
                if distribute in MESH_DISTRIBUTE:  # keras.distribution (JAX), set until finally
                    trained, kept, mesh = on_mesh(
                        model, distribute, settings.batch_size, len(x_train), len(x_val)
                    )
                    x_train, y_train = x_train[: kept[0]], y_train[: kept[0]]
                    x_val, y_val = x_val[: kept[1]], y_val[: kept[1]]
                trained.compile(
                    optimizer=keras.optimizers.Adam(learning_rate(settings, len(x_train))),
                    loss="sparse_categorical_crossentropy",
                    metrics=["accuracy"],
                )
            stopper = keras.callbacks.EarlyStopping(
                monitor="val_loss", patience=settings.patience, restore_best_weights=True
            )
            start = time.perf_counter()
            history = trained.fit(
                x_train,
                y_train,
                validation_data=(x_val, y_val),
                epochs=settings.epochs,
                batch_size=settings.batch_size,
                shuffle=True,
                callbacks=[stopper],
                verbose=verbose,
            )
            if mesh:
                model.set_weights(trained.get_weights())  # gathered from the devices
        finally:
            if mesh:
                keras.distribution.set_distribution(before)
        seconds = time.perf_counter() - start
        test_probs = model.predict(data.x_test, batch_size=256, verbose=0).astype("float32")
        val_probs = model.predict(data.x_val, batch_size=256, verbose=0)
    return Fitted(
        model=model,
        history={k: [float(v) for v in values] for k, values in history.history.items()},
        best_epoch=int(stopper.best_epoch) + 1,
        train_seconds=seconds,
        train_augmented=len(y_train),
        # data replicas: the batch axis's devices under a mesh (heads 2 x 4: 2)
        replicas=mesh["mesh"]["batch"] if mesh else chosen.num_replicas_in_sync if chosen else 1,
        test_probs=test_probs,
        val_probs=val_probs,
        mesh=mesh,
    )


def on_mesh(model, kind: str, batch_size: int, *rows: int, local: int | None = None):
    """`model` (built) cloned under `kind`'s distribution over every device
    (`keras_mha.distribution.training_distribution`, JAX), which stays set
    until the caller resets it: (the clone with `model`'s weights, the rows
    of each of `rows`' arrays to keep, what metrics.json says of it).

    Every batch is split over the batch axis, the last one of each array
    too: an array whose last batch the batch devices do not divide loses its
    last rows (fewer than those devices; `rows_left_out`). UsageError (one
    line) for another backend, a batch size the batch axis does not divide,
    or heads no count above 1 divides with the devices. `local`: each
    process's devices, in a job of several processes."""
    import keras

    from keras_mha.distribution import rows_left_out, training_distribution

    flag = f"--distribute {kind}"
    check_backend_distributes(kind)
    try:
        distribution, (batch_devices, model_devices) = training_distribution(
            model, kind, local=local
        )
    except ValueError as error:
        raise UsageError(str(error), flag) from None
    if batch_size % batch_devices:
        raise UsageError(
            f"{batch_size} rows a batch do not split over the {batch_devices} devices of "
            f"the batch axis; use a multiple of {batch_devices}",
            "--batch-size",
        )
    left_out = [rows_left_out(n, batch_size, batch_devices) for n in rows]
    if any(lost == n for lost, n in zip(left_out, rows)):
        raise UsageError(
            f"{min(rows)} rows do not split over the {batch_devices} devices of the batch axis",
            flag,
        )
    keras.distribution.set_distribution(distribution)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    split = sum(  # what the layout actually split: weights on the model axis
        1 for v in clone.weights if "model" in tuple(getattr(v.value.sharding, "spec", ()))
    )
    return (
        clone,
        [n - lost for n, lost in zip(rows, left_out)],
        {
            "devices": batch_devices * model_devices,
            "mesh": {"batch": batch_devices, "model": model_devices},
            "rows_left_out": left_out,  # of each array, in the caller's order
            "weights_split": int(split),  # over the model axis (0: data parallel)
        },
    )


def check_backend_distributes(kind: str) -> None:
    """UsageError (one line) unless Keras runs on JAX, where keras.distribution shards."""
    import keras

    if keras.backend.backend() != "jax":
        raise UsageError(
            f"Keras's distribution API shards on JAX, not {keras.backend.backend()}: "
            "run with KERAS_BACKEND=jax (the JAX venv, make backend-venvs)",
            f"--distribute {kind}",
        )
