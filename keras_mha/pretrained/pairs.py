"""A cross-encoder's eval and calibration pairs, made from the project's corpus.

A reranker is judged on what it is for: ordering the passages of one query.
`eval_pairs` makes `queries` groups of `PASSAGES` (query, passage) pairs from
the eval sentences: each query is an eval sentence; its passages are up to
`SAME_TOPIC` other sentences of its topic (corpus.txt's '#' headings: the
candidates a reranker should put first) and sentences of other topics, in a
shuffled order. `calibration_pairs` pairs each calibration sentence with
another (int8 calibration sees the pair format and both token types).
Deterministic for a seed; keras-free.
"""

from __future__ import annotations

import numpy as np

from bundle_contract.tasks.pair_scoring import PASSAGES
from keras_mha.pretrained import corpus

QUERIES = 30  # groups: 600 pairs, each mode's parity a few seconds for MiniLM
SAME_TOPIC = 5  # passages of the query's own topic, at most


def eval_pairs(texts: list[str], seed: int = 0, queries: int = QUERIES) -> list[tuple[str, str]]:
    """`queries` x `PASSAGES` pairs from the eval sentences `texts`, group by group."""
    topic = corpus.topics()
    if len(texts) <= PASSAGES:
        raise ValueError(f"needs more than {PASSAGES} eval sentences, got {len(texts)}")
    rng = np.random.default_rng([int(seed), 1])
    kinds = [topic.get(text, "") for text in texts]
    order = rng.permutation(len(texts))
    chosen = [int(i) for i in order if sum(k == kinds[i] for k in kinds) > 1][:queries]
    pairs = []
    for q in chosen:
        mates = [i for i in range(len(texts)) if i != q and kinds[i] == kinds[q]]
        others = [i for i in range(len(texts)) if kinds[i] != kinds[q]]
        near = [int(i) for i in rng.permutation(mates)[:SAME_TOPIC]]
        far = [int(i) for i in rng.permutation(others)[: PASSAGES - len(near)]]
        passages = near + far
        rng.shuffle(passages)
        pairs.extend((texts[q], texts[i]) for i in passages)
    return pairs


def calibration_pairs(texts: list[str], seed: int = 0) -> list[tuple[str, str]]:
    """Each calibration sentence with another one (a fixed derangement)."""
    if len(texts) < 2:
        raise ValueError(f"needs at least 2 calibration sentences, got {len(texts)}")
    shift = 1 + int(np.random.default_rng([int(seed), 2]).integers(len(texts) - 1))
    return [(text, texts[(i + shift) % len(texts)]) for i, text in enumerate(texts)]
