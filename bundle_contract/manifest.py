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
import math
import os
import pathlib
import re

from .attention import AttentionReference, CorefHead, output_name
from .entries import EvalSpec, FileRef, ModeFailure, ModelEntry
from .errors import UsageError, safe
from .fields import MAX_ELEMENTS, Fields, kind, parse_json
from .files import read_inside, write_json_atomic
from .tasks import Task
from .tasks import get as get_task
from .tensors import DTYPES

FORMAT = "keras-mha-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# The exporter's modes, in the order tables show them; a manifest may add others.
MODES = ("float32", "dynamic", "float16", "int8", "int16x8")
# A mode name is printed in tables and used in flags: letters, digits, "_.-".
MODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
MAX_MODES = 32
MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # an exporter's manifest is ~20 KB
MAX_SAMPLES = 1_000_000
MAX_CLASSES = 100_000


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The whole `manifest.json`."""

    eval: EvalSpec
    models: dict[str, ModelEntry]
    # The task's own files by name, as its module reads and writes them (tasks/:
    # `read_files`, `files_json`): a classifier's labels.json (and a token
    # classifier's vocab.json), a sentence task's texts.json or pairs.json and
    # tokenizer.json. `file(name)` looks one up.
    files: dict[str, FileRef] = dataclasses.field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    created_by: dict[str, str] = dataclasses.field(default_factory=dict)
    created_at: str | None = None
    source_model: FileRef | None = None
    dataset: str | None = None
    requested: tuple[str, ...] = ()
    failed: dict[str, ModeFailure] = dataclasses.field(default_factory=dict)
    export_seconds: float | None = None
    attention: AttentionReference | None = None  # the float model's attention weights
    max_length: int | None = None  # a tokenizer's longest input (the sentence tasks')
    pad_id: int = 0  # the id that pads x and that the model masks (RoBERTa's <pad>: 1)
    # Optional: the best coreference head (keras-mha-heads coref), written only when set.
    coref_head: CorefHead | None = None
    # The task's own settings, as its module reads and writes them (`read_files`,
    # `files_json`): a language model's `generation` (tasks/language_model.py).
    settings: object = None

    @property
    def task(self) -> Task:
        """What the bundle is for (tasks/): it owns what differs between kinds of bundle."""
        return get_task(self.eval.task)

    def file(self, name: str) -> FileRef | None:
        """The task's file called `name` (`labels`, `vocab`, `texts`, ...), or None."""
        return self.files.get(name)

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
            "eval": self.task.eval_json(self.eval),
            # format 1 has `labels` and `vocab` in every manifest, null when the task has none
            "labels": None,
            "vocab": None,
            **self.task.files_json(self),
            "attention": None if self.attention is None else self.attention.to_json(),
            **({} if self.coref_head is None else {"coref_head": self.coref_head.to_json()}),
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
        try:
            is_dir = root.is_dir()
        except (OSError, ValueError) as exc:  # a name too long, a NUL, ...
            raise UsageError(
                f"cannot open it ({getattr(exc, 'strerror', None) or exc})", root
            ) from None
        if not is_dir:
            raise UsageError(
                "not a directory (expected a bundle written by `keras-mha-export`)", root
            )
        path = root / MANIFEST
        if not path.exists() and not path.is_symlink():
            raise UsageError("not found; is this a bundle written by `keras-mha-export`?", path)
        data = read_inside(root, MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
        return _parse(parse_json(data, path), path)


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
    try:
        task = get_task(fields.optional(ev, "task", str, "eval."))
    except ValueError as error:
        raise fields.fail("eval.task", str(error)) from None
    evaluation = EvalSpec(
        file=fields.filename(ev, "file", "eval."),
        sha256=fields.sha256(ev, "sha256", "eval."),
        samples=fields.integer(ev, "samples", "eval.", minimum=1, maximum=MAX_SAMPLES),
        x_shape=x_shape,
        x_dtype=fields.string(ev, "x_dtype", "eval."),
        num_classes=fields.integer(
            ev, "num_classes", "eval.", minimum=task.min_outputs, maximum=MAX_CLASSES
        ),
        float_accuracy=task.read_accuracy(fields, ev),
        task=task.name,
    )
    if evaluation.x_dtype not in DTYPES:
        raise fields.fail(
            "eval.x_dtype",
            f"must be one of {', '.join(DTYPES)}, got {safe(evaluation.x_dtype, 40)!r}",
        )
    if task.max_samples is not None and evaluation.samples > task.max_samples:
        raise fields.fail(
            "eval.samples",
            f"is {evaluation.samples}; an eval set of task {task.name!r} has at most "
            f"{task.max_samples}",
        )
    if evaluation.samples * evaluation.num_classes > MAX_ELEMENTS:
        raise fields.fail("eval.num_classes", f"makes probs larger than {MAX_ELEMENTS} values")
    if x_shape[0] != evaluation.samples:
        raise fields.fail(
            "eval.x_shape", f"starts with {x_shape[0]} but eval.samples is {evaluation.samples}"
        )
    if len(x_shape) < 2:
        raise fields.fail(
            "eval.x_shape", f"must have a sample axis and input axes, got {list(x_shape)}"
        )
    own = task.read_files(fields, data, evaluation)  # {"files": ...} and the task's fields
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
    if len(models) > MAX_MODES:
        raise fields.fail("models", f"has {len(models)} modes (at most {MAX_MODES})")
    for mode in models:
        if not MODE_NAME.match(mode):
            raise fields.fail(
                "models",
                f"has a mode named {safe(mode, 60)!r}; a mode name is 1-32 letters, digits, "
                "'_', '.' or '-'",
            )
    entries = {m: ModelEntry.from_json(fields, m, e, evaluation) for m, e in models.items()}
    for mode, entry in entries.items():  # its size and tensors, as the task's model has them
        for field, size in (("bytes", entry.bytes),
                            ("deploy.bytes", 0 if entry.deploy is None else entry.deploy.bytes)):  # fmt: skip
            if size > task.max_model_bytes:
                raise fields.fail(
                    f"models.{mode}.{field}",
                    f"is {size}; a model of task {task.name!r} has at most "
                    f"{task.max_model_bytes} bytes",
                )
        task.check_entry(
            fields, f"models.{mode}.", entry.input, entry.output, entry.signatures, evaluation
        )
    task.check_models(fields, entries, own)
    coref_head = None
    if data.get("coref_head") is not None:
        coref_head = CorefHead.from_json(fields, data, "coref_head")
        _check_coref_head(fields, coref_head, entries, attention)
    # Fields for people, read leniently: a wrong type is ignored, strings are
    # made safe to print and bounded.
    source = data.get("source_model")
    created_by = data.get("created_by")
    seconds = data.get("export_seconds")
    requested = data.get("requested")
    failed = data.get("failed")
    dataset = source.get("dataset") if isinstance(source, dict) else None
    return Manifest(
        eval=evaluation,
        models=entries,
        format_version=version,
        created_by={
            safe(k, 60): safe(v, 200)
            for k, v in (created_by.items() if isinstance(created_by, dict) else ())
            if isinstance(v, str)
        },
        created_at=_text(data.get("created_at")),
        source_model=_source(source),
        dataset=_text(dataset),
        requested=tuple(
            safe(m, 60)
            for m in (requested if isinstance(requested, list) else ())
            if isinstance(m, str)
        ),
        failed={
            safe(mode, 60): failure
            for mode, failure in (
                (m, ModeFailure.from_json(f))
                for m, f in (failed.items() if isinstance(failed, dict) else ())
            )
            if failure is not None
        },
        export_seconds=float(seconds)
        if isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        else None,
        attention=attention,
        coref_head=coref_head,
        **own,
    )


def _check_coref_head(
    fields: Fields,
    coref: CorefHead,
    entries: dict[str, ModelEntry],
    attention: AttentionReference | None,
) -> None:
    """`coref_head` names a head of every mode's attention signature (and of attention.npz)."""
    viewed = [m for m in ordered(entries) if entries[m].attention is not None]
    if not viewed:
        raise fields.fail(
            "coref_head", "names a head, but no model has an attention signature to show it"
        )
    for mode in viewed:
        entry = entries[mode]
        name = entry.attention.signature
        outputs = entry.signatures[name].outputs
        heads = []
        for layer in range(len(outputs)):
            spec = outputs[output_name(layer)]
            if len(spec.shape) != 4:
                raise fields.fail(
                    f"models.{mode}.signatures.{name}.outputs.{output_name(layer)}.shape",
                    f"must be [1, heads, T, S], got {list(spec.shape)}",
                )
            heads.append(spec.shape[1])
        problem = coref.problem(heads)
        if problem is not None:
            raise fields.fail(f"coref_head.{problem[0]}", f"{problem[1]} in models.{mode}")
    if attention is not None and coref.layer >= attention.layers:
        raise fields.fail(
            "coref_head.layer", f"is {coref.layer}; attention.layers is {attention.layers}"
        )


def _text(value: object, limit: int = 200) -> str | None:
    """A lenient string field, made safe to print, or None."""
    return safe(value, limit) if isinstance(value, str) else None


def _source(source: object) -> FileRef | None:
    if isinstance(source, dict) and isinstance(source.get("file"), str):
        return FileRef(safe(source["file"], 255), safe(str(source.get("sha256", "")), 64))
    return None
