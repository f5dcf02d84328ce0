"""Head masks: one `(h,)` multiplier per layer on each head's output (1 = on, 0 = off).

The name is the layer's call argument, `head_mask`: a list of them, one per
encoder block, is `head_masks` (`keras_mha.model.forward(..., head_masks=)`).
"""

from __future__ import annotations

import numpy as np


def heads_per_layer(model) -> list[int]:
    """Heads of each encoder block of a classifier."""
    from keras_mha.model import attention_layers

    return [layer.num_heads for layer in attention_layers(model)]


def all_heads_on(model, value: float = 1.0) -> list[np.ndarray]:
    """Head masks with every head at `value` (float32 `(h,)` per layer)."""
    return [np.full((h,), value, "float32") for h in heads_per_layer(model)]


def as_removal(pairs) -> dict[int, list[int]]:
    """`[(layer, head), ...]` as `{layer: [head, ...]}` (what `prune_model` takes)."""
    remove: dict[int, list[int]] = {}
    for layer, head in pairs:
        remove.setdefault(int(layer), []).append(int(head))
    return remove


def predict(
    model, x: np.ndarray, head_masks: list[np.ndarray] | None = None, batch_size: int = 256
) -> np.ndarray:
    """Softmax outputs `(N, C)`, with optional head masks."""
    from keras import ops

    from keras_mha.model import forward

    out = []
    for start in range(0, len(x), batch_size):
        probs = forward(model, x[start : start + batch_size], head_masks=head_masks)
        out.append(ops.convert_to_numpy(probs))
    return np.concatenate(out)


def accuracy(model, x: np.ndarray, y: np.ndarray, head_masks=None) -> float:
    return float((predict(model, x, head_masks).argmax(-1) == y).mean())
