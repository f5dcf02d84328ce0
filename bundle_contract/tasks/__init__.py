"""The tasks a bundle can be for, one module each, each registered where it is defined.

    base.py            the `Task` interface (what a task owns) and `Column`
    registry.py        `register`, `get`, `TASKS`: the one place a name is looked up
    classification.py  class probabilities; labels; the top-1 rule
    embedding.py       unit sentence vectors; cosine and nearest neighbours
    text_classification.py  a checkpoint's classifier: class probabilities from
                       sentences, no labelled eval data; agreement with the float model
    pair_scoring.py    a cross-encoder (reranker): one score per (query, passage);
                       ranking agreement with the float model
    language_model.py  a decoder: next-token logits over a KV cache (prefill and decode);
                       next-token agreement, perplexity and greedy tokens against
                       the float model
    text.py            what the sentence tasks share: texts.json, tokenizer.json

A task's module holds everything of it: its eval arrays and their checks, its
own files, how a mode is judged (`measure`, `thresholds`) and described.
Importing this package imports the modules above, which register their tasks
(in this order: the default first).
"""

from __future__ import annotations

from . import (  # noqa: F401
    classification,
    embedding,
    language_model,
    pair_scoring,
    text_classification,
)
from .base import Column, Task
from .registry import DEFAULT_NAME, TASKS, get, register, unregister

DEFAULT: Task = TASKS[DEFAULT_NAME]

__all__ = ["DEFAULT", "TASKS", "Column", "Task", "get", "register", "unregister"]
