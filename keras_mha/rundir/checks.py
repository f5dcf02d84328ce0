"""What a run directory's contents must satisfy, each check one line naming file and array.

Array checks the device makes too (probabilities, finite inputs) are
`bundle_contract.arrays`'s; these add what only the run knows: its model
configuration (classes, input shape and dtype, vocabulary size, heads).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from bundle_contract import arrays
from bundle_contract.errors import UsageError, one_line
from bundle_contract.fields import parse_json
from bundle_contract.lists import parse_labels

if TYPE_CHECKING:
    import keras

    from keras_mha.model import ModelConfig

METRICS_KEYS = ("dataset", "seed", "config", "test_accuracy")


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """eval.npz: held-out inputs `x`, labels `y`, the float model's `probs`.

    `extras` holds the per-example arrays of text datasets (`cue`, `nouns`,
    `text`).
    """

    x: np.ndarray  # (N, ...) model inputs
    y: np.ndarray  # (N,) int32 labels
    probs: np.ndarray  # (N, C) float32 softmax of the float Keras model on x
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return int(self.probs.shape[1])

    @property
    def correct(self) -> np.ndarray:
        return self.probs.argmax(-1) == self.y

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())

    def with_probs(self, probs: np.ndarray) -> EvalSet:
        """The same examples with another model's outputs (a pruned run)."""
        return dataclasses.replace(self, probs=np.asarray(probs, "float32"))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"x": self.x, "y": self.y, "probs": self.probs, **self.extras}


def check_eval(ev: EvalSet, where: str | os.PathLike = "eval.npz") -> None:
    """`probs` are probabilities for `x`'s examples, `y` labels among them.

    The device's own check (`bundle_contract.arrays.check_eval`), plus the
    per-example arrays of text datasets.
    """
    arrays.check_eval(ev.x, ev.y, ev.probs, where)
    for key, value in ev.extras.items():
        if len(value) != len(ev.x):
            raise UsageError(f"array {key} has {len(value)} rows; x has {len(ev.x)}", where)


def input_spec(config: ModelConfig) -> tuple[tuple[int, ...], str]:
    """The (per-example shape, dtype) a model built from `config` takes."""
    if config.input_kind == "tokens":
        return (config.sequence_length,), "int32"
    return (config.sequence_length, config.feature_dim), "float32"


def check_inputs(
    x: np.ndarray,
    where: str | os.PathLike,
    name: str,
    *,
    shape: tuple[int, ...],
    dtype: str,
    vocab_size: int | None = None,
) -> None:
    """`x` (array `name` of `where`) is a finite batch of `dtype` `(N, *shape)` inputs.

    With `vocab_size` (token models), every id lies in `[0, vocab_size)`.
    `input_spec(config)` gives `shape` and `dtype` of a run's model.
    """
    arrays.check_inputs(x, where, name, sample_shape=shape, dtype=dtype)
    if vocab_size is not None and (x.min() < 0 or x.max() >= vocab_size):
        raise UsageError(
            f"array {name} holds token ids in [{x.min()}, {x.max()}]; "
            f"the vocabulary has {vocab_size}",
            where,
        )


def check_labels(labels: Any, num_classes: int, where: str | os.PathLike) -> list[str]:
    """Class names as the device reads them (`contract.lists.parse_labels`: strict JSON,
    printable names of at most 200 characters), from `labels.json`'s bytes or its
    decoded list."""
    raw = labels if isinstance(labels, bytes) else json.dumps(labels).encode("utf-8")
    decoded = parse_json(raw, where)
    if not isinstance(decoded, list) or not all(isinstance(v, str) for v in decoded):
        raise UsageError("expected a JSON list of class names", where)
    if len(decoded) != num_classes:
        raise UsageError(f"{len(decoded)} class names, but the model has {num_classes}", where)
    return list(parse_labels(raw, num_classes, where))


def check_vocab(vocab, config: ModelConfig, where: str | os.PathLike) -> None:
    """A tokens model's vocabulary: one token per embedding row, its sequence length."""
    if len(vocab.tokens) != config.feature_dim or vocab.max_length != config.sequence_length:
        raise UsageError(
            f"{len(vocab.tokens)} tokens, max_length {vocab.max_length}; the model takes "
            f"{config.feature_dim} token ids, {config.sequence_length} per input",
            where,
        )


def model_config(metrics: Any, where: str | os.PathLike = "metrics.json") -> ModelConfig:
    """The validated ModelConfig stored in metrics.json (`config`)."""
    from keras_mha.model import ModelConfig

    if not isinstance(metrics, dict):
        raise UsageError(f"expected a JSON object; got {type(metrics).__name__}", where)
    missing = [key for key in METRICS_KEYS if key not in metrics]
    if missing:
        raise UsageError(f"missing key(s): {', '.join(missing)}", where)
    if not isinstance(metrics["config"], dict):
        raise UsageError("key config must be an object (ModelConfig.to_dict())", where)
    try:
        config = ModelConfig.from_dict(metrics["config"])
        config.validate()
    except (TypeError, ValueError) as error:
        raise UsageError(f"key config: {one_line(error)}", where) from None
    return config


def check_model(model: keras.Model, config: ModelConfig, where: str | os.PathLike) -> None:
    """`model` is the one `config` describes: input shape and dtype, classes, blocks."""
    from keras_mha.model import encoder_blocks

    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if not inputs or not outputs or len(inputs) != 1 or len(outputs) != 1:
        raise UsageError("expected a Functional model with one input and one output", where)
    shape, dtype = input_spec(config)
    got = tuple(inputs[0].shape[1:])
    if got != shape or np.dtype(inputs[0].dtype).name != dtype:
        raise UsageError(
            f"the model takes {np.dtype(inputs[0].dtype).name} {got}; metrics.json's config "
            f"says {dtype} {shape}",
            where,
        )
    classes = tuple(outputs[0].shape)[1:]
    if classes != (config.num_classes,):
        raise UsageError(
            f"the model outputs {classes}; metrics.json's config says {config.num_classes}",
            where,
        )
    try:
        blocks = encoder_blocks(model)
    except ValueError as error:
        raise UsageError(one_line(error), where) from None
    if [b.attention.num_heads for b in blocks] != config.heads_per_layer():
        raise UsageError(
            f"heads per layer {[b.attention.num_heads for b in blocks]}; metrics.json's config "
            f"says {config.heads_per_layer()}",
            where,
        )
