"""`labels.json`, `texts.json` and `pairs.json`: class names, eval sentences and pairs.

Written by the exporter (and the run directories), read by a task's
`load_files` (tasks/): strict JSON, printable strings, bounded.
"""

from __future__ import annotations

import json
import os

from .errors import UsageError, safe
from .fields import parse_json

MAX_LABELS_BYTES = 4 * 1024 * 1024  # either file
MAX_LABEL = 200  # characters of one class name
MAX_TEXT = 2000  # characters of one eval sentence (texts.json)


def labels_json(labels: list[str] | tuple[str, ...]) -> bytes:
    """`labels.json`'s bytes: a JSON list of class names."""
    return (json.dumps(list(labels)) + "\n").encode("utf-8")


def parse_labels(data: bytes, num_classes: int, where: str | os.PathLike) -> tuple[str, ...]:
    """`labels.json`: one class name per class id (printable, at most `MAX_LABEL` characters)."""
    labels = parse_json(data, where)
    if not isinstance(labels, list) or not all(isinstance(s, str) for s in labels):
        raise UsageError("expected a JSON list of class names", where)
    if len(labels) != num_classes:
        raise UsageError(
            f"has {len(labels)} names, manifest.json says {num_classes} classes", where
        )
    for i, label in enumerate(labels):
        if len(label) > MAX_LABEL or safe(label) != label:
            raise UsageError(
                f"class name {i} ({safe(label, 60)!r}) must be at most {MAX_LABEL} printable "
                "characters (no control characters)",
                where,
            )
    return tuple(labels)


def texts_json(texts: list[str] | tuple[str, ...]) -> bytes:
    """`texts.json`'s bytes: the eval sentences, one per sample."""
    return (json.dumps(list(texts), ensure_ascii=False) + "\n").encode("utf-8")


def parse_texts(data: bytes, samples: int, where: str | os.PathLike) -> tuple[str, ...]:
    """`texts.json`: one printable sentence per eval sample, at most `MAX_TEXT` characters."""
    texts = parse_json(data, where)
    if not isinstance(texts, list) or not all(isinstance(s, str) for s in texts):
        raise UsageError("expected a JSON list of sentences", where)
    if len(texts) != samples:
        raise UsageError(f"has {len(texts)} sentences, manifest.json says {samples}", where)
    for i, text in enumerate(texts):
        if len(text) > MAX_TEXT or safe(text) != text:
            raise UsageError(f"sentence {i} must be at most {MAX_TEXT} printable characters", where)
    return tuple(texts)
