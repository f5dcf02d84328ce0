"""Files of the contract: written whole or not at all, read only from inside the bundle.

- Writers: `write_bytes_atomic`, `write_json_atomic` (a temporary file beside
  the target, then a rename) and, for directories, `building(out)` (or its
  parts `staging_dir` + `swap_into_place`). An interrupted or failed write leaves the old file or
  nothing, never half of one.
- Readers: `read_inside(root, name)` refuses a bundle file that is a symbolic
  link or resolves outside the bundle (even when its sha256 matches), then
  reads it; `tflite_problem` checks a model's header before a runtime sees it.
- `check_writable(path, flag)`: refuse, before any work, an output path
  nothing can be written to (every command's `--out`, `--json`, `--view`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import shutil
import signal
import stat
import struct
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any

from .errors import UsageError, raise_if_interrupted

TFLITE_IDENTIFIER = b"TFL3"
# The most a bundle file is read into memory for (a model, an npz), unless its
# reader asks for more: a classifier's device app has 512 MB in all; JSON files
# have their own, smaller caps. A task's model may be larger (`Task.max_model_bytes`:
# a language model's), never past `MAX_FILE_BYTES`, a flatbuffer's own limit
# (its offsets are 32-bit).
DEFAULT_FILE_BYTES = 256 * 1024 * 1024
MAX_FILE_BYTES = 2**31 - 1
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def read_utf8(path: str | os.PathLike) -> tuple[bytes, str]:
    """A user's text file: (its bytes, its text), a leading byte-order mark
    dropped; a UsageError naming the file (and the first byte that is not
    UTF-8) otherwise."""
    try:
        raw = pathlib.Path(path).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read it ({error.strerror or error})", path) from None
    try:
        return raw, raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"is not UTF-8 text (byte 0x{raw[error.start]:02x} at offset {error.start}); "
            "save it as UTF-8",
            path,
        ) from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomic(
    path: str | os.PathLike,
    write: Callable[[IO[bytes]], None],
    flag: str | None = None,
    protected: str | os.PathLike | None = None,
) -> None:
    path = pathlib.Path(path)
    if flag is not None:
        check_output(path, flag, protected)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600; give it a normal file's mode
        if flag is not None:  # the path may have changed while the file was written
            check_output(path, flag, protected)
        raise_if_interrupted()  # a Ctrl-C that something swallowed still cancels
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(
    path: str | os.PathLike,
    data: bytes,
    flag: str | None = None,
    protected: str | os.PathLike | None = None,
) -> None:
    """Write `data` to `path`: a temporary file beside it, then a rename.

    With `flag` (a user's output path, e.g. "--json"), `check_output(path,
    flag, protected)` before writing and again before the rename.
    """
    _write_atomic(path, lambda handle: handle.write(data), flag, protected)


def write_json_atomic(
    path: str | os.PathLike,
    data: Any,
    indent: int | None = 2,
    flag: str | None = None,
    protected: str | os.PathLike | None = None,
) -> None:
    """Write `data` as JSON (no NaN: it is not JSON) to `path`, atomically.

    Raises ValueError for NaN or infinity before anything is written.
    """
    text = json.dumps(data, indent=indent, allow_nan=False) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"), flag, protected)


def staging_dir(out: str | os.PathLike) -> pathlib.Path:
    """A new empty directory beside `out`, with a normal directory's mode.

    Build a directory here, then `swap_into_place(staging, out)`.
    """
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    staging.chmod(0o777 & ~_umask())  # mkdtemp made it 0700, which would stay after the rename
    return staging


def swap_into_place(built: str | os.PathLike, out: str | os.PathLike) -> None:
    """Rename the finished directory `built` to `out` (same file system).

    A previous `out` is moved aside first and removed once the new one is in
    place; if the rename fails, the old one is put back.
    """
    built, out = pathlib.Path(built), pathlib.Path(out)
    raise_if_interrupted()  # a Ctrl-C that something swallowed still cancels
    if not out.exists():
        os.replace(built, out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(out, old)
    try:
        os.replace(built, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C back for a few statements (it is delivered when the block ends)."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except (AttributeError, ValueError, OSError):  # no POSIX masks, or not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _make_parents(directory: pathlib.Path) -> list[pathlib.Path]:
    """mkdir -p; the directories created, outermost first."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    directory.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


@contextlib.contextmanager
def building(out: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Build a directory beside `out`; it replaces `out` when the block ends cleanly.

        with building(out) as staging:
            ...write files into staging...

    On any exception (Ctrl-C included) the staging directory, and the parents
    of `out` this created, are removed and `out` is left as it was.
    """
    out = pathlib.Path(out)
    created: list[pathlib.Path] = []
    staging = None
    try:
        with _sigint_deferred():  # no Ctrl-C between creating it and knowing its name
            created = _make_parents(out.parent)
            staging = staging_dir(out)
        yield staging
        swap_into_place(staging, out)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for directory in reversed(created):
            try:
                directory.rmdir()
            except OSError:
                break
        raise


def check_writable(path: str | os.PathLike, flag: str = "--out") -> pathlib.Path:
    """Refuse, up front, an output path nothing can be written to.

    Writers build beside the target and rename, so what must be writable is
    the target's parent, or its nearest ancestor that exists (missing
    directories are created later). Tries a real file there: permissions,
    a read-only file system and a full disk are all found before any work.

    Returns:
        `path` as a Path.

    Raises:
        UsageError: naming `flag` and the path, e.g.
            `--out /ro/bundle: cannot write in /ro (Read-only file system)`.
    """
    path = pathlib.Path(path)
    where = f"{flag} {path}"
    try:
        return _check_writable(path, where)
    except UsageError:  # already says what is wrong (a UsageError is a ValueError too)
        raise
    except OSError as exc:  # a name too long, a loop of links, ...
        raise UsageError(f"cannot use this path ({exc.strerror or exc})", where) from None
    except ValueError as exc:  # an embedded NUL, an unencodable name
        raise UsageError(f"cannot use this path ({exc})", where) from None


def _check_writable(path: pathlib.Path, where: str) -> pathlib.Path:
    if path.is_symlink() and not path.exists():
        raise UsageError("is a dangling symbolic link", where)
    ancestor = path.absolute().parent
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link on the way
            raise UsageError(f"{ancestor} is a dangling symbolic link", where)
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{ancestor} is not a directory", where)
    try:
        fd, probe = tempfile.mkstemp(prefix=".keras-mha-write-test-", dir=ancestor)
    except OSError as exc:
        raise UsageError(f"cannot write in {ancestor} ({exc.strerror or exc})", where) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return path


def _file_kind(mode: int) -> str | None:
    """What a non-regular file is, as a message names it; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_output(
    path: str | os.PathLike, flag: str, protected: str | os.PathLike | None = None
) -> pathlib.Path:
    """An output file the app may replace (`--json`, `--view`): `check_writable`, and

    - an existing path must be a regular file: a symbolic link, FIFO, device
      node or socket would be replaced by the rename (`--json /dev/stdout`);
    - the file may not be inside the directory `protected` (the bundle being
      read: its manifest or a model would be overwritten).

    Writers call it again just before the rename (`write_bytes_atomic(...,
    flag=...)`), so a path that changed meanwhile is still refused.
    """
    path = pathlib.Path(path)
    where = f"{flag} {path}"
    try:
        try:
            info = path.lstat()
        except (FileNotFoundError, NotADirectoryError):  # check_writable says which
            info = None
        kind = None if info is None else _file_kind(info.st_mode)
        if kind is not None:
            raise UsageError(
                f"is {kind}; refusing to replace it (give a new or regular file)", where
            )
        if protected is not None:
            target = path.absolute().parent.resolve() / path.name
            root = pathlib.Path(protected).resolve()
            if target == root or root in target.parents:
                raise UsageError(
                    f"is inside the bundle {root}; write outputs elsewhere (it would replace "
                    "a bundle file)",
                    where,
                )
    except OSError as exc:
        raise UsageError(f"cannot use this path ({exc.strerror or exc})", where) from None
    except ValueError as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"cannot use this path ({exc})", where) from None
    return check_writable(path, flag)


def sha256_bytes(data: bytes) -> str:
    """Lowercase hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Lowercase hex sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def inside(root: pathlib.Path, name: str) -> pathlib.Path:
    """`root/name`, refused unless it is a regular file of `root` itself.

    A symbolic link is refused even if it points into the bundle: a bundle
    copied to a device is plain files, and a link is how a file outside it
    (with a forged manifest) would get in.
    """
    path = root / name
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise UsageError("not found (listed in manifest.json)", path) from None
    except OSError as exc:
        raise UsageError(f"cannot read it ({exc.strerror or exc})", path) from None
    except ValueError as exc:  # an unencodable name or a NUL: never a file of the bundle
        raise UsageError(f"cannot read it ({exc})", path) from None
    if stat.S_ISLNK(info.st_mode):
        raise UsageError("is a symbolic link; bundle files must be regular files", path)
    if not stat.S_ISREG(info.st_mode):
        raise UsageError("not a regular file", path)
    try:
        real, real_root = path.resolve(), root.resolve()
    except OSError as exc:
        raise UsageError(f"cannot read it ({exc.strerror or exc})", path) from None
    if real.parent != real_root:
        raise UsageError(f"resolves to {real}, outside the bundle {real_root}", path)
    return path


def read_inside(
    root: pathlib.Path,
    name: str,
    sha256: str | None = None,
    max_bytes: int = DEFAULT_FILE_BYTES,
) -> bytes:
    """The bytes of bundle file `name`, checked by `inside`, its size, and `sha256`.

    The size is checked before reading (at most `max_bytes`, never more than
    `MAX_FILE_BYTES` whatever the caller asks, and the read stops there
    whatever the file grows to) and the sha256 computed while reading, so
    nothing is parsed before its checksum matches. The file is opened without
    following a symbolic link and without blocking (a FIFO swapped in after
    `inside` looked), and must still be a regular file once open.
    """
    max_bytes = min(max_bytes, MAX_FILE_BYTES)
    path = inside(root, name)
    digest = hashlib.sha256()
    blocks = []
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                "is a symbolic link; bundle files must be regular files", path
            ) from None
        raise UsageError(f"cannot read it ({exc.strerror or exc})", path) from None
    try:
        with open(fd, "rb", buffering=0) as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UsageError("not a regular file", path)
            if _NONBLOCK:
                os.set_blocking(fd, True)
            size = info.st_size
            if size > max_bytes:
                raise UsageError(
                    f"is {size} bytes; this file may be at most {max_bytes} bytes", path
                )
            left = max_bytes + 1
            while left > 0:
                block = handle.read(min(1 << 20, left))
                if not block:
                    break
                digest.update(block)
                blocks.append(block)
                left -= len(block)
    except OSError as exc:
        raise UsageError(f"cannot read it ({exc.strerror or exc})", path) from None
    data = b"".join(blocks)
    del blocks
    if len(data) > max_bytes:
        raise UsageError(f"grew past {max_bytes} bytes while being read", path)
    if sha256 is not None:
        found = digest.hexdigest()
        if found != sha256:
            raise UsageError(
                f"sha256 {found[:12]}... does not match manifest.json ({sha256[:12]}...)", path
            )
    return data


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
