"""Embedding: a sentence encoder that gives unit vectors; eval.npz has no labels.

eval.npz: `x` (token ids, 0-padded) and `embeddings` (the float model's
unit vectors); the bundle holds the eval sentences (texts.json) and the
checkpoint's tokenizer.json. A mode is judged by the cosine of each vector
to the float one and by search results: the float model's nearest eval
sentence must stay among the mode's five nearest (`measure_embeddings`,
`embedding_thresholds` below). Each
sentence runs at its own length; the device answers a sentence with its
nearest eval sentences.
"""

from __future__ import annotations

import math
import os
import pathlib

import numpy as np

from ..arrays import EvalData, check_inputs, check_token_ids, describe_array
from ..entries import EvalSpec
from ..errors import UsageError
from ..fields import Fields
from ..parity import (
    FLOAT_THRESHOLDS,
    QUANTIZED_MODES,
    Parity,
    Thresholds,
    changes_allowed,
    nearest,
)
from .base import Column, Task
from .registry import register
from .text import (
    TEXT_ATTENTION_SAMPLES,
    TextInputs,
    load_text_files,
    read_text_files,
    text_files_json,
)

# Nearest neighbours compare every pair of eval sentences (N^2 / 2 dot products).
MAX_EMBEDDING_SAMPLES = 50_000


@register
class Embedding(TextInputs, Task):
    name = "embedding"
    output = "embeddings"
    labelled = False
    classes = False
    search = True
    commands = {"--sample": "search", "--text": "search", "--embed": "embed"}
    fidelity = ("mean_cosine", "min_cosine", "top1", "top5")
    rescalable = True
    dynamic_length = True
    attention_samples = TEXT_ATTENTION_SAMPLES
    max_samples = MAX_EMBEDDING_SAMPLES
    columns = (
        Column("min cos", "min_cosine", ".6f"),
        Column("mean cos", "mean_cosine", ".6f"),
        Column("top-1", "top1", ".3f"),
        Column("top-5", "top5", ".3f"),
        Column("max|Δ|", "max_abs_diff", ".2e"),
    )
    summary = (
        Column("top-5", "top5", ".4f"),
        Column("min cos", "min_cosine", ".4f"),
        Column("max|Δ|", "max_abs_diff", ".2g"),
    )
    drops = (
        "accuracy", "agreement", "max|Δp|", "mean|Δp|", "attn max|Δ|", "attn tail", "attn agree"
    )  # fmt: skip

    def check_eval(
        self, arrays: dict[str, np.ndarray], where: str | os.PathLike, pad_id: int = 0
    ) -> EvalData:
        return check_embedding_eval(arrays["x"], arrays[self.output], where, pad_id)

    def read_files(self, fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
        return read_text_files(fields, data, evaluation)

    def files_json(self, manifest) -> dict:
        return text_files_json(manifest)

    def load_files(self, root: pathlib.Path, manifest, evaluation: EvalData) -> dict:
        return load_text_files(root, manifest, evaluation.x)

    def measure(self, outputs: np.ndarray, evaluation: EvalData) -> Parity:
        return measure_embeddings(outputs, evaluation.probs)

    def thresholds(self, mode: str, samples: int) -> Thresholds:
        return embedding_thresholds(mode, samples)

    def describe(self, num_classes: int, float_accuracy: float | None, max_length: int | None):
        return f"{num_classes}-dimensional sentence embeddings, up to {max_length} word pieces"

    def figures(self, parity: Parity, float_accuracy: float | None) -> str:
        return (
            f"cosine min {parity.min_cosine:.6f} mean {parity.mean_cosine:.6f}  "
            f"top-1 {parity.top1:.3f} top-5 {parity.top5:.3f}"
        )


# --- the task's own checks and figures -------------------------------------------

UNIT_NORM_TOLERANCE = 1e-3  # how far from 1 an eval vector's norm may be


def check_embedding_eval(
    x: np.ndarray, vectors: np.ndarray, where: str | os.PathLike, pad_id: int = 0
) -> EvalData:
    """An embedding model's `eval.npz`: token ids `x (N, T)` (padded with `pad_id`,
    each row at least one token) and the float model's unit vectors `embeddings (N, d)`."""
    n = check_token_ids(x, where, pad_id)
    if vectors.ndim != 2 or vectors.shape[0] != n or vectors.dtype.kind != "f":
        raise UsageError(
            f"embeddings must be float of shape [{n}, d], got {describe_array(vectors)}", where
        )
    check_inputs(vectors, where, "embeddings")
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    worst = int(np.argmax(np.abs(norms - 1)))
    if abs(norms[worst] - 1) > UNIT_NORM_TOLERANCE:
        raise UsageError(
            f"embeddings must have unit norm; row {worst} has norm {norms[worst]:.6g}", where
        )

    return EvalData(
        x, nearest(vectors)[:, 0].astype(np.int64), vectors.astype(np.float32), labelled=False
    )


def measure_embeddings(vectors: np.ndarray, reference: np.ndarray) -> Parity:
    """Figures of a mode's sentence vectors `(N, d)` against the float model's.

    Cosine per sentence; top-1: the mode's nearest other eval sentence is the
    float model's; top-5: the float model's nearest is among the mode's five
    nearest (a search showing five results still shows it).
    """
    vectors = np.asarray(vectors, np.float64)
    reference = np.asarray(reference, np.float64)
    if not np.isfinite(vectors).all():
        return Parity(math.nan, math.nan, math.nan, math.nan)
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    cosine = (vectors * reference).sum(1) / np.maximum(norms, 1e-12)
    k = min(5, len(vectors) - 1)
    ours, theirs = nearest(vectors, k), nearest(reference, 1)[:, 0]
    top1 = float((ours[:, 0] == theirs).mean()) if k else math.nan
    diff = np.abs(vectors - reference)
    return Parity(
        accuracy=math.nan,
        agreement=top1,
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        min_cosine=float(cosine.min()),
        mean_cosine=float(cosine.mean()),
        top1=top1,
        top5=float((ours == theirs[:, None]).any(1).mean()) if k else math.nan,
    )


# An embedding model has no labels; what a user of a sentence encoder notices
# is search results changing (docs/artifacts.md, "Embeddings"):
# - float32 and float16 are bounded elementwise like probabilities (the
#   vectors have unit norm, so an element is at most 1 as a probability is);
# - every mode keeps each vector's direction: cosine >= 0.98 for every
#   sentence and >= 0.995 on average (a similarity printed to two decimals
#   moves by about one unit in its last digit);
# - search results: the float model's nearest sentence must stay among the
#   mode's five nearest for all but `changes_allowed(samples)` sentences, the
#   1 % rule of the classifiers applied to "the right answer left the first
#   page". Top-1 agreement is reported, not bounded: among paraphrases the
#   nearest and the second nearest are often within 0.01 of each other, a
#   swap a user cannot tell from the float model's own choice.
EMBEDDING_MIN_COSINE = 0.98
EMBEDDING_MIN_MEAN_COSINE = 0.995


def embedding_thresholds(mode: str, samples: int) -> Thresholds:
    """The thresholds export writes for an embedding model's `mode` on `samples` sentences."""
    if mode not in FLOAT_THRESHOLDS and mode not in QUANTIZED_MODES:
        raise ValueError(f"unknown mode {mode!r}")
    allowed = changes_allowed(samples)
    return Thresholds(
        max_abs_diff=FLOAT_THRESHOLDS[mode].max_abs_diff if mode in FLOAT_THRESHOLDS else None,
        min_cosine=EMBEDDING_MIN_COSINE,
        min_mean_cosine=EMBEDDING_MIN_MEAN_COSINE,
        min_top5=(samples - allowed) / samples,
    )
