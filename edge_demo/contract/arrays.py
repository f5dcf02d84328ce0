"""`eval.npz` and `calibration.npz`: their arrays, read and checked in one place.

Numpy only. Used by the device (the bundle's `eval.npz`), by export (the run
directory's, before anything is converted) and by the run directory type.

- `read_npz(path, keys)`: the named arrays of an `.npz`, no pickles.
- `check_eval(x, y, probs, where)`: `x` a non-empty numeric batch, finite;
  `y` integer labels `(N,)`; `probs` float `(N, C)`, C >= 2, finite, >= 0,
  each row summing to 1 within `PROB_SUM_TOLERANCE`, labels in 0..C-1.
- `check_inputs(x, where, name)`: model inputs (calibration): a non-empty
  numeric batch, finite, optionally of a given per-sample shape and dtype.

Every problem is a `UsageError` naming the file and the array.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from typing import IO

import numpy as np

from ..errors import UsageError

# A float32 softmax row sums to 1 within ~1e-6 per class; x3 or log-probs are far off.
PROB_SUM_TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class EvalData:
    """`eval.npz`: inputs, labels and the float Keras model's softmax (the reference)."""

    x: np.ndarray  # (N, ...) model inputs
    y: np.ndarray  # (N,) int64 labels
    probs: np.ndarray  # (N, C) float32

    @property
    def num_classes(self) -> int:
        return int(self.probs.shape[1])

    @property
    def float_accuracy(self) -> float:
        """Accuracy of the reference `probs` against `y`."""
        return float((self.probs.argmax(-1) == self.y).mean())


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype.name} {list(array.shape)}"


def read_npz(
    source: str | os.PathLike | IO[bytes],
    keys: tuple[str, ...],
    where: str | os.PathLike | None = None,
) -> dict[str, np.ndarray]:
    """The arrays `keys` of an `.npz` (a path or an open binary file), no pickles.

    `where` names the file in messages (default: `source`).
    """
    where = source if where is None else where
    if not zipfile.is_zipfile(source):
        raise UsageError("not a readable .npz file (not a zip archive)", where)
    if not isinstance(source, (str, os.PathLike)):
        source.seek(0)
    try:
        with np.load(source, allow_pickle=False) as npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise UsageError(
                    f"missing array(s) {', '.join(missing)} (needs {', '.join(keys)}; "
                    f"has {', '.join(npz.files) or 'none'})",
                    where,
                )
            return {k: npz[k] for k in keys}
    except UsageError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise UsageError(f"not a readable .npz file ({exc})", where) from None


def check_inputs(
    x: np.ndarray,
    where: str | os.PathLike,
    name: str = "x",
    sample_shape: tuple[int, ...] | None = None,
    dtype: str | None = None,
) -> np.ndarray:
    """`x` as a batch of model inputs: non-empty, numeric, finite, of the given form."""
    if x.ndim < 2 or x.shape[0] == 0:
        raise UsageError(f"{name} must be a non-empty batch (N, ...), got {_describe(x)}", where)
    if x.dtype.kind not in "fiu":
        raise UsageError(f"{name} must hold numbers, got {_describe(x)}", where)
    if sample_shape is not None or dtype is not None:
        shape_ok = sample_shape is None or tuple(x.shape[1:]) == tuple(sample_shape)
        if not shape_ok or (dtype is not None and x.dtype.name != dtype):
            want = ", ".join(str(d) for d in (sample_shape or x.shape[1:]))
            raise UsageError(
                f"{name} is {_describe(x)} but the model takes {dtype or x.dtype.name} (N, {want})",
                where,
            )
    if x.dtype.kind == "f":
        bad = ~np.isfinite(x)
        if bad.all():
            raise UsageError(f"{name} is all NaN or infinite", where)
        if bad.any():
            raise UsageError(f"{name} has {int(bad.sum())} NaN or infinite value(s)", where)
    return x


def check_probabilities(probs: np.ndarray, where: str | os.PathLike, name: str = "probs") -> None:
    """Rows of probabilities: float `(N, C)`, C >= 2, finite, >= 0, each summing to 1."""
    if probs.ndim != 2 or probs.shape[1] < 2 or probs.dtype.kind != "f":
        raise UsageError(f"{name} must be float (N, classes >= 2), got {_describe(probs)}", where)
    if not np.isfinite(probs).all():
        raise UsageError(f"{name} has NaN or infinite values", where)
    if (probs < 0).any():
        raise UsageError(
            f"{name} has negative values (min {probs.min():.4g}): not probabilities "
            "(log-probabilities or logits?)",
            where,
        )
    sums = probs.astype(np.float64).sum(-1)
    worst = int(np.abs(sums - 1).argmax())
    if abs(sums[worst] - 1) > PROB_SUM_TOLERANCE:
        raise UsageError(
            f"{name} rows must sum to 1 (softmax outputs); row {worst} sums to {sums[worst]:.6g}",
            where,
        )


def check_eval(
    x: np.ndarray, y: np.ndarray, probs: np.ndarray, where: str | os.PathLike
) -> EvalData:
    """`eval.npz`'s arrays, checked together; returns them as EvalData (y int64, probs float32)."""
    check_inputs(x, where, "x")
    n = x.shape[0]
    if y.shape != (n,) or y.dtype.kind not in "iu":
        raise UsageError(f"y must be integer labels of shape [{n}], got {_describe(y)}", where)
    if probs.ndim != 2 or probs.shape[0] != n:
        raise UsageError(
            f"probs must be float of shape [{n}, classes], got {_describe(probs)}", where
        )
    check_probabilities(probs, where)
    c = probs.shape[1]
    if y.min() < 0 or y.max() >= c:
        raise UsageError(f"y has labels outside 0..{c - 1} (found {y.min()}..{y.max()})", where)
    return EvalData(x, y.astype(np.int64), probs.astype(np.float32))
