"""Read and validate a bundle (docs/artifacts.md) before any runtime sees it.

Everything here is standard library and numpy. `open_bundle` checks the
manifest's fields, every selected model's size, TFLite file identifier,
flatbuffer root and sha256, `eval.npz`'s arrays, `labels.json` and
`vocab.json`; whatever does not match raises `BadInput` naming the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import re
import struct
import zipfile

import numpy as np

from .errors import BadInput
from .text import Vocab, load_vocab

FORMAT = "keras-mha-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# The exporter's modes in the order the table shows them; a manifest may add others.
MODE_ORDER = ("float32", "dynamic", "float16", "int8", "int16x8")
THRESHOLD_KEYS = ("max_abs_diff", "min_agreement", "max_accuracy_drop")
TENSOR_DTYPES = ("float32", "float16", "int8", "uint8", "int16", "int32", "int64")
TFLITE_IDENTIFIER = b"TFL3"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A model input or output as the manifest describes it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: float | None  # None for float tensors
    zero_point: int | None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One `models.<mode>` entry of the manifest."""

    mode: str
    file: str
    sha256: str
    bytes: int
    input: TensorSpec
    output: TensorSpec
    thresholds: dict[str, float]
    runtimes: dict[str, bool]  # runtime name -> known to load it; may be empty
    verified: bool | None
    parity: dict | None


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """The manifest's `eval` entry."""

    file: str
    sha256: str
    samples: int
    x_shape: tuple[int, ...]
    x_dtype: str
    num_classes: int
    float_accuracy: float


@dataclasses.dataclass(frozen=True)
class FileRef:
    """A `{"file": ..., "sha256": ...}` entry (labels, vocab)."""

    file: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The validated `manifest.json`."""

    format_version: int
    created_by: dict
    dataset: str | None
    eval: EvalSpec
    labels: FileRef
    vocab: FileRef | None
    models: dict[str, ModelSpec]


@dataclasses.dataclass(frozen=True)
class EvalData:
    """`eval.npz`: inputs, labels and the float Keras model's softmax."""

    x: np.ndarray
    y: np.ndarray
    probs: np.ndarray


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A validated bundle: manifest, data, and the selected models' bytes."""

    root: pathlib.Path
    manifest: Manifest
    modes: tuple[str, ...]
    eval: EvalData
    labels: tuple[str, ...]
    vocab: Vocab | None
    model_bytes: dict[str, bytes]

    def path(self, name: str) -> pathlib.Path:
        """A file of the bundle, as messages name it."""
        return self.root / name


# --- manifest.json ------------------------------------------------------------


class _Fields:
    """Typed access to a JSON object; errors name the file and the dotted field."""

    def __init__(self, where: str | pathlib.Path):
        self.where = where

    def fail(self, field: str, problem: str) -> BadInput:
        return BadInput(self.where, f"field '{field}' {problem}")

    def obj(self, data: dict, key: str, prefix: str = "") -> dict:
        value = self.get(data, key, prefix)
        if not isinstance(value, dict):
            raise self.fail(prefix + key, f"must be an object, got {_kind(value)}")
        return value

    def get(self, data: dict, key: str, prefix: str = ""):
        if key not in data:
            raise BadInput(self.where, f"missing field '{prefix}{key}'")
        return data[key]

    def string(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.get(data, key, prefix)
        if not isinstance(value, str) or not value:
            raise self.fail(prefix + key, f"must be a non-empty string, got {_kind(value)}")
        return value

    def integer(self, data: dict, key: str, prefix: str = "", minimum: int = 0) -> int:
        value = self.get(data, key, prefix)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(prefix + key, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def number(self, data: dict, key: str, prefix: str = "") -> float:
        value = self.get(data, key, prefix)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.fail(prefix + key, f"must be a finite number, got {value!r}")
        return float(value)

    def shape(self, data: dict, key: str, prefix: str = "") -> tuple[int, ...]:
        value = self.get(data, key, prefix)
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)
        ):
            raise self.fail(prefix + key, f"must be a list of positive integers, got {value!r}")
        return tuple(value)

    def sha256(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.string(data, key, prefix)
        if not _SHA256.match(value):
            raise self.fail(prefix + key, "must be 64 lowercase hex digits")
        return value

    def filename(self, data: dict, key: str, prefix: str = "") -> str:
        value = self.string(data, key, prefix)
        if "/" in value or "\\" in value or value in (".", ".."):
            raise self.fail(prefix + key, f"must name a file inside the bundle, got {value!r}")
        return value


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _tensor(fields: _Fields, data: dict, key: str, prefix: str) -> TensorSpec:
    entry = fields.obj(data, key, prefix)
    prefix = f"{prefix}{key}."
    dtype = fields.string(entry, "dtype", prefix)
    if dtype not in TENSOR_DTYPES:
        raise fields.fail(
            prefix + "dtype", f"must be one of {', '.join(TENSOR_DTYPES)}, got {dtype!r}"
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
        zero_point = fields.integer(entry, "zero_point", prefix, minimum=-(2**31))
    name = entry.get("name", "")
    return TensorSpec(
        str(name) if name is not None else "",
        fields.shape(entry, "shape", prefix),
        dtype,
        scale,
        zero_point,
    )


def _model(fields: _Fields, mode: str, entry: object, evaluation: EvalSpec) -> ModelSpec:
    prefix = f"models.{mode}."
    if not isinstance(entry, dict):
        raise fields.fail(f"models.{mode}", f"must be an object, got {_kind(entry)}")
    inp = _tensor(fields, entry, "input", prefix)
    out = _tensor(fields, entry, "output", prefix)
    if inp.shape[0] != 1 or inp.shape[1:] != evaluation.x_shape[1:]:
        raise fields.fail(
            prefix + "input.shape",
            f"must be [1, {', '.join(map(str, evaluation.x_shape[1:]))}] "
            f"(batch 1, eval.x_shape), got {list(inp.shape)}",
        )
    if out.shape != (1, evaluation.num_classes):
        raise fields.fail(
            prefix + "output.shape",
            f"must be [1, {evaluation.num_classes}] (batch 1, eval.num_classes), got {list(out.shape)}",
        )
    raw_thresholds = fields.obj(entry, "thresholds", prefix)
    if not raw_thresholds:
        raise fields.fail(prefix + "thresholds", "is empty")
    thresholds = {}
    for key in raw_thresholds:
        if key not in THRESHOLD_KEYS:
            raise fields.fail(
                prefix + "thresholds",
                f"has unknown key {key!r} (known: {', '.join(THRESHOLD_KEYS)})",
            )
        thresholds[key] = fields.number(raw_thresholds, key, prefix + "thresholds.")
    runtimes = entry.get("runtimes") or {}
    if not isinstance(runtimes, dict) or not all(isinstance(v, bool) for v in runtimes.values()):
        raise fields.fail(prefix + "runtimes", "must map runtime names to true/false")
    verified = entry.get("verified")
    parity = entry.get("parity")
    return ModelSpec(
        mode=mode,
        file=fields.filename(entry, "file", prefix),
        sha256=fields.sha256(entry, "sha256", prefix),
        bytes=fields.integer(entry, "bytes", prefix, minimum=1),
        input=inp,
        output=out,
        thresholds=thresholds,
        runtimes=dict(runtimes),
        verified=verified if isinstance(verified, bool) else None,
        parity=parity if isinstance(parity, dict) else None,
    )


def parse_manifest(data: object, where: str | pathlib.Path = MANIFEST) -> Manifest:
    """Validate a decoded manifest.json; raise BadInput naming `where` and the field."""
    fields = _Fields(where)
    if not isinstance(data, dict):
        raise BadInput(where, f"expected a JSON object, got {_kind(data)}")
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
    labels = fields.obj(data, "labels")
    labels_ref = FileRef(
        fields.filename(labels, "file", "labels."), fields.sha256(labels, "sha256", "labels.")
    )
    vocab = fields.get(data, "vocab")
    vocab_ref = None
    if vocab is not None:
        vocab = fields.obj(data, "vocab")
        vocab_ref = FileRef(
            fields.filename(vocab, "file", "vocab."), fields.sha256(vocab, "sha256", "vocab.")
        )
    models = fields.obj(data, "models")
    if not models:
        raise fields.fail("models", "is empty")
    specs = {mode: _model(fields, mode, entry, evaluation) for mode, entry in models.items()}
    source = data.get("source_model")
    created_by = data.get("created_by")
    return Manifest(
        format_version=version,
        created_by=created_by if isinstance(created_by, dict) else {},
        dataset=source.get("dataset") if isinstance(source, dict) else None,
        eval=evaluation,
        labels=labels_ref,
        vocab=vocab_ref,
        models=specs,
    )


def read_manifest(root: pathlib.Path) -> Manifest:
    """Read `root/manifest.json` and validate its fields."""
    if not root.is_dir():
        raise BadInput(root, "not a directory (expected a bundle written by `keras-mha-export`)")
    path = root / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(path, "not found; is this a bundle written by `keras-mha-export`?") from None
    except UnicodeDecodeError:
        raise BadInput(path, "not valid JSON (not UTF-8 text)") from None
    except OSError as exc:
        raise BadInput(path, f"cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(path, f"not valid JSON ({exc})") from None
    return parse_manifest(data, path)


def select_modes(manifest: Manifest, quant: str | None) -> tuple[str, ...]:
    """The modes `--quant` names (`all`, or comma-separated), in table order."""
    available = sorted(
        manifest.models,
        key=lambda m: (MODE_ORDER.index(m) if m in MODE_ORDER else len(MODE_ORDER), m),
    )
    if quant is None or quant.strip() == "all":
        return tuple(available)
    wanted = [m.strip() for m in quant.split(",") if m.strip()]
    if not wanted:
        raise BadInput("--quant", "no mode given; use 'all' or e.g. 'float32,int8'")
    for mode in wanted:
        if mode not in manifest.models:
            what = "is not in this bundle" if mode in MODE_ORDER else "is not a known mode"
            raise BadInput(
                "--quant", f"mode {mode!r} {what} (this bundle has: {', '.join(available)})"
            )
    return tuple(m for m in available if m in wanted)


# --- model files -------------------------------------------------------------


def tflite_problem(data: bytes) -> str | None:
    """Why `data` cannot be a TFLite flatbuffer, or None if its header is sound.

    Checks the file identifier "TFL3" at bytes 4..8 and that the root table
    and its vtable lie inside the file: cheap, and enough to keep truncated or
    random files away from a runtime that does not verify its input.
    """
    if len(data) < 16:
        return f"too short to be a TFLite model ({len(data)} bytes)"
    if data[4:8] != TFLITE_IDENTIFIER:
        return f"not a TFLite model: file identifier {bytes(data[4:8])!r} at bytes 4..8, expected b'TFL3'"
    (root,) = struct.unpack_from("<I", data, 0)
    if root < 8 or root + 4 > len(data):
        return f"corrupt TFLite flatbuffer: root table offset {root} is outside the file"
    (vtable_offset,) = struct.unpack_from("<i", data, root)
    vtable = root - vtable_offset
    if vtable < 0 or vtable + 4 > len(data):
        return f"corrupt TFLite flatbuffer: vtable offset {vtable} is outside the file"
    vtable_size, table_size = struct.unpack_from("<HH", data, vtable)
    if vtable_size < 4 or vtable + vtable_size > len(data) or root + table_size > len(data):
        return "corrupt TFLite flatbuffer: root table runs past the end of the file"
    return None


def read_model(root: pathlib.Path, spec: ModelSpec) -> bytes:
    """A model file's bytes, checked against the manifest: size, header, sha256."""
    path = root / spec.file
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise BadInput(path, f"not found (manifest.json lists it for mode {spec.mode!r})") from None
    if not path.is_file():
        raise BadInput(path, "not a regular file")
    if size == 0:
        raise BadInput(path, f"empty file (0 bytes); manifest.json says {spec.bytes} bytes")
    if size != spec.bytes:
        raise BadInput(
            path, f"size {size} bytes, manifest.json says {spec.bytes}: truncated or replaced"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(path, f"cannot read it ({exc.strerror})") from None
    problem = tflite_problem(data)
    if problem:
        raise BadInput(path, problem)
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise BadInput(
            path, f"sha256 {digest[:12]}... does not match manifest.json ({spec.sha256[:12]}...)"
        )
    return data


# --- eval.npz, labels.json -----------------------------------------------------


def _check_sha256(path: pathlib.Path, expected: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadInput(path, "not found (listed in manifest.json)") from None
    except IsADirectoryError:
        raise BadInput(path, "not a regular file") from None
    except OSError as exc:
        raise BadInput(path, f"cannot read it ({exc.strerror})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise BadInput(
            path, f"sha256 {digest[:12]}... does not match manifest.json ({expected[:12]}...)"
        )
    return data


def load_eval(root: pathlib.Path, spec: EvalSpec) -> EvalData:
    """`eval.npz` checked against the manifest: sha256, keys, shapes, dtypes, labels."""
    path = root / spec.file
    _check_sha256(path, spec.sha256)
    if not zipfile.is_zipfile(path):
        raise BadInput(path, "not a readable .npz file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("x", "y", "probs") if k not in npz.files]
            if missing:
                raise BadInput(path, f"missing array(s) {', '.join(missing)} (needs x, y, probs)")
            x, y, probs = npz["x"], npz["y"], npz["probs"]
    except BadInput:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise BadInput(path, f"not a readable .npz file ({exc})") from None
    n, c = spec.samples, spec.num_classes
    if x.shape != spec.x_shape:
        raise BadInput(
            path, f"x has shape {list(x.shape)}, manifest.json says {list(spec.x_shape)}"
        )
    if x.dtype.name != spec.x_dtype:
        raise BadInput(path, f"x has dtype {x.dtype.name}, manifest.json says {spec.x_dtype}")
    if x.dtype.kind not in "fiu":
        raise BadInput(path, f"x has dtype {x.dtype.name}; expected numbers")
    if y.shape != (n,) or y.dtype.kind not in "iu":
        raise BadInput(
            path, f"y must be integer labels of shape [{n}], got {y.dtype.name} {list(y.shape)}"
        )
    if probs.shape != (n, c) or probs.dtype.kind != "f":
        raise BadInput(
            path,
            f"probs must be float of shape [{n}, {c}], got {probs.dtype.name} {list(probs.shape)}",
        )
    if y.min() < 0 or y.max() >= c:
        raise BadInput(path, f"y has labels outside 0..{c - 1}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise BadInput(path, "x has NaN or infinite values")
    if not np.isfinite(probs).all():
        raise BadInput(path, "probs has NaN or infinite values")
    return EvalData(x, y.astype(np.int64), probs.astype(np.float32))


def load_labels(root: pathlib.Path, ref: FileRef, num_classes: int) -> tuple[str, ...]:
    """`labels.json`: one class name per class id."""
    path = root / ref.file
    data = _check_sha256(path, ref.sha256)
    try:
        labels = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(path, f"not valid JSON ({exc})") from None
    if not isinstance(labels, list) or not all(isinstance(s, str) for s in labels):
        raise BadInput(path, "expected a JSON list of class names")
    if len(labels) != num_classes:
        raise BadInput(path, f"has {len(labels)} names, manifest.json says {num_classes} classes")
    return tuple(labels)


def _load_vocab(root: pathlib.Path, ref: FileRef, evaluation: EvalData, spec: EvalSpec) -> Vocab:
    path = root / ref.file
    _check_sha256(path, ref.sha256)
    vocab = load_vocab(path)
    if vocab.max_length != spec.x_shape[-1] or len(spec.x_shape) != 2:
        raise BadInput(
            path, f"max_length {vocab.max_length} does not match eval.x_shape {list(spec.x_shape)}"
        )
    if evaluation.x.dtype.kind not in "iu":
        raise BadInput(
            path,
            f"a text bundle needs integer token ids in eval.npz, got {evaluation.x.dtype.name}",
        )
    top = int(evaluation.x.max())
    if top >= len(vocab.tokens) or int(evaluation.x.min()) < 0:
        raise BadInput(
            path, f"eval.npz uses token id {top} but 'tokens' has only {len(vocab.tokens)} tokens"
        )
    return vocab


def open_bundle(root: str | pathlib.Path, quant: str | None = None) -> Bundle:
    """Validate a bundle and read what the app needs, without loading any model.

    Args:
        root: the bundle directory.
        quant: `--quant`: None or "all" for every mode, else "MODE,MODE".

    Raises:
        BadInput: the first problem found, naming its file.
    """
    root = pathlib.Path(root)
    manifest = read_manifest(root)
    modes = select_modes(manifest, quant)
    model_bytes = {mode: read_model(root, manifest.models[mode]) for mode in modes}
    evaluation = load_eval(root, manifest.eval)
    labels = load_labels(root, manifest.labels, manifest.eval.num_classes)
    vocab = None
    if manifest.vocab is not None:
        vocab = _load_vocab(root, manifest.vocab, evaluation, manifest.eval)
    return Bundle(root, manifest, modes, evaluation, labels, vocab, model_bytes)
