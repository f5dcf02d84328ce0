"""The timing: every engine at each thread count, sentence by sentence, in turns.

Per thread count (`bench_threads`): every engine runs every sentence once
(warm-up; these embeddings give the fidelity against the reference: the
contract's `measure_embeddings`, min/mean cosine and top-1/top-5 nearest
neighbours, the figures export verifies a mode by). Then --repeats rounds over
the sentences; each sentence is run by every engine in turn (round robin, the
starting engine rotating), so machine noise hits all alike. Each call is timed
from the int32 ids to the unit-norm vector. With more than one thread each call
comes after a --pause-ms sleep (PAUSE_MS), so no spinning worker thread of the
previous engine is still running; at one thread there is no pause. A
sentence's latency is the median of its rounds; p50/p90 are over sentences.
"""

from __future__ import annotations

import gc
import statistics
import time

import numpy as np

from bundle_contract.parity import EMBEDDING_FIGURES
from bundle_contract.tasks.embedding import measure_embeddings

from .engines import build_engine
from .peers import TORCH

PAUSE_MS = 5.0  # before each timed call when threads > 1 (--pause-ms)


def latency_summary(per_sentence_ms: list[list[float]]) -> dict:
    """p50/p90/mean (ms) over sentences of each sentence's median over its rounds."""
    medians = [statistics.median(t) for t in per_sentence_ms]
    p50, p90 = np.percentile(medians, [50, 90])
    return {"p50_ms": float(p50), "p90_ms": float(p90), "mean_ms": statistics.fmean(medians)}


def round_robin(runners: dict, inputs: list, repeats: int, pause_s: float, clock=None) -> dict:
    """Per engine, per sentence, the ms of each of `repeats` calls, timed in turns.

    For each round and sentence every engine runs it once; the engine that
    starts rotates with the sentence and the round. `clock`: perf_counter_ns.
    """
    clock = clock or time.perf_counter_ns
    names = list(runners)
    times = {name: [[] for _ in inputs] for name in names}
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for i, x in enumerate(inputs):
                k = (i + r) % len(names)
                for name in names[k:] + names[:k]:
                    if pause_s:
                        time.sleep(pause_s)
                    t0 = clock()
                    runners[name](x)
                    times[name][i].append((clock() - t0) / 1e6)
    finally:
        if enabled:
            gc.enable()
    return times


def fidelity_of(embeddings: dict[str, np.ndarray], reference: np.ndarray | None) -> dict:
    """Each engine's vectors against the reference (None: PyTorch eager's), scored by the
    contract's `measure_embeddings`: min/mean cosine, top-1/top-5 nearest neighbours."""
    ref = reference if reference is not None else embeddings[TORCH]
    out = {}
    for name, vectors in embeddings.items():
        parity = measure_embeddings(vectors, ref)
        out[name] = {k: getattr(parity, k) for k in EMBEDDING_FIGURES}
    return out


def bench_threads(specs, ids, reference, threads, repeats, pause_s, record_fidelity):
    """One thread count: build, warm up (embeddings), time in turns."""
    runners = {spec["name"]: build_engine(spec, threads) for spec in specs}
    embeddings = {
        name: np.stack([run(x) for x in ids]).astype(np.float32) for name, run in runners.items()
    }
    times = round_robin(runners, ids, repeats, pause_s)
    latency = {name: latency_summary(t) for name, t in times.items()}
    fidelity = fidelity_of(embeddings, reference) if record_fidelity else None
    del runners
    gc.collect()
    return latency, fidelity


def bench_all_threads(specs, ids, reference, thread_counts, repeats, pause_ms):
    """Each thread count in turn (`bench_threads`): latency per thread count ("1": engine ->
    p50/p90/mean) and the fidelity, measured at the first."""
    latency: dict = {}
    fidelity = None
    for n, threads in enumerate(thread_counts):
        print(
            f"threads {threads}: {len(specs)} engines x {len(ids)} sentences x {repeats} rounds ...",
            flush=True,
        )
        latency[str(threads)], f = bench_threads(
            specs,
            ids,
            reference,
            threads,
            repeats,
            pause_ms / 1000 if threads > 1 else 0.0,
            n == 0,
        )
        fidelity = fidelity or f
    return latency, fidelity
