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

from ...errors import UsageError
from ..arrays import EvalData, check_embedding_eval
from ..entries import EvalSpec, FileRef
from ..fields import Fields
from ..files import read_inside
from ..lists import MAX_LABELS_BYTES, parse_texts
from ..parity import Parity, Thresholds, embedding_thresholds, measure_embeddings
from ..subwords import MAX_TOKENIZER_BYTES, Subwords
from .base import Column, Task

MAX_TOKENIZER_LENGTH = 4096
# Nearest neighbours compare every pair of eval sentences (N^2 / 2 dot products).
MAX_EMBEDDING_SAMPLES = 50_000
# An encoder's eval sentences are long and padded to the longest: 8 of them
# (about 16 MB for MiniLM) show its heads on the device.
ENCODER_ATTENTION_SAMPLES = 8


class Embedding(Task):
    name = "embedding"
    output = "embeddings"
    labelled = False
    search = True
    dynamic_length = True
    attention_samples = ENCODER_ATTENTION_SAMPLES
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
        entry = fields.obj(data, "tokenizer")
        max_length = fields.integer(
            entry, "max_length", "tokenizer.", minimum=2, maximum=MAX_TOKENIZER_LENGTH
        )
        # the id that pads x and that the model masks: 0 when absent (BERT's [PAD])
        pad_id = 0 if entry.get("pad_id") is None else fields.integer(entry, "pad_id", "tokenizer.")
        x_shape = evaluation.x_shape
        if len(x_shape) != 2 or x_shape[1] > max_length:
            raise fields.fail(
                "eval.x_shape", f"must be [samples, T] with T <= tokenizer.max_length {max_length}"
            )
        return {
            "texts": FileRef.from_json(fields, data, "texts"),
            "tokenizer": FileRef.from_json(fields, data, "tokenizer"),
            "max_length": max_length,
            "pad_id": pad_id,
        }

    def files_json(self, manifest) -> dict:
        return {
            "texts": manifest.texts.to_json(),
            "tokenizer": {
                **manifest.tokenizer.to_json(),
                "max_length": manifest.max_length,
                **({"pad_id": manifest.pad_id} if manifest.pad_id else {}),
            },
        }

    def load_files(self, root: pathlib.Path, manifest, evaluation: EvalData) -> dict:
        """texts.json and tokenizer.json, checked against eval.npz."""
        ref = manifest.texts
        texts = parse_texts(
            read_inside(root, ref.file, ref.sha256, max_bytes=MAX_LABELS_BYTES),
            manifest.eval.samples,
            root / ref.file,
        )
        ref = manifest.tokenizer
        where = root / ref.file
        data = read_inside(root, ref.file, ref.sha256, max_bytes=MAX_TOKENIZER_BYTES)
        tokenizer = Subwords.from_bytes(data, manifest.max_length, where, manifest.pad_id)
        top = int(evaluation.x.max())
        if top >= tokenizer.vocab_size:
            raise UsageError(
                f"eval.npz uses token id {top} but the tokenizer has {tokenizer.vocab_size} tokens",
                where,
            )
        return {"texts": texts, "tokenizer": tokenizer}

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
