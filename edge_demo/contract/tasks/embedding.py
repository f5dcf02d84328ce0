"""Embedding: a sentence encoder that gives unit vectors; eval.npz has no labels.

eval.npz: `x` (token ids, 0-padded) and `embeddings` (the float model's
unit vectors); the bundle holds the eval sentences (texts.json) and the
checkpoint's tokenizer.json. A mode is judged by the cosine of each vector
to the float one and by search results: the float model's nearest eval
sentence must stay among the mode's five nearest (parity.py). Each
sentence runs at its own length; the device answers a sentence with its
nearest eval sentences.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from ..arrays import EvalData, check_embedding_eval
from ..entries import EvalSpec
from ..fields import Fields
from ..parity import Parity, Thresholds, embedding_thresholds, measure_embeddings
from .base import Column, Task
from .text import TEXT_ATTENTION_SAMPLES, load_text_files, read_text_files, text_files_json

# Nearest neighbours compare every pair of eval sentences (N^2 / 2 dot products).
MAX_EMBEDDING_SAMPLES = 50_000


class Embedding(Task):
    name = "embedding"
    output = "embeddings"
    labelled = False
    classes = False
    search = True
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
