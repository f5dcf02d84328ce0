"""Write whole directories or nothing: build beside the target, then rename."""

from __future__ import annotations

import os
import pathlib
import shutil
import uuid


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
