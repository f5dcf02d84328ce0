"""Which heads to remove: greedy, least important first, importance recomputed as heads go."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from bundle_contract.errors import UsageError
from keras_mha.heads.importance import head_importance, rank_heads
from keras_mha.heads.masks import accuracy, all_heads_on, as_removal
from keras_mha.heads.reconstruction import reconstruct, trace
from keras_mha.heads.surgery import prune_model

if TYPE_CHECKING:
    from keras_mha.model import ModelConfig


def count_heads(fraction: float, total: int) -> int:
    """Heads in `fraction` of `total`, rounded half up."""
    return int(fraction * total + 0.5 + 1e-9)


def _next_head(scores, head_masks) -> tuple[int, int] | None:
    """The least important head still on in a layer that keeps another one."""
    candidates = [c for c in rank_heads(scores, head_masks) if head_masks[c[0]].sum() > 1]
    return candidates[0] if candidates else None


def check_fraction(fraction: float, sizes: list[int]) -> int:
    """How many heads `fraction` of them is (round(fraction * heads)), for layers of
    `sizes` heads; ValueError if it is not in [0, 1) or would empty a layer."""
    if not 0.0 <= fraction < 1.0:
        raise UsageError(f"the fraction of heads to remove must be in [0, 1); got {fraction}")
    total = sum(sizes)
    target = count_heads(fraction, total)
    if target > total - len(sizes):
        raise UsageError(
            f"removing a fraction of {fraction} is {target} of {total} heads, which would leave "
            f"a layer with no head (heads per layer: {list(sizes)}; at most "
            f"{total - len(sizes)} can go)"
        )
    return target


def select_heads_to_prune(model, x_score, y_score, fraction: float) -> list[tuple[int, int]]:
    """The greedy selection of `pruning_curve`, up to round(fraction * heads).

    Importance is recomputed after every head; a layer's last head is never
    a candidate, so a fraction is refused only if it needs more heads than
    every layer but one head each.
    """
    head_masks = all_heads_on(model)
    target = check_fraction(fraction, [len(m) for m in head_masks])
    pruned: list[tuple[int, int]] = []
    while len(pruned) < target:
        layer, head = _next_head(head_importance(model, x_score, y_score, head_masks), head_masks)
        head_masks[layer][head] = 0.0
        pruned.append((layer, head))
    return pruned


def pruning_curve(
    model,
    config: ModelConfig,
    x_score: np.ndarray,
    y_score: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    step: float = 0.1,
    x_reconstruct: np.ndarray | None = None,
) -> list[dict]:
    """The paper's greedy curve: repeatedly drop the next `step` of all heads.

    Importance is recomputed on `x_score, y_score` (a non-test split) after
    every step, on the model with the pruned heads masked off; accuracy is on
    the test split. With `x_reconstruct` (a training split), each point also
    has `accuracy_reconstructed`: the pruned model (`config` is `model`'s)
    after `reconstruct`.
    """
    head_masks = all_heads_on(model)
    total = sum(len(m) for m in head_masks)
    teacher = None if x_reconstruct is None else trace(model, x_reconstruct)

    def point(pruned: list[tuple[int, int]]) -> dict:
        result = {
            "fraction": len(pruned) / total,
            "pruned": [list(p) for p in pruned],
            "accuracy": accuracy(model, x_test, y_test, head_masks),
        }
        if x_reconstruct is not None:
            smaller, _ = prune_model(model, as_removal(pruned), config)
            reconstruct(model, smaller, x_reconstruct, teacher=teacher)
            result["accuracy_reconstructed"] = accuracy(smaller, x_test, y_test)
        return result

    points = [point([])]
    pruned: list[tuple[int, int]] = []
    for k in range(1, int(1.0 / step + 1e-9) + 1):
        target = count_heads(k * step, total)
        if target <= len(pruned):
            continue
        scores = head_importance(model, x_score, y_score, head_masks)
        progressed = False
        while len(pruned) < target:
            pick = _next_head(scores, head_masks)
            if pick is None:  # every layer is down to its last head
                break
            head_masks[pick[0]][pick[1]] = 0.0
            pruned.append(pick)
            progressed = True
        if not progressed:
            break
        points.append(point(pruned))
    return points
