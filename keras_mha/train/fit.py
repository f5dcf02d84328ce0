"""Fit the classifier: the optimizer, its schedule, the strategy, early stopping."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from bundle_contract.errors import UsageError, one_line
from keras_mha.train.augment import shift_augment
from keras_mha.train.determinism import op_determinism
from keras_mha.train.presets import TrainSettings  # noqa: TC001

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
        import tensorflow as tf

        if isinstance(error, tf.errors.ResourceExhaustedError):
            raise UsageError(
                f"out of memory while training: {one_line(error.message)[:200]}"
            ) from None
        raise


def _fit(data, config, settings, distribute, verbose, deterministic) -> Fitted:
    import keras

    from keras_mha.model import build_classifier

    keras.utils.set_random_seed(config.seed)
    with op_determinism(deterministic):
        chosen = strategy(distribute)
        x_train, y_train = data.x_train, data.y_train
        if settings.shift_augment:
            x_train, y_train = shift_augment(x_train, y_train)
        with chosen.scope():
            model = build_classifier(config)
            model.compile(
                optimizer=keras.optimizers.Adam(learning_rate(settings, len(x_train))),
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"],
            )
        stopper = keras.callbacks.EarlyStopping(
            monitor="val_loss", patience=settings.patience, restore_best_weights=True
        )
        start = time.perf_counter()
        history = model.fit(
            x_train,
            y_train,
            validation_data=(data.x_val, data.y_val),
            epochs=settings.epochs,
            batch_size=settings.batch_size,
            shuffle=True,
            callbacks=[stopper],
            verbose=verbose,
        )
        seconds = time.perf_counter() - start
        test_probs = model.predict(data.x_test, batch_size=256, verbose=0).astype("float32")
        val_probs = model.predict(data.x_val, batch_size=256, verbose=0)
    return Fitted(
        model=model,
        history={k: [float(v) for v in values] for k, values in history.history.items()},
        best_epoch=int(stopper.best_epoch) + 1,
        train_seconds=seconds,
        train_augmented=len(y_train),
        replicas=chosen.num_replicas_in_sync,
        test_probs=test_probs,
        val_probs=val_probs,
    )
