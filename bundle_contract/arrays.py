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
import io
import math
import os
import struct
import zipfile
import zlib
from typing import IO

import numpy as np

from .errors import UsageError

# A float32 softmax row sums to 1 within ~1e-6 per class; x3 or log-probs are far off.
PROB_SUM_TOLERANCE = 1e-3
# A .npy header is at most 64 KiB (format 2.0); numpy writes ~128 bytes.
NPY_HEADER_BYTES = 65536
# Without a bound from a manifest (a run directory's arrays, read by export).
DEFAULT_MEMBER_BYTES = 1 << 30
# A bundle's arrays (eval.npz, attention.npz), whatever its manifest declares:
# one member inflates to at most 64 MiB and one archive's members together to
# at most 256 MiB (the device's whole budget is 512 MB). Real bundles are far
# below: pronouns' attention reference is 2 MiB a layer, an MNIST eval.npz of
# 10,000 float32 images 31 MiB.
BUNDLE_MEMBER_BYTES = 64 * 1024 * 1024
BUNDLE_ARCHIVE_BYTES = 256 * 1024 * 1024
MAX_MEMBERS = 4096
_EOCD = b"PK\x05\x06"
_EOCD_BYTES = 22


@dataclasses.dataclass(frozen=True)
class EvalData:
    """`eval.npz`: inputs, labels and the float Keras model's softmax (the reference)."""

    x: np.ndarray  # (N, ...) model inputs
    y: np.ndarray  # (N,) int64 labels (an embedding model: each one's float nearest neighbour)
    probs: np.ndarray  # (N, C) float32 (an embedding model: the float unit vectors (N, d))
    labelled: bool = True  # y holds labels (an embedding model's: its neighbours)

    @property
    def num_classes(self) -> int:
        return int(self.probs.shape[1])

    @property
    def float_accuracy(self) -> float:
        """Accuracy of the reference `probs` against `y` (NaN without labels)."""
        if not self.labelled:
            return math.nan
        return float((self.probs.argmax(-1) == self.y).mean())


def describe_array(array: np.ndarray) -> str:
    return f"{array.dtype.name} {list(array.shape)}"


def read_npz(
    source: str | os.PathLike | IO[bytes],
    keys: tuple[str, ...],
    where: str | os.PathLike | None = None,
    max_member_bytes: int | dict[str, int] = DEFAULT_MEMBER_BYTES,
    max_total_bytes: int | None = None,
    optional: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """The arrays `keys` of an `.npz` (a path or an open binary file), no pickles;
    and those of `optional` it holds.

    Read with zipfile, never `np.load` on the archive: every member must be a
    `.npy` file; each wanted member's declared size must be at most
    `max_member_bytes` (one bound, or one per key) before it is inflated, and
    inflating stops there whatever the archive claims, so a zip bomb costs
    nothing. `max_total_bytes`: the most the wanted members may inflate to
    together. The archive's member count (end-of-central-directory record) is
    checked before zipfile parses its directory. A corrupt archive or stream
    is a UsageError naming `where` (default: `source`) like any other problem.
    """
    where = source if where is None else where
    try:
        return _read_npz(source, keys, where, max_member_bytes, max_total_bytes, optional)
    except UsageError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError, zlib.error,
            NotImplementedError, RuntimeError, OverflowError) as exc:  # fmt: skip
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise UsageError(f"not a readable .npz file ({detail})", where) from None


def _declared_members(handle: IO[bytes]) -> int | None:
    """The member count the end-of-central-directory record declares (None: no record).

    Read from the archive's last 22..65,557 bytes (the record and its comment),
    before zipfile parses the central directory it describes.
    """
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - _EOCD_BYTES - 65535))
    tail = handle.read()
    at = tail.rfind(_EOCD)
    if at < 0 or at + _EOCD_BYTES > len(tail):
        return None
    on_disk, total = struct.unpack_from("<HH", tail, at + 8)
    return max(on_disk, total)


def _count_members(source, where) -> None:
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            count = _declared_members(handle)
    else:
        count = _declared_members(source)
        source.seek(0)
    if count is not None and count > MAX_MEMBERS:
        raise UsageError(f"has {count} members; an .npz of arrays has a few", where)


def _read_npz(
    source, keys, where, max_member_bytes, max_total_bytes, optional=()
) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(source):
        raise UsageError("not a readable .npz file (not a zip archive)", where)
    _count_members(source, where)  # 0xFFFF (zip64): zipfile's count, checked next
    if not isinstance(source, (str, os.PathLike)):
        source.seek(0)
    with zipfile.ZipFile(source) as archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise UsageError(f"has {len(members)} members; an .npz of arrays has a few", where)
        by_name = {}
        for info in members:
            if not info.filename.endswith(".npy") or "/" in info.filename:
                raise UsageError(
                    f"member {info.filename[:80]!r} is not an .npy array (an .npz holds only those)",
                    where,
                )
            by_name[info.filename[: -len(".npy")]] = info
        missing = [k for k in keys if k not in by_name]
        if missing:
            has = ", ".join(sorted(by_name)[:20]) or "none"
            raise UsageError(
                f"missing array(s) {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}"
                f" (needs {', '.join(keys[:10])}{' ...' if len(keys) > 10 else ''}; has {has})",
                where,
            )
        arrays = {}
        total = 0
        for key in (*keys, *(k for k in optional if k in by_name and k not in keys)):
            info = by_name[key]
            limit = (
                max_member_bytes.get(key, DEFAULT_MEMBER_BYTES)
                if isinstance(max_member_bytes, dict)
                else max_member_bytes
            )
            if info.file_size > limit:
                raise UsageError(
                    f"array {key} inflates to {info.file_size} bytes, more than the {limit} "
                    "it may have",
                    where,
                )
            if max_total_bytes is not None and total + info.file_size > max_total_bytes:
                raise UsageError(
                    f"its arrays inflate to more than {max_total_bytes} bytes together (at {key})",
                    where,
                )
            raw = _inflate(archive, info, limit)
            if len(raw) > limit:
                raise UsageError(f"array {key} inflates past the {limit} bytes it may have", where)
            total += len(raw)
            arrays[key] = _npy_array(raw, key, where)
            del raw
        return arrays


def _inflate(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytearray:
    """A member's bytes, at most `limit` + 1 of them, in one writable buffer (no copies)."""
    raw = bytearray()
    with archive.open(info) as member:
        while len(raw) <= limit:
            block = member.read(min(1 << 20, limit + 1 - len(raw)))
            if not block:
                break
            raw += block
    return raw


def _npy_array(raw: bytearray, key: str, where) -> np.ndarray:
    """An .npy file's array, its header checked against its size before any allocation.

    The array is a view of `raw` (writable, no copy: a member's memory is paid once)."""
    handle = io.BytesIO(bytes(raw[: NPY_HEADER_BYTES + 16]))
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    else:
        raise UsageError(f"array {key}: unknown .npy format version {version}", where)
    if dtype.hasobject or dtype.kind not in "biuf" or dtype.itemsize == 0:
        raise UsageError(f"array {key} has dtype {dtype}; expected numbers", where)
    count = 1
    for d in shape:
        count *= int(d)
    offset = handle.tell()
    if count * dtype.itemsize != len(raw) - offset:
        raise UsageError(
            f"array {key}: its header says {list(shape)} {dtype} but it holds "
            f"{len(raw) - offset} bytes of data",
            where,
        )
    array = np.frombuffer(raw, dtype, count=count, offset=offset)
    return array.reshape(shape, order="F" if fortran else "C")


def check_inputs(
    x: np.ndarray,
    where: str | os.PathLike,
    name: str = "x",
    sample_shape: tuple[int, ...] | None = None,
    dtype: str | None = None,
) -> np.ndarray:
    """`x` as a batch of model inputs: non-empty, numeric, finite, of the given form."""
    if x.ndim < 2 or x.shape[0] == 0:
        raise UsageError(
            f"{name} must be a non-empty batch (N, ...), got {describe_array(x)}", where
        )
    if x.dtype.kind not in "fiu":
        raise UsageError(f"{name} must hold numbers, got {describe_array(x)}", where)
    if sample_shape is not None or dtype is not None:
        shape_ok = sample_shape is None or tuple(x.shape[1:]) == tuple(sample_shape)
        if not shape_ok or (dtype is not None and x.dtype.name != dtype):
            want = ", ".join(str(d) for d in (sample_shape or x.shape[1:]))
            raise UsageError(
                f"{name} is {describe_array(x)} but the model takes {dtype or x.dtype.name} (N, {want})",
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
        raise UsageError(
            f"{name} must be float (N, classes >= 2), got {describe_array(probs)}", where
        )
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


def own_lengths(ids: np.ndarray, pad_id: int = 0) -> np.ndarray:
    """Each row's length without its trailing padding (`pad_id`: BERT's 0,
    RoBERTa's 1), at least 1: the length a dynamic-length model runs a
    sentence at (device, calibration)."""
    nonzero = np.asarray(ids) != pad_id
    last = nonzero.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(1), last, 1)


def pad_ids(ids: np.ndarray, length: int, pad_id: int = 0) -> np.ndarray:
    """Token ids `(N, T)` as `(N, length)`: padded with `pad_id`, or cut where only
    padding is cut (the caller checked every row's own length fits): how a
    fixed-length model takes a sentence (export's eval and calibration, the device)."""
    out = np.full((ids.shape[0], length), pad_id, ids.dtype)
    width = min(length, ids.shape[1])
    out[:, :width] = ids[:, :width]
    return out


def check_token_ids(x: np.ndarray, where: str | os.PathLike, pad_id: int = 0) -> int:
    """Token ids `x (N, T)` padded with `pad_id`, each row at least one token; returns N."""
    check_inputs(x, where, "x")
    n = x.shape[0]
    if x.ndim != 2 or x.dtype.kind not in "iu":
        raise UsageError(
            f"x must be integer token ids of shape [N, T], got {describe_array(x)}", where
        )
    if n < 2:
        raise UsageError(f"x has {n} sentence(s); parity needs at least 2", where)
    if x.shape[1] < 1:
        raise UsageError("x has no token positions (shape [N, 0])", where)
    if int(x.min()) < 0 or not (x != pad_id).any(1).all():
        raise UsageError(
            f"x must hold ids >= 0 with at least one token (not the pad id {pad_id}) per row",
            where,
        )
    return n


def check_eval(
    x: np.ndarray, y: np.ndarray, probs: np.ndarray, where: str | os.PathLike
) -> EvalData:
    """`eval.npz`'s arrays, checked together; returns them as EvalData (y int64, probs float32)."""
    check_inputs(x, where, "x")
    n = x.shape[0]
    if y.shape != (n,) or y.dtype.kind not in "iu":
        raise UsageError(f"y must be integer labels of shape [{n}], got {describe_array(y)}", where)
    if probs.ndim != 2 or probs.shape[0] != n:
        raise UsageError(
            f"probs must be float of shape [{n}, classes], got {describe_array(probs)}", where
        )
    check_probabilities(probs, where)
    c = probs.shape[1]
    if y.min() < 0 or y.max() >= c:
        raise UsageError(f"y has labels outside 0..{c - 1} (found {y.min()}..{y.max()})", where)
    return EvalData(x, y.astype(np.int64), probs.astype(np.float32))
