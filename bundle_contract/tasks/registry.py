"""The registry of tasks: each task module registers its class where it defines it.

    @register
    class Regression(Task):
        name = "regression"
        ...

`get(name)` is the one place a task's name is looked up: manifest.json's
`eval.task` (absent: classification, as format 1 wrote it) and a run
directory's metrics.json `task`. Everything else asks the `Task` it gets.
A new task is one module: its class, registered (tests/test_tasks.py adds
one in the test itself).
"""

from __future__ import annotations

from .base import Task

TASKS: dict[str, Task] = {}
DEFAULT_NAME = "classification"  # what a manifest or run without `task` holds


def register(cls: type[Task]) -> type[Task]:
    """Register a task class under its `name` (one instance); returns the class."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} has no name")
    if name in TASKS and type(TASKS[name]) is not cls:
        raise ValueError(f"a task called {name!r} is registered already ({type(TASKS[name])})")
    TASKS[name] = cls()
    return cls


def unregister(name: str) -> None:
    """Forget the task called `name` (a test's own task, once the test is done)."""
    if name == DEFAULT_NAME:
        raise ValueError("the default task stays registered")
    TASKS.pop(name, None)


def get(name: str | None) -> Task:
    """The task called `name` (None: the default); ValueError naming the known ones."""
    if name is None:
        name = DEFAULT_NAME
    task = TASKS.get(name) if isinstance(name, str) else None
    if task is None:
        raise ValueError(f"must be one of {', '.join(TASKS)}, got {str(name)[:40]!r}")
    return task
