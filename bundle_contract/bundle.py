"""A bundle directory (docs/artifacts.md): opened and checked before any runtime sees it.

Standard library and numpy. `open_bundle` reads `manifest.json` through
`Manifest.read`, then every selected model (size, TFLite header, sha256),
`eval.npz` (against the manifest, then its task's check), the task's own
files (`Task.load_files`: labels.json, or texts.json and tokenizer.json) and
`vocab.json` (`Vocab`). Every file must be a regular file inside the
bundle: a symbolic link, or a path resolving elsewhere, is refused even when
its sha256 matches. Whatever does not match raises `UsageError` naming the file.

The exporter opens its staged bundle with this same function before it calls
any mode verified; `add_file` is how it puts a file in.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pathlib

import numpy as np

from .arrays import (
    BUNDLE_ARCHIVE_BYTES,
    BUNDLE_MEMBER_BYTES,
    NPY_HEADER_BYTES,
    EvalData,
    read_npz,
)
from .attention import MAX_LAYER_VALUES, load_reference, output_name
from .entries import EvalSpec, FileRef, ModelEntry
from .errors import UsageError, safe
from .files import inside, read_inside, sha256_bytes, tflite_problem, write_bytes_atomic
from .flatbuffer import index_problem
from .manifest import MANIFEST, MODES, Manifest, ordered
from .subwords import Subwords
from .tasks import Task
from .tasks import get as get_task
from .vocab import MAX_VOCAB_BYTES, Vocab


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A validated bundle: manifest, data, and the selected models' bytes."""

    root: pathlib.Path
    manifest: Manifest
    modes: tuple[str, ...]
    eval: EvalData
    vocab: Vocab | None
    model_bytes: dict[str, bytes]
    labels: tuple[str, ...] = ()  # class names (a classifier's: its task's files)
    # The float model's attention weights `(samples, h, T, S)` per layer (attention.npz).
    attention: list[np.ndarray] | None = None
    # An embedding model: the eval sentences (texts.json) and its tokenizer.
    texts: tuple[str, ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()  # a cross-encoder's eval pairs (pairs.json)
    tokenizer: Subwords | None = None

    @property
    def task(self) -> Task:
        """What the bundle is for (tasks/)."""
        return self.manifest.task

    @property
    def pad_id(self) -> int:
        """The id that pads an input and that the model masks (manifest's; 0: BERT's [PAD])."""
        return self.manifest.pad_id

    def path(self, name: str) -> pathlib.Path:
        """A file of the bundle, as messages name it."""
        return self.root / name


def select_modes(manifest: Manifest, quant: str | None) -> tuple[str, ...]:
    """The modes `--quant` names (`all`, or comma-separated), in table order."""
    available = ordered(manifest.models)
    if quant is None or quant.strip() == "all":
        return tuple(available)
    wanted = [m.strip() for m in quant.split(",") if m.strip()]
    if not wanted:
        raise UsageError("no mode given; use 'all' or e.g. 'float32,int8'", "--quant")
    for mode in wanted:
        if mode not in manifest.models:
            what = "is not in this bundle" if mode in MODES else "is not a known mode"
            raise UsageError(
                f"mode {safe(mode, 60)!r} {what} (this bundle has: {', '.join(available)})",
                "--quant",
            )
    return tuple(m for m in available if m in wanted)


def read_model(root: pathlib.Path, entry: ModelEntry) -> bytes:
    """A model file's bytes, checked against its entry: size, sha256, then header and indices."""
    path = root / entry.file
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"not found (manifest.json lists it for mode {entry.mode!r})", path)
    size = inside(root, entry.file).stat().st_size
    if size == 0:
        raise UsageError(f"empty file (0 bytes); manifest.json says {entry.bytes} bytes", path)
    if size != entry.bytes:
        raise UsageError(
            f"size {size} bytes, manifest.json says {entry.bytes}: truncated or replaced", path
        )
    # nothing parsed before its checksum; the size is the manifest's (its task's bound)
    data = read_inside(root, entry.file, entry.sha256, max_bytes=entry.bytes)
    problem = tflite_problem(data) or index_problem(data)
    if problem:
        raise UsageError(problem, path)
    return data


def load_eval(root: pathlib.Path, spec: EvalSpec, pad_id: int = 0) -> EvalData:
    """`eval.npz`: sha256, the manifest's shape and dtype, then the task's check
    (`Task.check_eval`: `arrays.check_eval` for a classifier).

    Each array's inflated size is bounded by what the manifest declares
    (`Task.eval_arrays`: x by its dtype, the others by the widest, 8 bytes)
    and, whatever it declares, by `BUNDLE_MEMBER_BYTES` per array and
    `BUNDLE_ARCHIVE_BYTES` together. The file itself may also hold arrays the
    device does not read (a pronouns run's `text`, `cue`, `nouns`: the export
    copies the run's file), so its size is bounded by the archive budget, not
    by the arrays read."""
    path = root / spec.file
    task = get_task(spec.task)
    sizes = task.eval_arrays(spec)
    limits = {k: min(v + NPY_HEADER_BYTES, BUNDLE_MEMBER_BYTES) for k, v in sizes.items()}
    data = read_inside(root, spec.file, spec.sha256, max_bytes=BUNDLE_ARCHIVE_BYTES)
    arrays = read_npz(
        io.BytesIO(data),
        tuple(sizes),
        where=path,
        max_member_bytes=limits,
        max_total_bytes=BUNDLE_ARCHIVE_BYTES,
    )
    del data
    x = arrays["x"]
    if x.shape != spec.x_shape:
        raise UsageError(
            f"x has shape {list(x.shape)}, manifest.json says {list(spec.x_shape)}", path
        )
    if x.dtype.name != spec.x_dtype:
        raise UsageError(f"x has dtype {x.dtype.name}, manifest.json says {spec.x_dtype}", path)
    outputs, shape = arrays[task.output], task.output_shape(spec)
    if outputs.shape[1:] != shape[1:]:
        raise UsageError(
            f"{task.output} must be float of shape {list(shape)}, "
            f"got {outputs.dtype.name} {list(outputs.shape)}",
            path,
        )
    return task.check_eval(arrays, path, pad_id)


def check_text_inputs(vocab: Vocab, x: np.ndarray, where: str | os.PathLike) -> None:
    """Token ids `x (N, T)` that `vocab` can stand for: T == max_length, ids < len(vocab)."""
    if x.ndim != 2 or vocab.max_length != x.shape[-1]:
        raise UsageError(
            f"max_length {vocab.max_length} does not match eval x of shape {list(x.shape)}", where
        )
    if x.dtype.kind not in "iu":
        raise UsageError(
            f"a text bundle needs integer token ids in eval.npz, got {x.dtype.name}", where
        )
    top = int(x.max())
    if top >= len(vocab) or int(x.min()) < 0:
        raise UsageError(
            f"eval.npz uses token id {top} but 'tokens' has only {len(vocab)} tokens", where
        )


def _load_vocab(root: pathlib.Path, ref: FileRef, evaluation: EvalData) -> Vocab:
    path = root / ref.file
    vocab = Vocab.parse(read_inside(root, ref.file, ref.sha256, max_bytes=MAX_VOCAB_BYTES), path)
    check_text_inputs(vocab, evaluation.x, path)
    return vocab


def open_bundle(root: str | os.PathLike, quant: str | None = None) -> Bundle:
    """Validate a bundle and read what the app needs, without loading any model.

    Args:
        root: the bundle directory.
        quant: `--quant`: None or "all" for every mode, else "MODE,MODE".

    Raises:
        UsageError: the first problem found, naming its file.
    """
    root = pathlib.Path(root)
    manifest = Manifest.read(root)
    modes = select_modes(manifest, quant)
    model_bytes = {mode: read_model(root, manifest.models[mode]) for mode in modes}
    evaluation = load_eval(root, manifest.eval, manifest.pad_id)
    if len(evaluation.x) != manifest.eval.samples:
        raise UsageError(
            f"has {len(evaluation.x)} samples, manifest.json says {manifest.eval.samples}",
            root / manifest.eval.file,
        )
    own = manifest.task.load_files(root, manifest, evaluation)  # labels, or texts and tokenizer
    vocab = None
    if manifest.file("vocab") is not None:
        vocab = _load_vocab(root, manifest.file("vocab"), evaluation)
    attention = None
    if manifest.attention is not None:
        ref = manifest.attention
        attention = load_reference(
            root, ref, manifest.eval.samples, _layer_values(manifest, modes, ref.samples)
        )
        check_attention_shapes(manifest, modes, attention, root / ref.file)
    return Bundle(root, manifest, modes, evaluation, vocab=vocab, model_bytes=model_bytes,
                  attention=attention, **own)  # fmt: skip


def _layer_values(manifest: Manifest, modes: tuple[str, ...], samples: int) -> int:
    """The most values one layer of attention.npz may hold: samples x the largest
    attention output (1, h, T, S) of the selected modes' signatures."""
    largest = 0
    for mode in modes:
        entry = manifest.models[mode]
        if entry.attention is None:
            continue
        for spec in entry.signatures[entry.attention.signature].outputs.values():
            largest = max(largest, math.prod(spec.shape))
    return samples * largest if largest else MAX_LAYER_VALUES


def check_attention_shapes(
    manifest: Manifest, modes: tuple[str, ...], weights: list[np.ndarray], where
) -> None:
    """attention.npz's layers against each selected mode's attention signature:
    every layer an output `(1, h, T, S)` with the reference's h, T and S."""
    for mode in modes:
        entry = manifest.models[mode]
        if entry.attention is None:
            continue
        outputs = entry.signatures[entry.attention.signature].outputs
        for i, w in enumerate(weights):
            spec = outputs.get(output_name(i))
            if spec is None:
                raise UsageError(
                    f"has {len(weights)} layers but models.{mode}.signatures."
                    f"{entry.attention.signature} has no output {output_name(i)}",
                    where,
                )
            if spec.shape != (1, *w.shape[1:]):
                raise UsageError(
                    f"{output_name(i)} is {list(w.shape)} (samples, heads, T, S) but "
                    f"models.{mode}'s {output_name(i)} is {list(spec.shape)}",
                    where,
                )


def add_file(root: pathlib.Path, name: str, data: bytes) -> FileRef:
    """Write `data` as bundle file `name` (atomically) and return its reference."""
    if name == MANIFEST:
        raise ValueError("manifest.json is written by Manifest.write")
    write_bytes_atomic(root / name, data)
    return FileRef(name, sha256_bytes(data))
