"""Labelled text the project owns, written as a user's CSV would be.

    python -m keras_mha.examples pronouns data/pronouns.csv [--sentences 1500] [--seed 0]
    python -m keras_mha.examples topics data/topics.csv

`pronouns`: the lesson's pronoun task (keras_mha.data's grammar), the label
the noun the pronoun means ("first noun", ...). `topics`: the corpus's
sentences (keras_mha/pretrained/corpus.txt) labelled with their topic, 29
classes. `make finetune` fine-tunes all-MiniLM-L6-v2 on them
(keras-mha-train --from ... --data FILE), as a user would on their own file.
Written to a temporary file, then renamed.
"""

from __future__ import annotations

import csv
import os
import pathlib
import tempfile

from keras_mha import data as datasets
from keras_mha.pretrained import corpus

PRONOUN_SENTENCES = 1500


def pronoun_rows(n: int = PRONOUN_SENTENCES, seed: int = 0) -> list[tuple[str, str]]:
    texts, y, _, _ = datasets.generate_pronouns(n, seed)
    return [(text, datasets.PRONOUNS_LABELS[label]) for text, label in zip(texts, y)]


def topic_rows() -> list[tuple[str, str]]:
    return list(corpus.topics().items())


def write_csv(path: str | os.PathLike, rows: list[tuple[str, str]]) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
        os.replace(temp, path)
    except BaseException:
        pathlib.Path(temp).unlink(missing_ok=True)
        raise
