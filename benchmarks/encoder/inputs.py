"""The sentences to run: a bundle, or --models + --ids [--reference].

Each row of token ids is cut to its own length (int32 (1, L), no padding);
the reference is the float unit vectors the fidelity is measured against
(a bundle's eval.npz embeddings, --reference, or None: PyTorch eager's).
"""

from __future__ import annotations

import pathlib

import numpy as np

from bundle_contract.bundle import open_bundle
from bundle_contract.errors import UsageError
from bundle_contract.manifest import MANIFEST


def sentence_ids(x, where: str) -> list[np.ndarray]:
    """Rows of (N, T) 0-padded ids as contiguous int32 (1, L), L each row's own length."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1 or x.dtype.kind not in "iu":
        raise UsageError(f"expected (N, T) integer token ids, got {x.dtype} {x.shape}", where)
    if x.min() < 0 or x.max() > np.iinfo(np.int32).max:
        raise UsageError("token ids must be in 0..2**31-1", where)
    real = x != 0
    lengths = real.sum(axis=1)
    if (lengths == 0).any():
        raise UsageError(f"row {int(np.argmin(lengths))} has no token (all [PAD])", where)
    inside = np.arange(x.shape[1])[None, :] < lengths[:, None]
    if (real != inside).any():
        row = int(np.nonzero((real != inside).any(axis=1))[0][0])
        raise UsageError(f"row {row} has a 0 ([PAD]) before a token; padding must trail", where)
    return [np.ascontiguousarray(x[i : i + 1, :n], np.int32) for i, n in enumerate(lengths)]


def load_bundle(root: pathlib.Path) -> dict:
    """Modes (file, verified), token ids and the float reference of a bundle.

    The contract's reader (`open_bundle`) validates manifest.json and checks
    every file's sha256; the reference is eval.npz's float unit vectors."""
    bundle = open_bundle(root)
    manifest = bundle.path(MANIFEST)
    if not bundle.task.search:  # sentence vectors, compared by cosine and neighbours
        raise UsageError(
            f"eval.task is {bundle.task.name!r}; this benchmark needs a sentence "
            "encoder's bundle (a task whose vectors the device searches)",
            manifest,
        )
    modes = {}
    for mode in bundle.modes:  # table order
        entry = bundle.manifest.models[mode]
        if not entry.dynamic_length:
            raise UsageError(
                f"models.{mode} has no dynamic_length; each sentence runs at its own length",
                manifest,
            )
        modes[mode] = {"path": bundle.path(entry.file), "verified": entry.verified is True}
    return {
        "source": {"bundle": str(root)},
        "root": bundle.root,
        "modes": modes,
        "ids": sentence_ids(bundle.eval.x, str(bundle.path(bundle.manifest.eval.file))),
        "reference": bundle.eval.probs,  # an embedding bundle's float unit vectors (N, d)
    }


def _reference(array, n: int, where: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2 or array.shape[0] != n or array.dtype.kind != "f":
        raise UsageError(
            f"expected ({n}, d) float embeddings, got {array.dtype} {array.shape}", where
        )
    if not np.isfinite(array).all():
        raise UsageError("embeddings are not all finite", where)
    return array.astype(np.float32)


def _load_npy(path: pathlib.Path, flag: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read it as .npy ({error})", f"{flag} {path}") from None


def load_loose(models: list[tuple[str, pathlib.Path]], ids: pathlib.Path, reference) -> dict:
    """--models mode=path ... --ids ids.npy [--reference ref.npy]: every mode taken as verified."""
    modes = {}
    for mode, path in models:
        if not path.is_file():
            raise UsageError("not a file", f"--models {mode}={path}")
        modes[mode] = {"path": path, "verified": True}
    x = sentence_ids(_load_npy(ids, "--ids"), f"--ids {ids}")
    ref = None
    if reference is not None:
        ref = _reference(_load_npy(reference, "--reference"), len(x), f"--reference {reference}")
    return {
        "source": {"models": {m: str(p) for m, p in models}, "ids": str(ids)},
        "modes": modes,
        "ids": x,
        "reference": ref,
    }


def first_sentences(inputs: dict, sentences: int) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The first `sentences` ids (--sentences) and their reference rows; at least 2
    (measure_embeddings' nearest neighbours), else a UsageError."""
    ids = inputs["ids"][:sentences]
    reference = inputs["reference"]
    if reference is not None:
        reference = reference[: len(ids)]
    if len(ids) < 2:  # measure_embeddings' nearest neighbours
        raise UsageError(
            f"{len(ids)} sentence to run; the fidelity's nearest neighbours need at least 2",
            "--sentences" if sentences < 2 else None,
        )
    if len(ids) < sentences:
        print(f"--sentences {sentences}: the input has {len(ids)}, all used")
    return ids, reference
