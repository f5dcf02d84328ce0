"""Parity with the float Keras model, and the one threshold check.

`measure(probs, y, reference)` gives a mode's figures on eval.npz;
`Thresholds.failures(parity, float_accuracy)` says which thresholds it
misses. Export's verification and the device's run call exactly these, so a
mode export calls verified passes on the device by construction. A NaN (or
infinite) output makes every figure NaN, and NaN misses every threshold.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .fields import Fields

_EPS = 1e-9  # slack when comparing ratios of sample counts: 199/200 meets 0.995


@dataclasses.dataclass(frozen=True)
class Parity:
    """A mode against the float Keras model on eval.npz (NaN when unknown)."""

    accuracy: float
    agreement: float  # top-1 agreement with eval.npz `probs`
    max_abs_diff: float  # max |Δprob|
    mean_abs_diff: float

    def to_json(self) -> dict:
        return {k: (v if math.isfinite(v) else None) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, data: object) -> Parity | None:
        """Lenient: figures are informative, so a malformed entry reads as None."""
        if not isinstance(data, dict):
            return None
        values = [data.get(f.name) for f in dataclasses.fields(cls)]
        if not all(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values
        ):
            return None
        return cls(*(math.nan if v is None else float(v) for v in values))


def measure(probs: np.ndarray, y: np.ndarray, reference: np.ndarray) -> Parity:
    """Figures of `probs (N, C)` against labels `y (N,)` and the float model's `reference`."""
    probs = np.asarray(probs, np.float64)
    if not np.isfinite(probs).all():
        return Parity(math.nan, math.nan, math.nan, math.nan)
    diff = np.abs(probs - np.asarray(reference, np.float64))
    top = probs.argmax(-1)
    return Parity(
        accuracy=float((top == y).mean()),
        agreement=float((top == np.asarray(reference).argmax(-1)).mean()),
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
    )


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """What a mode must meet against eval.npz; a None field is not checked.

    `max_accuracy_drop` bounds `eval.float_accuracy - accuracy`.
    """

    max_abs_diff: float | None = None
    min_agreement: float | None = None
    max_accuracy_drop: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str, prefix: str = "") -> Thresholds:
        raw = fields.obj(data, key, prefix)
        if not raw:
            raise fields.fail(prefix + key, "is empty")
        known = [f.name for f in dataclasses.fields(cls)]
        for name in raw:
            if name not in known:
                raise fields.fail(
                    prefix + key, f"has unknown key {name!r} (known: {', '.join(known)})"
                )
        return cls(**{name: fields.number(raw, name, f"{prefix}{key}.") for name in raw})

    def failures(self, parity: Parity, float_accuracy: float) -> list[str]:
        """The thresholds `parity` misses, one readable line each; NaN misses every one."""
        found = []
        if self.max_abs_diff is not None and not parity.max_abs_diff <= self.max_abs_diff:
            found.append(f"max |Δprob| {parity.max_abs_diff:.3g} > {self.max_abs_diff:.3g}")
        if self.min_agreement is not None and not parity.agreement >= self.min_agreement - _EPS:
            found.append(f"agreement {parity.agreement:.4f} < {self.min_agreement:.4f}")
        if self.max_accuracy_drop is not None:
            drop = float_accuracy - parity.accuracy
            if not drop <= self.max_accuracy_drop + _EPS:
                found.append(
                    f"accuracy {parity.accuracy:.4f} is {drop:.4f} below the float "
                    f"{float_accuracy:.4f} (> {self.max_accuracy_drop:.4f})"
                )
        return found

    def describe(self) -> str:
        """A short table cell: `agree≥0.995, drop≤0.005`."""
        parts = []
        if self.max_abs_diff is not None:
            parts.append(f"|Δp|≤{self.max_abs_diff:.0e}")
        if self.min_agreement is not None:
            parts.append(f"agree≥{self.min_agreement:g}")
        if self.max_accuracy_drop is not None:
            parts.append(f"drop≤{self.max_accuracy_drop:g}")
        return ", ".join(parts)


_QUANTIZED = Thresholds(min_agreement=0.995, max_accuracy_drop=0.005)
# What export writes into each mode's `thresholds` (docs/artifacts.md).
DEFAULT_THRESHOLDS: dict[str, Thresholds] = {
    "float32": Thresholds(max_abs_diff=1e-5),
    "float16": Thresholds(max_abs_diff=1e-2),
    "dynamic": _QUANTIZED,
    "int8": _QUANTIZED,
    "int16x8": _QUANTIZED,
}
