"""Write whole directories or nothing: build beside the target, then rename."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import uuid


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def staging_dir(out: str | os.PathLike) -> pathlib.Path:
    """A new empty directory beside `out`, with a normal directory's mode.

    (`tempfile.mkdtemp` makes it 0o700, which would stay after the rename.)
    """
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    staging.chmod(0o777 & ~_umask())
    return staging


def write_json_atomic(path: str | os.PathLike, data) -> None:
    """Write `data` as JSON to `path`: a temporary file beside it, then a rename."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        try:
            json.dump(data, f, indent=2)
        except BaseException:
            f.close()
            os.unlink(f.name)
            raise
    os.chmod(f.name, 0o666 & ~_umask())  # a normal file's mode, not mkstemp's 0o600
    os.replace(f.name, path)


def swap_into_place(built: str | os.PathLike, out: str | os.PathLike) -> None:
    """Rename the finished directory `built` to `out`.

    A previous `out` is moved aside first and removed only once the new one
    is in place; if the rename fails, the old one is put back. `built` and
    `out` must be on the same filesystem (build beside the target).
    """
    built, out = pathlib.Path(built), pathlib.Path(out)
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
