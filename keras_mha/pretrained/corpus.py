"""The project's sentence corpus: English sentences keras_mha wrote itself.

corpus.txt, next to this file, holds about 490 sentences, one a line, written
for this project (no downloaded or copied data set): cooking, travel, weather,
programming, machine learning, sport, music, medicine, finance, animals,
history, science, everyday chat and more, from 3 words to about 60 (the longest
are 65-90 word pieces for all-MiniLM-L6-v2's tokenizer, none near 128). They
come in groups of paraphrases and near-topic sentences, so that the nearest
neighbour of a sentence means something, and include the lesson's "The animal
didn't cross the street because it was too tired." Lines starting with '#' and
blank lines are comments.

Uses: the calibration set of the int8 export (`split()`'s first part), the
sentences on which an imported encoder's embeddings are checked against the
original (the second part), and the sentences the device searches for nearest
neighbours.

    calibration, evaluation = split(seed=0, calibration=100)
"""

from __future__ import annotations

import pathlib

import numpy as np

CORPUS = pathlib.Path(__file__).with_name("corpus.txt")


def sentences() -> list[str]:
    """The corpus's sentences in file order: stripped, without blank lines and '#' comments."""
    lines = (line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def topics() -> dict[str, str]:
    """Each sentence's topic: the '#' heading above it in corpus.txt ("cooking", ...)."""
    found, topic = {}, ""
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("#"):
            topic = line.lstrip("#").strip()
        elif line:
            found[line] = topic
    return found


def split(seed: int = 0, calibration: int = 100) -> tuple[list[str], list[str]]:
    """A deterministic (calibration, evaluation) split of `sentences()`.

    The sentences in the order of `np.random.default_rng(seed).permutation`:
    the first `calibration` of them, and the rest.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, not {seed!r}")
    every = sentences()
    if isinstance(calibration, bool) or not isinstance(calibration, (int, np.integer)):
        raise ValueError(f"calibration must be an integer, not {calibration!r}")
    if not 0 < calibration < len(every):
        raise ValueError(f"calibration must be in 1..{len(every) - 1}, not {calibration}")
    order = np.random.default_rng(int(seed)).permutation(len(every))
    chosen = [every[i] for i in order]
    return chosen[:calibration], chosen[calibration:]
