"""How sure a change in accuracy is (paired bootstrap on one test set); per-cue accuracy;
Spearman's rank correlation of two head scorings."""

from __future__ import annotations

import numpy as np


def paired_drop(
    correct_before: np.ndarray, correct_after: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> dict:
    """How much accuracy a change cost on one test set, and how sure that is.

    `correct_*` are per-example booleans on the same examples. Returns the
    drop in percentage points, the examples `lost` (right before, wrong
    after) and `gained`, and a 95 % paired bootstrap interval of the drop:
    the examples are resampled with replacement, the same draw for both.
    """
    before = np.asarray(correct_before, bool)
    after = np.asarray(correct_after, bool)
    if before.shape != after.shape or before.ndim != 1 or not len(before):
        raise ValueError(
            "paired_drop needs two 1-D boolean arrays of the same, non-zero length; "
            f"got shapes {before.shape} and {after.shape}"
        )
    diff = before.astype("float64") - after.astype("float64")
    picks = np.random.default_rng(seed).integers(0, len(diff), (resamples, len(diff)))
    drops = 100.0 * diff[picks].mean(axis=1)
    low, high = np.percentile(drops, [2.5, 97.5])
    return {
        "points": float(100.0 * diff.mean()),
        "lost": int((before & ~after).sum()),
        "gained": int((~before & after).sum()),
        "examples": len(diff),
        "ci95_points": [float(low), float(high)],
        "resamples": resamples,
    }


def cue_accuracy(probs: np.ndarray, y: np.ndarray, cues) -> dict[str, float]:
    """Accuracy per cue (pronouns: `number`, `semantic`, `both`)."""
    cues = np.asarray(cues).astype(str)
    correct = probs.argmax(-1) == y
    return {str(c): float(correct[cues == c].mean()) for c in sorted(set(cues.tolist()))}


def spearman(a, b) -> float:
    """Spearman's rank correlation of two score lists (per-layer arrays are flattened)."""
    a = np.concatenate([np.ravel(v) for v in a]) if isinstance(a, list) else np.ravel(a)
    b = np.concatenate([np.ravel(v) for v in b]) if isinstance(b, list) else np.ravel(b)

    def ranks(v):
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):  # ties share their mean rank
            tied = v == value
            r[tied] = r[tied].mean()
        return r

    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])
