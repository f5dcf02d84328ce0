"""A run's settings, validated before anything is trained (bad input: `UsageError`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bundle_contract.errors import UsageError, one_line
from keras_mha import data as datasets
from keras_mha.train.presets import (
    DISTRIBUTE,
    MESH_DISTRIBUTE,
    PRESETS,
    TrainSettings,
    dataset_shape,
)

if TYPE_CHECKING:
    from keras_mha.model import ModelConfig

# ModelConfig fields the dataset decides (not options of a run).
FIXED_FIELDS = ("input_kind", "sequence_length", "feature_dim", "num_classes", "seed")


def _check_positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise UsageError(f"{name} must be a positive integer. Received: {name}={value!r}")


def resolve_settings(
    dataset: str,
    seed: int = 0,
    epochs: int | None = None,
    batch_size: int | None = None,
    learning_rate: float | None = None,
    patience: int | None = None,
    shift_augment: bool | None = None,
    model_options: dict | None = None,
    distribute: str | None = None,
) -> tuple[ModelConfig, TrainSettings]:
    """The validated model configuration and training settings of a run.

    `None` keeps the dataset's preset (`PRESETS`); `model_options` are
    ModelConfig fields (d_model, num_heads, ...).

    Raises:
        UsageError: Unknown dataset or strategy, bad numbers, an invalid
            ModelConfig.
    """
    if dataset not in PRESETS:
        raise UsageError(
            f"Unknown dataset {dataset!r}; expected one of {', '.join(datasets.DATASETS)}."
        )
    if distribute not in (None, *DISTRIBUTE, *MESH_DISTRIBUTE):
        kinds = ", ".join((*DISTRIBUTE, *MESH_DISTRIBUTE))
        raise UsageError(f"Unknown distribution strategy {distribute!r}; expected one of {kinds}.")
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("patience", patience)):
        _check_positive(name, value)
    if learning_rate is not None and not learning_rate > 0:  # NaN too
        raise UsageError(
            f"learning_rate must be positive. Received: learning_rate={learning_rate!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer. Received: seed={seed!r}")
    model_defaults, settings = PRESETS[dataset]
    if shift_augment and dataset != "digits":
        raise UsageError(f"Shift augmentation is for images (digits), not {dataset!r}.")
    overrides = {
        "epochs": epochs,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "patience": patience,
        "shift_augment": shift_augment,
    }
    settings = dataclasses.replace(
        settings, **{k: v for k, v in overrides.items() if v is not None}
    )
    from keras_mha.model import ModelConfig

    options = {k: v for k, v in (model_options or {}).items() if v is not None}
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(model_options or {}) - (fields - set(FIXED_FIELDS)))
    if unknown:
        raise UsageError(f"Unknown model option(s): {', '.join(unknown)}.")
    config = ModelConfig(**dataset_shape(dataset), seed=seed, **{**model_defaults, **options})
    try:
        config.validate()
    except ValueError as error:
        raise UsageError(one_line(error)) from None
    return config, settings
