"""The attention weights a bundle carries: `attention.npz` and the manifest's entries.

Every mode's model has a second signature, `view` (`SIGNATURE`), whose
outputs `attention_0` .. (`output_name`) are each layer's weights
`(1, h, T, S)`; the Keras model's attention outputs carry the same names
(keras_mha/model.py imports `output_name`). Export stores the float Keras
model's own weights for the first `samples` eval samples in `attention.npz`
(`AttentionReference`, `reference_bytes`, `load_reference`), and each mode's
entry says which signature to run and what it must meet (`AttentionCheck`).
What the check measures and its bounds are attention_parity.py's
(docs/artifacts.md). numpy and the standard library only.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib

import numpy as np

from ..errors import UsageError
from .arrays import BUNDLE_ARCHIVE_BYTES, BUNDLE_MEMBER_BYTES, NPY_HEADER_BYTES, read_npz
from .attention_parity import AttentionParity, AttentionThresholds
from .fields import Fields
from .files import read_inside

SIGNATURE = "view"  # the models' attention signature (export/convert.py)
FILE = "attention.npz"
# Reference samples stored: pronouns (8 heads, 16 x 16) is 2 MB per layer in
# float32 at 256 samples; float16 storage would round weights near 1 by
# 2.4e-4, too coarse for float32's 1e-5 bound.
MAX_SAMPLES = 256
MAX_LAYERS = 64
# Without a signature to size it by: pronouns' reference is 256 x 8 x 16 x 16.
MAX_LAYER_VALUES = 1 << 22


def output_name(layer: int) -> str:
    """The name of layer `layer`'s attention weights: the signature output, the
    `attention.npz` array and the Keras model's output (keras_mha/model.py)."""
    return f"attention_{layer}"


@dataclasses.dataclass(frozen=True)
class AttentionCheck:
    """A mode entry's `attention`: the signature to run, its thresholds, its figures."""

    signature: str
    thresholds: AttentionThresholds
    parity: AttentionParity | None = None

    def to_json(self) -> dict:
        return {
            "signature": self.signature,
            "thresholds": self.thresholds.to_json(),
            "parity": None if self.parity is None else self.parity.to_json(),
        }

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str, prefix: str) -> AttentionCheck:
        entry = fields.obj(data, key, prefix)
        prefix = f"{prefix}{key}."
        return cls(
            fields.string(entry, "signature", prefix),
            AttentionThresholds.from_json(fields, entry, "thresholds", prefix),
            AttentionParity.from_json(entry.get("parity")),
        )


@dataclasses.dataclass(frozen=True)
class AttentionReference:
    """The manifest's `attention`: the float model's weights of eval samples 0..samples-1."""

    file: str
    sha256: str
    samples: int
    layers: int
    dtype: str = "float32"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str) -> AttentionReference:
        entry = fields.obj(data, key)
        prefix = f"{key}."
        dtype = fields.string(entry, "dtype", prefix)
        if dtype != "float32":
            raise fields.fail(prefix + "dtype", f"must be 'float32', got {dtype!r}")
        return cls(
            fields.filename(entry, "file", prefix),
            fields.sha256(entry, "sha256", prefix),
            fields.integer(entry, "samples", prefix, minimum=1, maximum=MAX_SAMPLES),
            fields.integer(entry, "layers", prefix, minimum=1, maximum=MAX_LAYERS),
            dtype,
        )


def reference_bytes(weights: list[np.ndarray]) -> bytes:
    """`attention.npz`'s bytes: `attention_i` float32 `(K, h, T, S)` per layer."""
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer, **{output_name(i): np.asarray(w, np.float32) for i, w in enumerate(weights)}
    )
    return buffer.getvalue()


def load_reference(
    root: pathlib.Path,
    ref: AttentionReference,
    eval_samples: int,
    max_layer_values: int = MAX_LAYER_VALUES,
) -> list[np.ndarray]:
    """`attention.npz` checked: sha256, one float32 `(samples, h, T, S)` array per layer.

    `max_layer_values`: the most values one layer's array may hold (from the
    models' attention signatures: samples x h x T x S); the archive's
    declared sizes are checked against it before anything is inflated. What
    the manifest declares is never trusted alone: one layer inflates to at
    most `BUNDLE_MEMBER_BYTES`, all layers together to `BUNDLE_ARCHIVE_BYTES`.
    """
    path = root / ref.file
    if ref.samples > eval_samples:
        raise UsageError(
            f"manifest.json says {ref.samples} samples, eval.npz has {eval_samples}", path
        )
    names = tuple(output_name(i) for i in range(ref.layers))
    member_bytes = min(4 * max_layer_values + NPY_HEADER_BYTES, BUNDLE_MEMBER_BYTES)
    data = read_inside(root, ref.file, ref.sha256, max_bytes=ref.layers * member_bytes + 65536)
    arrays = read_npz(
        io.BytesIO(data),
        names,
        where=path,
        max_member_bytes=member_bytes,
        max_total_bytes=BUNDLE_ARCHIVE_BYTES,
    )
    del data
    weights = []
    for name in names:
        w = arrays[name]
        if w.dtype != np.float32 or w.ndim != 4 or w.shape[0] != ref.samples:
            raise UsageError(
                f"{name} must be float32 ({ref.samples}, heads, T, S), "
                f"got {w.dtype.name} {list(w.shape)}",
                path,
            )
        if not np.isfinite(w).all():
            raise UsageError(f"{name} has NaN or infinite values", path)
        weights.append(w)
    return weights
