"""Training-set augmentation: one-pixel shifted copies of the digit images."""

from __future__ import annotations

import numpy as np


def shift_augment(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`x` plus copies shifted one pixel up, down, left and right (zero fill).

    Args:
        x: images `(N, H, W)`.
        y: their labels `(N,)`.

    Returns:
        `(5N, H, W)` images (the originals first) and their labels.
    """
    copies = [x]
    for axis in (1, 2):
        for step in (1, -1):
            shifted = np.roll(x, step, axis=axis)
            edge = [slice(None)] * x.ndim
            edge[axis] = 0 if step == 1 else -1
            shifted[tuple(edge)] = 0.0
            copies.append(shifted)
    return np.concatenate(copies).astype(x.dtype), np.tile(y, len(copies))
