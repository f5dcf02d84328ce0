"""Head importance after Michel, Levy & Neubig (2019): I_h = E_x |dL(x) / d xi_h|.

Each head h gets a mask xi_h on its output (1 = on); its importance is the
mean absolute gradient of the loss with respect to it, over a split that is
not the test split, normalised per layer by the L2 norm.
"""

from __future__ import annotations

import numpy as np

from bundle_contract.errors import UsageError
from keras_mha.heads.masks import all_heads_on

SPLITS = ("train", "validation")


def scoring_data(dataset, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The labelled non-test examples heads are scored on: `split` of `dataset`.

    `train` is the training split as drawn, before any augmentation.
    """
    if split == "validation":
        return dataset.x_val, dataset.y_val
    if split == "train":
        return dataset.x_train, dataset.y_train
    raise UsageError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")


def head_importance(
    model,
    x: np.ndarray,
    y: np.ndarray,
    head_masks: list[np.ndarray] | None = None,
    batch_size: int = 128,
) -> list[np.ndarray]:
    """I_h = mean over examples of |dL/d xi_h|, L2-normalised per layer.

    The masks are per example, `(B, h)`, so one backward pass gives every
    example's own gradient. Heads whose mask is 0 (already pruned) score 0.
    TensorFlow only (a GradientTape).
    """
    import tensorflow as tf

    from keras_mha.model import forward

    head_masks = head_masks if head_masks is not None else all_heads_on(model)
    totals = [np.zeros_like(m, dtype="float64") for m in head_masks]
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size]
        yb = y[start : start + batch_size]
        xi = [tf.Variable(np.tile(m[None, :], (len(xb), 1))) for m in head_masks]
        with tf.GradientTape() as tape:
            probs = forward(model, xb, head_masks=xi)
            picked = tf.gather(probs, yb, axis=1, batch_dims=1)
            loss = -tf.reduce_sum(tf.math.log(tf.maximum(picked, 1e-12)))
        for total, grad in zip(totals, tape.gradient(loss, xi)):
            total += np.abs(grad.numpy()).sum(axis=0)
    scores = []
    for total, mask in zip(totals, head_masks):
        score = (total / len(x)) * (mask > 0)
        norm = np.linalg.norm(score)
        scores.append((score / norm if norm > 0 else score).astype("float32"))
    return scores


def rank_heads(
    scores: list[np.ndarray], head_masks: list[np.ndarray] | None = None
) -> list[tuple[int, int]]:
    """(layer, head) pairs still on, least important first."""
    items = []
    for layer, score in enumerate(scores):
        for head, value in enumerate(score):
            if head_masks is None or head_masks[layer][head] > 0:
                items.append((float(value), layer, head))
    return [(layer, head) for _, layer, head in sorted(items)]
