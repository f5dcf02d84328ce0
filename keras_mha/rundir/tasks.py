"""A run directory's task (metrics.json's `task`) and the reader of each task's runs.

The task objects are the bundle contract's (`bundle_contract.tasks`): a
run of a task exports to a bundle of that task. `READERS` is the library's
one table by task name: what reads a run of each task. A run reader's
object gives export what it bundles, the same for every task: `task`,
`load_model()`, `eval_data`, `calibration`, `dataset`, `bundle_files()`,
`vocab`, `max_length`.
"""

from __future__ import annotations

import json
import os
import pathlib

from bundle_contract.errors import UsageError
from bundle_contract.tasks import TASKS, Task, get

# task name -> "module:function" reading a run directory of that task
READERS = {
    "classification": "keras_mha.rundir.reading:read_run",
    "embedding": "keras_mha.rundir.embedding:read_embedding_run",
    "text-classification": "keras_mha.rundir.embedding:read_embedding_run",
    "pair-scoring": "keras_mha.rundir.embedding:read_embedding_run",
    "language-model": "keras_mha.decoder.run:read_language_run",
}
assert set(READERS) == set(TASKS), "every task of the contract has a run reader"


def task_of(run: str | os.PathLike) -> Task:
    """metrics.json's `task` (the default task when absent or unreadable: the
    reader says why); a UsageError for a task no reader knows."""
    path = pathlib.Path(run) / "metrics.json"
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return get(None)
    name = metrics.get("task") if isinstance(metrics, dict) else None
    try:
        return get(name if isinstance(name, str) else None)
    except ValueError as error:
        raise UsageError(f"task {error}", path) from None


def read_any(run: str | os.PathLike):
    """The run directory read by its task's reader (`READERS`)."""
    import importlib

    module, function = READERS[task_of(run).name].split(":")
    return getattr(importlib.import_module(module), function)(run)


def check_task(metrics: object, wanted: Task, where: pathlib.Path) -> None:
    """metrics.json (decoded) must name task `wanted`; a UsageError naming `where` otherwise."""
    name = metrics.get("task") if isinstance(metrics, dict) else None
    if name != wanted.name:
        raise UsageError(f"expected task {wanted.name!r}", where)


def require(run: str | os.PathLike, wanted: Task, hint: str) -> None:
    """Before anything heavy is imported: `run` must be a run directory of task
    `wanted`; a UsageError naming it otherwise, with `hint` (what such a run takes
    instead)."""
    run = pathlib.Path(run)
    if not (run / "metrics.json").is_file():
        raise UsageError("not a run directory (no metrics.json)", run)
    found = task_of(run)
    if found is not wanted:
        raise UsageError(f"a {found.name} run; {hint}", run)
