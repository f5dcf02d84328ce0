"""The attention weights a bundle carries: `attention.npz` and the manifest's entries.

Every mode's model has a second signature, `view` (`SIGNATURE`), whose
outputs `attention_0` .. (`output_name`) are each layer's weights
`(1, h, T, S)`; the Keras model's attention outputs carry the same names
(keras_mha/model.py imports `output_name`). Export stores the float Keras
model's own weights for the first `samples` eval samples in `attention.npz`
(`AttentionReference`, `reference_bytes`, `load_reference`), and each mode's
entry says which signature to run and what it must meet (`AttentionCheck`).
What the check measures and its bounds are attention_parity.py's
(docs/artifacts.md). The manifest may also name the best coreference head
(`CorefHead`, from `keras-mha-heads coref`), which the head view opens on.
numpy and the standard library only.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib

import numpy as np

from .arrays import BUNDLE_ARCHIVE_BYTES, BUNDLE_MEMBER_BYTES, NPY_HEADER_BYTES, read_npz
from .attention_parity import AttentionParity, AttentionThresholds
from .errors import UsageError, safe
from .fields import MAX_DIM, Fields
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
MAX_COREF_SENTENCES = 1_000_000  # keras-mha-heads coref probes at most 20,000


def output_name(layer: int) -> str:
    """The name of layer `layer`'s attention weights: the signature output, the
    `attention.npz` array and the Keras model's output (keras_mha/model.py)."""
    return f"attention_{layer}"


@dataclasses.dataclass(frozen=True)
class AttentionCheck:
    """A mode entry's `attention`: the signature to run, its thresholds, its figures.

    `faithful`: export's verdict on the view. True: its weights met the
    thresholds. False: they did not, while the mode's task outputs did, so
    the model is kept and verified for its task and its view is marked (the
    device's parity run reports the misses without failing the mode, and its
    head view says so with the figures; docs/artifacts.md says why). None:
    not recorded (bundles before the field, where every verified mode's view
    met them): the device then holds the view to its thresholds.
    """

    signature: str
    thresholds: AttentionThresholds
    parity: AttentionParity | None = None
    faithful: bool | None = None

    def to_json(self) -> dict:
        data = {
            "signature": self.signature,
            "thresholds": self.thresholds.to_json(),
            "parity": None if self.parity is None else self.parity.to_json(),
        }
        if self.faithful is not None:
            data["faithful"] = self.faithful
        return data

    def misses(self) -> list[str]:
        """The thresholds export's figures miss, one line each (none without figures)."""
        return [] if self.parity is None else self.thresholds.failures(self.parity)

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str, prefix: str) -> AttentionCheck:
        entry = fields.obj(data, key, prefix)
        prefix = f"{prefix}{key}."
        return cls(
            fields.string(entry, "signature", prefix),
            AttentionThresholds.from_json(fields, entry, "thresholds", prefix),
            AttentionParity.from_json(entry.get("parity")),
            fields.optional(entry, "faithful", bool, prefix),
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


@dataclasses.dataclass(frozen=True)
class CorefHead:
    """The manifest's optional `coref_head`: the head whose pronoun row most often
    weighs the antecedent most, on `sentences` generated pronoun sentences
    (`keras-mha-heads coref`; `ci95` its 95 % bootstrap interval). Layers and
    heads count from 0; the manifest checks them against the models'
    attention signatures (manifest.py)."""

    layer: int
    head: int
    accuracy: float
    ci95: tuple[float, float]
    sentences: int

    def to_json(self) -> dict:
        return {
            "layer": self.layer,
            "head": self.head,
            "accuracy": self.accuracy,
            "ci95": list(self.ci95),
            "sentences": self.sentences,
        }

    def caption(self) -> str:
        """What the head view says of it."""
        low, high = self.ci95
        return (
            f"layer {self.layer} head {self.head}: the best coreference head, "
            f"{self.accuracy:.3f} ({low:.3f}-{high:.3f}) of {self.sentences} generated "
            "pronoun sentences, keras-mha-heads coref"
        )

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str = "coref_head") -> CorefHead:
        entry = fields.obj(data, key)
        prefix = f"{key}."
        accuracy = fields.number(entry, "accuracy", prefix)
        if not 0.0 <= accuracy <= 1.0:
            raise fields.fail(prefix + "accuracy", f"must be in [0, 1], got {accuracy!r}")
        ci95 = fields.get(entry, "ci95", prefix)
        if (
            not isinstance(ci95, list)
            or len(ci95) != 2
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0
                for v in ci95
            )
            or ci95[0] > ci95[1]
        ):
            raise fields.fail(
                prefix + "ci95",
                f"must be [low, high] with 0 <= low <= high <= 1, got {safe(repr(ci95), 60)}",
            )
        return cls(
            layer=fields.integer(entry, "layer", prefix, maximum=MAX_LAYERS - 1),
            head=fields.integer(entry, "head", prefix, maximum=MAX_DIM - 1),
            accuracy=accuracy,
            ci95=(float(ci95[0]), float(ci95[1])),
            sentences=fields.integer(entry, "sentences", prefix, 1, MAX_COREF_SENTENCES),
        )

    def problem(self, heads_per_layer: list[int]) -> tuple[str, str] | None:
        """(field, why) if this head is not in a model with these heads per layer, else None."""
        if self.layer >= len(heads_per_layer):
            return "layer", (
                f"is {self.layer}; the model has {len(heads_per_layer)} layers "
                f"(0..{len(heads_per_layer) - 1})"
            )
        if self.head >= heads_per_layer[self.layer]:
            heads = heads_per_layer[self.layer]
            return "head", f"is {self.head}; layer {self.layer} has {heads} heads (0..{heads - 1})"
        return None
