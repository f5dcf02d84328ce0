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

A mode is judged as a search is (`measure_ranking` below): within each
group, does the mode put the float model's best passage first (top-1,
reported) and among its five best (top-5, bounded by the 1 % rule over the
groups, as an embedding model's nearest neighbour is); float32 and float16
also bound every score's difference, on the scale of the float scores.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import numpy as np

from ..arrays import EvalData, check_inputs, check_token_ids, describe_array
from ..entries import EvalSpec, FileRef
from ..errors import UsageError, safe
from ..fields import Fields, parse_json
from ..files import read_inside
from ..lists import MAX_LABELS_BYTES, MAX_TEXT
from ..parity import FLOAT_THRESHOLDS, QUANTIZED_MODES, Parity, Thresholds, changes_allowed
from .base import Column, Task
from .registry import register
from .text import TEXT_ATTENTION_SAMPLES, load_tokenizer, read_tokenizer, tokenizer_json, with_files

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


@register
class PairScoring(Task):
    name = "pair-scoring"
    output = "scores"
    labelled = False
    classes = False
    commands = {"--sample": "score", "--pair": "score", "--rerank": "rank"}
    fidelity = ("top1", "top5", "max_abs_diff", "mean_abs_diff")
    inputs_file = "pairs.json"
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
        pairs = FileRef.from_json(fields, data, "pairs")
        return with_files(read_tokenizer(fields, data, evaluation), pairs=pairs)

    def files_json(self, manifest) -> dict:
        return {"pairs": manifest.file("pairs").to_json(), **tokenizer_json(manifest)}

    def load_files(self, root: pathlib.Path, manifest, evaluation: EvalData) -> dict:
        ref = manifest.file("pairs")
        pairs = parse_pairs(
            read_inside(root, ref.file, ref.sha256, max_bytes=MAX_LABELS_BYTES),
            manifest.eval.samples,
            root / ref.file,
        )
        check_groups(pairs, root / ref.file)
        return {"pairs": pairs, **load_tokenizer(root, manifest, evaluation.x)}

    def inputs_json(self, inputs) -> bytes:
        return pairs_json(inputs)

    def parse_inputs(self, data: bytes, samples: int, where) -> tuple:
        pairs = parse_pairs(data, samples, where)
        check_groups(pairs, where)
        return pairs

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


# --- the task's own checks, files and figures ------------------------------------


def check_pair_eval(
    x: np.ndarray, scores: np.ndarray, where: str | os.PathLike, pad_id: int = 0
) -> EvalData:
    """A cross-encoder's `eval.npz`: the pairs' token ids `x (N, T)` (padded with
    `pad_id`) and the float model's `scores (N, 1)`, N a multiple of `PASSAGES` (the
    rows come in groups that share a query). Its y is each row's group."""

    n = check_token_ids(x, where, pad_id)
    if scores.ndim != 2 or scores.shape != (n, 1) or scores.dtype.kind != "f":
        raise UsageError(
            f"scores must be float of shape [{n}, 1], got {describe_array(scores)}", where
        )
    check_inputs(scores, where, "scores")
    if n % PASSAGES:
        raise UsageError(
            f"x has {n} pairs; expected groups of {PASSAGES} passages per query (a multiple "
            f"of {PASSAGES})",
            where,
        )
    groups = np.arange(n, dtype=np.int64) // PASSAGES
    return EvalData(x, groups, scores.astype(np.float32), labelled=False)


def pairs_json(pairs) -> bytes:
    """`pairs.json`'s bytes: a cross-encoder's eval pairs, [query, passage] per sample."""
    return (json.dumps([list(pair) for pair in pairs], ensure_ascii=False) + "\n").encode("utf-8")


def parse_pairs(data: bytes, samples: int, where: str | os.PathLike) -> tuple[tuple[str, str], ...]:
    """`pairs.json`: one [query, passage] per eval sample, each printable, at most
    `MAX_TEXT` characters."""
    pairs = parse_json(data, where)
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs
    ):
        raise UsageError("expected a JSON list of [query, passage] pairs", where)
    if len(pairs) != samples:
        raise UsageError(f"has {len(pairs)} pairs, manifest.json says {samples}", where)
    for i, pair in enumerate(pairs):
        if any(len(text) > MAX_TEXT or safe(text) != text or not text.strip() for text in pair):
            raise UsageError(
                f"pair {i} must be two non-empty texts of at most {MAX_TEXT} printable characters",
                where,
            )
    return tuple((query, passage) for query, passage in pairs)


# A cross-encoder's eval pairs come in groups of PASSAGES consecutive rows that
# share a query (tasks/pair_scoring.py): a reranker orders one query's passages.
PASSAGES = 20


def measure_ranking(scores: np.ndarray, reference: np.ndarray) -> Parity:
    """Figures of a mode's pair scores `(N, 1)` against the float model's, group by group.

    top-1: the mode ranks the float model's best passage of a query first;
    top-5: the float model's best is among the mode's five best (a result
    page of five still shows it); a passage the mode scores equal to the one
    in that place counts (a tie is not a miss). The |Δ| figures are on the scale of the
    float scores, |Δ| / max(1, max |s|): a sigmoid score's difference as it
    is, a logit's relative to the largest (a reranker declaring no sigmoid).
    """
    scores = np.asarray(scores, np.float64).reshape(-1)
    reference = np.asarray(reference, np.float64).reshape(-1)
    if not np.isfinite(scores).all():
        return Parity(math.nan, math.nan, math.nan, math.nan)
    groups = len(scores) // PASSAGES
    ours = scores[: groups * PASSAGES].reshape(groups, PASSAGES)
    theirs = reference[: groups * PASSAGES].reshape(groups, PASSAGES)
    best = np.argmax(theirs, axis=1)  # the float model's first passage of each query
    mine = ours[np.arange(groups), best]  # the mode's score of that passage
    # a tie is a hit: an int8 sigmoid's steps of 1/256 put equal passages side by side
    top1 = float((mine >= ours.max(axis=1)).mean())
    fifth = np.sort(ours, axis=1)[:, -min(5, PASSAGES)]
    diff = np.abs(scores - reference) / max(1.0, float(np.abs(reference).max()))
    return Parity(
        accuracy=math.nan,
        agreement=top1,
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        top1=top1,
        top5=float((mine >= fifth).mean()),
    )


def ranking_thresholds(mode: str, samples: int) -> Thresholds:
    """A cross-encoder's `mode` on `samples` pairs (`samples // PASSAGES` queries).

    What a user of a reranker notices is the best passage leaving the first
    page: the float model's best passage must stay among the mode's five best
    for all but `changes_allowed(queries)` queries, the embedding models' rule
    with a query in place of a sentence. Top-1 is reported, not bounded: two
    passages within a rounding of each other swap places without a user being
    able to tell. float32 and float16 also bound every score (on the float
    scores' scale, `measure_ranking`) as they bound a probability.
    """
    if mode not in FLOAT_THRESHOLDS and mode not in QUANTIZED_MODES:
        raise ValueError(f"unknown mode {mode!r}")
    queries = max(1, samples // PASSAGES)
    allowed = changes_allowed(queries)
    return Thresholds(
        max_abs_diff=FLOAT_THRESHOLDS[mode].max_abs_diff if mode in FLOAT_THRESHOLDS else None,
        min_top5=(queries - allowed) / queries,
    )
