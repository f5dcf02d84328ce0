"""The tasks a bundle can be for, one module each, and their registry.

    base.py            the `Task` interface (what a task owns) and `Column`
    classification.py  class probabilities; labels; the top-1 rule
    embedding.py       unit sentence vectors; cosine and nearest neighbours
    text_classification.py  a checkpoint's classifier: class probabilities from
                       sentences, no labelled eval data; agreement with the float model
    pair_scoring.py    a cross-encoder (reranker): one score per (query, passage);
                       ranking agreement with the float model
    text.py            what the sentence tasks share: texts.json, tokenizer.json

`get(name)` is the one place a task's name is looked up: manifest.json's
`eval.task` (absent: classification, as format 1 wrote it) and a run
directory's metrics.json `task`. Everything else asks the `Task` it gets.
"""

from __future__ import annotations

from .base import Column, Task
from .classification import Classification
from .embedding import Embedding
from .pair_scoring import PairScoring
from .text_classification import TextClassification

TASKS: dict[str, Task] = {
    task.name: task for task in (Classification(), Embedding(), TextClassification(), PairScoring())
}
DEFAULT: Task = next(iter(TASKS.values()))  # what a manifest or run without `task` holds

__all__ = ["DEFAULT", "TASKS", "Column", "Task", "get"]


def get(name: str | None) -> Task:
    """The task called `name` (None: `DEFAULT`); ValueError naming the known ones."""
    if name is None:
        return DEFAULT
    task = TASKS.get(name) if isinstance(name, str) else None
    if task is None:
        raise ValueError(f"must be one of {', '.join(TASKS)}, got {str(name)[:40]!r}")
    return task
