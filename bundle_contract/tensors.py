"""A model input or output: `TensorSpec`, and the one quantize and dequantize.

The same class describes a tensor in `manifest.json` (`to_json`, `from_json`)
and as an interpreter reports it (`from_detail`), so the two compare field by
field (`differences`). The arithmetic is docs/artifacts.md's:

    q = clip(round_half_away_from_zero(x / scale) + zero_point)    # quantize
    x = (q - zero_point) * scale                                   # dequantize

with the quotient in float32, as TFLite's QUANTIZE kernel computes it
(numpy's `round` rounds half to even, which is not what the kernel does).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .fields import Fields

DTYPES = ("float32", "float16", "int8", "uint8", "int16", "int32", "int64")
# A quantization scale the arithmetic stays finite with (float32's normal range,
# with room for the quotient): real scales are ~1e-6 to ~1.
MIN_SCALE = 1e-30
MAX_SCALE = 1e30


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Name, shape, dtype and `(scale, zero_point)` of a model input or output.

    `scale` and `zero_point` are None for a tensor that is not quantized
    (float tensors, and integer token ids).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy's name: "float32", "int8", ...
    scale: float | None = None
    zero_point: int | None = None

    @property
    def quantized(self) -> bool:
        return self.scale is not None

    @classmethod
    def from_detail(cls, detail: dict) -> TensorSpec:
        """From an interpreter's `get_input_details()` / `get_output_details()` entry."""
        scale, zero_point = detail["quantization"]
        dtype = np.dtype(detail["dtype"])
        quantized = bool(scale) and dtype.kind in "iu"
        return cls(
            str(detail.get("name", "")),
            tuple(int(d) for d in detail["shape"]),
            dtype.name,
            float(scale) if quantized else None,
            int(zero_point) if quantized else None,
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale": self.scale,
            "zero_point": self.zero_point,
        }

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str, prefix: str = "") -> TensorSpec:
        """`data[key]` of a manifest, validated; errors name `prefix + key`."""
        entry = fields.obj(data, key, prefix)
        prefix = f"{prefix}{key}."
        dtype = fields.string(entry, "dtype", prefix)
        if dtype not in DTYPES:
            raise fields.fail(
                prefix + "dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}"
            )
        scale = fields.get(entry, "scale", prefix)
        zero_point = fields.get(entry, "zero_point", prefix)
        if (scale is None) != (zero_point is None):
            raise fields.fail(prefix + "scale", "and 'zero_point' must both be null or both be set")
        if scale is not None:
            scale = fields.number(entry, "scale", prefix)
            if scale <= 0:
                raise fields.fail(prefix + "scale", f"must be positive, got {scale!r}")
            if dtype.startswith("float"):
                raise fields.fail(prefix + "scale", f"must be null for a {dtype} tensor")
            if dtype not in ("int8", "uint8", "int16", "int32"):
                raise fields.fail(prefix + "scale", f"must be null for a {dtype} tensor")
            info = np.iinfo(dtype)
            zero_point = fields.integer(
                entry, "zero_point", prefix, minimum=int(info.min), maximum=int(info.max)
            )
            if not MIN_SCALE <= scale <= MAX_SCALE:
                raise fields.fail(
                    prefix + "scale", f"must be from {MIN_SCALE:g} to {MAX_SCALE:g}, got {scale!r}"
                )
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > 1000):
            raise fields.fail(prefix + "name", "must be a string of at most 1000 characters")
        return cls(
            "" if name is None else name,
            fields.shape(entry, "shape", prefix),
            dtype,
            scale,
            zero_point,
        )

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Samples as this tensor takes them: quantized if it has a scale, else cast.

        Raises ValueError for floats given to an unquantized integer tensor
        (token ids must already be ids).
        """
        dtype = np.dtype(self.dtype)
        x = np.asarray(x)
        if self.scale is not None and self.zero_point is not None:
            info = np.iinfo(dtype)
            with np.errstate(all="ignore"):  # an overflow saturates, as the kernel's clip does
                scaled = (x.astype(np.float32) / np.float32(self.scale)).astype(np.float64)
                rounded = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)
                rounded = np.nan_to_num(rounded, nan=0.0)
                return np.clip(rounded + self.zero_point, info.min, info.max).astype(dtype)
        if dtype.kind in "iu" and x.dtype.kind == "f":
            raise ValueError(f"an unquantized {dtype.name} input takes ids, not {x.dtype.name}")
        return np.ascontiguousarray(x, dtype=dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """Raw values as float32: `(q - zero_point) * scale`, or a cast if not quantized."""
        q = np.asarray(q)
        if self.scale is None or self.zero_point is None:
            return q.astype(np.float32)
        with np.errstate(all="ignore"):
            return (q.astype(np.float32) - np.float32(self.zero_point)) * np.float32(self.scale)

    def differences(self, other: TensorSpec) -> list[str]:
        """What differs from `other` (shape, dtype, quantization; not the name), as 'this vs other'."""
        found = []
        if self.shape != other.shape:
            found.append(f"shape {list(self.shape)} vs {list(other.shape)}")
        if self.dtype != other.dtype:
            found.append(f"dtype {self.dtype} vs {other.dtype}")
        if (self.scale is None) != (other.scale is None):
            found.append(f"scale {self.scale} vs {other.scale}")
        elif self.scale is not None and other.scale is not None:
            if not (
                math.isfinite(self.scale)
                and math.isfinite(other.scale)
                and abs(self.scale - other.scale) <= 1e-6 * abs(other.scale)
            ):
                found.append(f"scale {self.scale:.9g} vs {other.scale:.9g}")
            if self.zero_point != other.zero_point:
                found.append(f"zero_point {self.zero_point} vs {other.zero_point}")
        return found
