"""Pair scoring: a cross-encoder (reranker) gives one relevance score per (query, passage).

A one-label sequence-classification checkpoint (ms-marco-MiniLM-L-6-v2 and the
other rerankers) imported by keras-mha-import reads a pair as one input,
`[CLS] query [SEP] passage [SEP]` (RoBERTa: `<s> q </s></s> p </s>`), and
gives one score: sentence-transformers' CrossEncoder's, the logit through the
activation the checkpoint declares (sigmoid unless it says Identity).

eval.npz: `x` (the pairs' token ids, padded with the tokenizer's pad id) and
`scores` (N, 1), the float Keras model's. The rows come in groups of
`PASSAGES` consecutive pairs that share a query (a reranker's job: order the
passages of one query); pairs.json holds the (query, passage) of each row.

A mode is judged as a search is (parity.py's `measure_ranking`): within each
group, does the mode put the float model's best passage first (top-1,
reported) and among its five best (top-5, bounded by the 1 % rule over the
groups, as an embedding model's nearest neighbour is); float32 and float16
also bound every score's difference, on the scale of the float scores.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from ...errors import UsageError
from ..arrays import EvalData, check_pair_eval
from ..entries import EvalSpec, FileRef
from ..fields import Fields
from ..files import read_inside
from ..lists import MAX_LABELS_BYTES, parse_pairs
from ..parity import PASSAGES, Parity, Thresholds, measure_ranking, ranking_thresholds
from .base import Column, Task
from .text import TEXT_ATTENTION_SAMPLES, load_tokenizer, read_tokenizer, tokenizer_json

MAX_PAIR_SAMPLES = 50_000


def check_groups(pairs, where: str | os.PathLike) -> None:
    """Each group of `PASSAGES` consecutive pairs shares its query (what `measure_ranking`
    ranks); the run reader and the device both ask this."""
    if len(pairs) % PASSAGES:
        raise UsageError(f"has {len(pairs)} pairs; expected a multiple of {PASSAGES}", where)
    for row, (query, _) in enumerate(pairs):
        if query != pairs[row - row % PASSAGES][0]:
            raise UsageError(
                f"pair {row} has another query than its group's first (rows come in groups "
                f"of {PASSAGES} passages of one query)",
                where,
            )


class PairScoring(Task):
    name = "pair-scoring"
    output = "scores"
    labelled = False
    classes = False
    pairs = True
    dynamic_length = True
    attention_samples = TEXT_ATTENTION_SAMPLES
    max_samples = MAX_PAIR_SAMPLES
    min_outputs = 1  # one score per pair
    columns = (
        Column("top-1", "top1", ".3f"),
        Column("top-5", "top5", ".3f"),
        Column("max|Δ|", "max_abs_diff", ".2e"),
        Column("mean|Δ|", "mean_abs_diff", ".2e"),
    )
    summary = (
        Column("top-5", "top5", ".4f"),
        Column("top-1", "top1", ".4f"),
        Column("max|Δ|", "max_abs_diff", ".2g"),
    )
    drops = (
        "accuracy", "agreement", "max|Δp|", "mean|Δp|", "attn max|Δ|", "attn tail", "attn agree"
    )  # fmt: skip

    def check_eval(
        self, arrays: dict[str, np.ndarray], where: str | os.PathLike, pad_id: int = 0
    ) -> EvalData:
        return check_pair_eval(arrays["x"], arrays[self.output], where, pad_id)

    def read_files(self, fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
        return {
            "pairs": FileRef.from_json(fields, data, "pairs"),
            **read_tokenizer(fields, data, evaluation),
        }

    def files_json(self, manifest) -> dict:
        return {"pairs": manifest.pairs.to_json(), **tokenizer_json(manifest)}

    def load_files(self, root: pathlib.Path, manifest, evaluation: EvalData) -> dict:
        ref = manifest.pairs
        pairs = parse_pairs(
            read_inside(root, ref.file, ref.sha256, max_bytes=MAX_LABELS_BYTES),
            manifest.eval.samples,
            root / ref.file,
        )
        check_groups(pairs, root / ref.file)
        return {"pairs": pairs, **load_tokenizer(root, manifest, evaluation.x)}

    def measure(self, outputs: np.ndarray, evaluation: EvalData) -> Parity:
        return measure_ranking(outputs, evaluation.probs)

    def thresholds(self, mode: str, samples: int) -> Thresholds:
        return ranking_thresholds(mode, samples)

    def describe(self, num_classes: int, float_accuracy: float | None, max_length: int | None):
        return (
            f"one score per (query, passage) pair, up to {max_length} tokens; ranking "
            f"{PASSAGES} passages per query against the float model"
        )

    def figures(self, parity: Parity, float_accuracy: float | None) -> str:
        return f"top-1 {parity.top1:.3f} top-5 {parity.top5:.3f}  max|Δ| {parity.max_abs_diff:.2g}"
