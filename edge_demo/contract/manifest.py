"""`manifest.json`: the bundle's format, as dataclasses both sides read and write.

Its entries (`EvalSpec`, `FileRef`, `ModelEntry`, `Signature`, `ModeFailure`) are in entries.py.

Numpy-free and TensorFlow-free. The exporter builds a `Manifest` and calls
`write`; the device calls `read` (or `Manifest.from_json`), which validates
every field it relies on and names the dotted field of anything wrong. The
document is docs/artifacts.md; tests/test_edge_manifest.py parses its
examples with this module, so the two cannot drift.

Also here: the modes (`MODES`); their default thresholds and the one threshold
check are parity.py's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

from ..errors import UsageError
from .attention import AttentionReference
from .entries import EvalSpec, FileRef, ModeFailure, ModelEntry
from .fields import Fields, kind
from .files import read_inside, write_json_atomic

FORMAT = "keras-mha-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# The exporter's modes, in the order tables show them; a manifest may add others.
MODES = ("float32", "dynamic", "float16", "int8", "int16x8")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The whole `manifest.json`."""

    eval: EvalSpec
    labels: FileRef
    vocab: FileRef | None
    models: dict[str, ModelEntry]
    format_version: int = FORMAT_VERSION
    created_by: dict[str, str] = dataclasses.field(default_factory=dict)
    created_at: str | None = None
    source_model: FileRef | None = None
    dataset: str | None = None
    requested: tuple[str, ...] = ()
    failed: dict[str, ModeFailure] = dataclasses.field(default_factory=dict)
    export_seconds: float | None = None
    attention: AttentionReference | None = None  # the float model's attention weights

    @property
    def verified(self) -> list[str]:
        """Modes export verified, in table order."""
        return [m for m in ordered(self.models) if self.models[m].verified]

    def to_json(self) -> dict:
        source = None
        if self.source_model is not None:
            source = {**self.source_model.to_json(), "dataset": self.dataset}
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "created_by": dict(self.created_by),
            "created_at": self.created_at,
            "source_model": source,
            "eval": self.eval.to_json(),
            "labels": self.labels.to_json(),
            "vocab": None if self.vocab is None else self.vocab.to_json(),
            "attention": None if self.attention is None else self.attention.to_json(),
            "verified": self.verified,
            "models": {mode: self.models[mode].to_json() for mode in ordered(self.models)},
            "requested": list(self.requested),
            "failed": {mode: f.to_json() for mode, f in self.failed.items()},
            "export_seconds": self.export_seconds,
        }

    def write(self, root: str | os.PathLike) -> pathlib.Path:
        """Write `root/manifest.json` atomically; returns its path."""
        path = pathlib.Path(root) / MANIFEST
        write_json_atomic(path, self.to_json())
        return path

    @classmethod
    def from_json(cls, data: object, where: str | os.PathLike = MANIFEST) -> Manifest:
        """Validate a decoded manifest.json; UsageError naming `where` and the field."""
        return _parse(data, where)

    @classmethod
    def read(cls, root: str | os.PathLike) -> Manifest:
        """Read and validate `root/manifest.json` (a regular file of `root`)."""
        root = pathlib.Path(root)
        if not root.is_dir():
            raise UsageError(
                "not a directory (expected a bundle written by `keras-mha-export`)", root
            )
        path = root / MANIFEST
        if not path.exists() and not path.is_symlink():
            raise UsageError("not found; is this a bundle written by `keras-mha-export`?", path)
        data = read_inside(root, MANIFEST)
        try:
            decoded = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise UsageError("not valid JSON (not UTF-8 text)", path) from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"not valid JSON ({exc})", path) from None
        return _parse(decoded, path)


def ordered(modes) -> list[str]:
    """Modes in table order (MODES first, then any others by name)."""
    return sorted(modes, key=lambda m: (MODES.index(m) if m in MODES else len(MODES), m))


def _parse(data: object, where: str | os.PathLike) -> Manifest:
    fields = Fields(where)
    if not isinstance(data, dict):
        raise UsageError(f"expected a JSON object, got {kind(data)}", where)
    fmt = fields.string(data, "format")
    if fmt != FORMAT:
        raise fields.fail("format", f"is {fmt!r}, expected {FORMAT!r}")
    version = fields.integer(data, "format_version", minimum=1)
    if version > FORMAT_VERSION:
        raise fields.fail(
            "format_version",
            f"is {version}; this app reads version {FORMAT_VERSION}: update edge_demo",
        )
    ev = fields.obj(data, "eval")
    x_shape = fields.shape(ev, "x_shape", "eval.")
    evaluation = EvalSpec(
        file=fields.filename(ev, "file", "eval."),
        sha256=fields.sha256(ev, "sha256", "eval."),
        samples=fields.integer(ev, "samples", "eval.", minimum=1),
        x_shape=x_shape,
        x_dtype=fields.string(ev, "x_dtype", "eval."),
        num_classes=fields.integer(ev, "num_classes", "eval.", minimum=2),
        float_accuracy=fields.number(ev, "float_accuracy", "eval."),
    )
    if x_shape[0] != evaluation.samples:
        raise fields.fail(
            "eval.x_shape", f"starts with {x_shape[0]} but eval.samples is {evaluation.samples}"
        )
    if len(x_shape) < 2:
        raise fields.fail(
            "eval.x_shape", f"must have a sample axis and input axes, got {list(x_shape)}"
        )
    labels = FileRef.from_json(fields, data, "labels")
    vocab = None if fields.get(data, "vocab") is None else FileRef.from_json(fields, data, "vocab")
    attention = None
    if data.get("attention") is not None:
        attention = AttentionReference.from_json(fields, data, "attention")
        if attention.samples > evaluation.samples:
            raise fields.fail(
                "attention.samples", f"is {attention.samples}, more than eval.samples"
            )
    models = fields.obj(data, "models")
    if not models:
        raise fields.fail("models", "is empty")
    entries = {m: ModelEntry.from_json(fields, m, e, evaluation) for m, e in models.items()}
    source = data.get("source_model")
    created_by = data.get("created_by")
    seconds = data.get("export_seconds")
    return Manifest(
        eval=evaluation,
        labels=labels,
        vocab=vocab,
        models=entries,
        format_version=version,
        created_by=dict(created_by) if isinstance(created_by, dict) else {},
        created_at=data.get("created_at") if isinstance(data.get("created_at"), str) else None,
        source_model=_source(source),
        dataset=source.get("dataset") if isinstance(source, dict) else None,
        requested=tuple(m for m in data.get("requested") or () if isinstance(m, str)),
        failed={
            mode: failure
            for mode, failure in (
                (m, ModeFailure.from_json(f)) for m, f in (data.get("failed") or {}).items()
            )
            if failure is not None
        }
        if isinstance(data.get("failed"), dict)
        else {},
        export_seconds=seconds
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        else None,
        attention=attention,
    )


def _source(source: object) -> FileRef | None:
    if isinstance(source, dict) and isinstance(source.get("file"), str):
        return FileRef(source["file"], str(source.get("sha256", "")))
    return None
