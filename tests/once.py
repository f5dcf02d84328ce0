"""What the test run makes once, however many pytest processes share the work."""

from __future__ import annotations

import os
import pathlib
import shutil


def once_per_run(tmp_path_factory, name: str, make) -> pathlib.Path:
    """`make(folder)` once for the whole test run, however many processes ask.

    make test runs pytest in several processes (pytest-xdist, PYTEST_JOBS in
    the Makefile), each with its own session fixtures. A trained model or an
    export is made by the first process that asks, under a file lock, in a
    folder all of them share (the run's base temporary folder); the others
    wait for it and read the same files. Returns the folder (read-only for
    the tests). A `make` that raises leaves no mark: the next asker tries again
    and fails the same way.
    """
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-of-USER/pytest-N/: the workers' common parent
    folder = base / "once" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        done = folder.parent / f"{name}.done"
        if not done.exists():
            if folder.exists():
                shutil.rmtree(folder)  # a make that failed half-way
            folder.mkdir()
            make(folder)
            done.touch()
    return folder
