"""A language model on the device: greedy tokens over a KV cache the app carries.

The file (export/decoder.py) has two signatures over the same weights:

    prefill(ids (1, P), cache, index) -> logits (1, P, V), cache
    decode (ids (1, 1), cache, index) -> logits (1, 1, V), cache

`cache` `(L, 2, 1, S, h_kv, d)` float32 holds every layer's keys and values
of positions 0 .. S - 1 (S: the file's context); a call writes its tokens'
at `index` and returns it. The app keeps it between calls, so a prompt is
projected once and each new token costs one decode call. A prompt goes in
P tokens a prefill call; its last chunk is padded with id 0, which changes
nothing: the padding's keys land after the prompt, hidden by the causal
mask until each new token overwrites its own position before it attends.
Where a chunk would not fit before S, the rest goes one decode call a token
(a runtime clamps a write past the end instead of refusing it).

Standard library, numpy and a TFLite runtime only.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time

import numpy as np

from bundle_contract.errors import UsageError

from .runtime import load_interpreter

SIGNATURES = ("prefill", "decode")


@dataclasses.dataclass
class Generation:
    """Greedy tokens after a prompt, and each step's top-two logit gap
    (a gap within rounding is a tie: either token is the model's)."""

    prompt_ids: list[int]
    new_ids: list[int]
    gaps: list[float]


class CachedDecoder:
    """A decoder file's two signatures on one interpreter of `runtime`
    (`edge_demo.runtimes.runtime.Runtime`), the cache between calls its own."""

    def __init__(self, runtime, content: bytes, num_threads: int | None = None,
                 where: str = "model"):  # fmt: skip
        def ready(interpreter) -> dict:
            found = interpreter.get_signature_list()
            if all(name in found for name in SIGNATURES):
                self.prefill = interpreter.get_signature_runner("prefill")
                self.decode = interpreter.get_signature_runner("decode")
                self._warm_up()  # the delegate is made on the first call
            return found

        self.interpreter, found, self.load_ms = load_interpreter(
            runtime, content, num_threads, where, ready
        )
        missing = [name for name in SIGNATURES if name not in found]
        if missing:
            raise UsageError(
                f"has no {' or '.join(missing)} signature (found: {', '.join(found) or 'none'}); "
                "a language model's file has prefill and decode",
                where,
            )
        shapes = {}
        for name, runner in (("prefill", self.prefill), ("decode", self.decode)):
            details = runner.get_input_details()
            if set(details) != {"ids", "cache", "index"}:
                raise UsageError(
                    f"its {name} signature takes {sorted(details)}, not ids, cache and index",
                    where,
                )
            shapes[name] = {k: tuple(int(d) for d in v["shape"]) for k, v in details.items()}
        self.cache_shape = shapes["prefill"]["cache"]
        if shapes["decode"]["cache"] != self.cache_shape or len(self.cache_shape) != 6:
            raise UsageError(
                f"its caches disagree: prefill {shapes['prefill']['cache']}, "
                f"decode {shapes['decode']['cache']} (expected the same (L, 2, 1, S, h_kv, d))",
                where,
            )
        if shapes["decode"]["ids"] != (1, 1) or len(shapes["prefill"]["ids"]) != 2:
            raise UsageError(
                f"its ids are {shapes['prefill']['ids']} (prefill) and "
                f"{shapes['decode']['ids']} (decode), expected (1, P) and (1, 1)",
                where,
            )
        self.chunk = shapes["prefill"]["ids"][1]  # P
        self.context = self.cache_shape[3]  # S
        # Seconds in each kind of call and the tokens they took (tokens/s figures).
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        self.tokens = {"prefill": 0, "decode": 0}

    def _warm_up(self) -> None:
        """One decode call of token 0 on an empty cache (part of loading, not timed)."""
        details = self.decode.get_input_details()
        self.decode(**{k: np.zeros(d["shape"], d["dtype"]) for k, d in details.items()})

    def check_entry(self, entry, where) -> None:
        """The file's signatures against its manifest entry (`models.<mode>.signatures`):
        a UsageError naming `where` for a tensor whose shape or dtype differs."""
        for name, runner in (("prefill", self.prefill), ("decode", self.decode)):
            said = entry.signatures.get(name)
            if said is None:
                raise UsageError(f"manifest.json has no {name} signature for it", where)
            found = {**runner.get_input_details(), **runner.get_output_details()}
            for key, spec in {**said.inputs, **said.outputs}.items():
                detail = found.get(key)
                if detail is None:
                    raise UsageError(f"its {name} signature has no tensor {key!r}", where)
                shape = tuple(int(d) for d in detail["shape"])
                dtype = np.dtype(detail["dtype"]).name
                if shape != tuple(spec.shape) or dtype != spec.dtype:
                    raise UsageError(
                        f"its {name} signature's {key} is {dtype} {list(shape)} but manifest.json "
                        f"says {spec.dtype} {list(spec.shape)}",
                        where,
                    )

    def empty_cache(self) -> np.ndarray:
        return np.zeros(self.cache_shape, np.float32)

    def _call(self, runner, ids: list[int], cache: np.ndarray, index: int, width: int):
        x = np.zeros((1, width), np.int32)
        x[0, : len(ids)] = ids
        kind = "decode" if runner is self.decode else "prefill"
        start = time.perf_counter()
        out = runner(ids=x, cache=cache, index=np.asarray([index], np.int32))
        self.seconds[kind] += time.perf_counter() - start
        self.tokens[kind] += len(ids)
        return np.asarray(out["logits"][0, : len(ids)], np.float32), out["cache"]

    def feed(self, ids: list[int], cache: np.ndarray, index: int):
        """`ids` at positions index .. index + len - 1: (their logits (T, V), the cache)."""
        if index + len(ids) > self.context:
            raise UsageError(
                f"{index + len(ids)} tokens exceed the file's context of {self.context} "
                "(export it with a longer --context)",
                "prompt",
            )
        rows, at = [], 0
        while at < len(ids):
            if index + at + self.chunk <= self.context and len(ids) - at > 1:
                piece = ids[at : at + self.chunk]
                logits, cache = self._call(self.prefill, piece, cache, index + at, self.chunk)
            else:  # one token, or a chunk that would run past the context
                piece = ids[at : at + 1]
                logits, cache = self._call(self.decode, piece, cache, index + at, 1)
            rows.append(logits)
            at += len(piece)
        return np.concatenate(rows), cache

    def logits(self, ids: list[int]) -> np.ndarray:
        """The logits `(T, V)` of every position of `ids` (teacher-forced)."""
        logits, _ = self.feed([int(t) for t in ids], self.empty_cache(), 0)
        return logits

    def greedy(self, prompt_ids, max_new_tokens: int, eos_id: int | None = None,
               on_token=None) -> Generation:  # fmt: skip
        """Up to `max_new_tokens` greedy tokens (stops after `eos_id`); `on_token(id)`
        is called with each as it is chosen (streaming)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise UsageError("is empty: a prompt needs at least one token", "prompt")
        if len(prompt) + max_new_tokens > self.context:
            raise UsageError(
                f"{len(prompt)} tokens + {max_new_tokens} new exceed the file's context of "
                f"{self.context} positions",
                "prompt",
            )
        logits, cache = self.feed(prompt, self.empty_cache(), 0)
        scores, new, gaps = logits[-1], [], []
        index = len(prompt)
        while True:
            token = int(np.argmax(scores))
            top2 = np.partition(scores.astype(np.float64), -2)[-2:]
            gaps.append(float(top2[1] - top2[0]))
            new.append(token)
            if on_token is not None:
                on_token(token)
            if token == eos_id or len(new) == max_new_tokens:
                return Generation(prompt, new, gaps)
            logits, cache = self._call(self.decode, [token], cache, index, 1)
            scores = logits[0]
            index += 1

    def tokens_per_second(self, kind: str) -> float:
        """Tokens a second in `kind` ("prefill", "decode") calls so far (NaN: none)."""
        seconds = self.seconds[kind]
        return self.tokens[kind] / seconds if self.tokens[kind] and seconds > 0 else math.nan


def score_mode(bundle, mode: str, runtime, threads: int = 1, keep_raw: bool = False):
    """One mode of a language model's bundle on the device (`score.run_mode` for a
    task that `generates`): every eval sentence teacher-forced through the cache,
    every prompt's greedy tokens; the task's figures, tokens/s, memory. `keep_raw`:
    the result keeps each position's NLL of its next token, (N, T) float64 (the
    logits themselves are N x T x V; equal logits give equal NLLs)."""
    from bundle_contract.tasks.language_model import LanguageOutputs, next_token_figures

    from .result import ModeResult, PeakMemory

    entry = bundle.manifest.models[mode]
    evaluation, where = bundle.eval, bundle.path(entry.file)
    content = bundle.model_bytes[mode]
    gc.collect()
    memory = PeakMemory()
    decoder = CachedDecoder(runtime, content, threads, str(where))
    decoder.check_entry(entry, where)
    load_ms = decoder.load_ms
    n, t = evaluation.x.shape
    top1, nll = np.full((n, t), -1, np.int64), np.zeros((n, t))
    greedy = np.zeros_like(evaluation.greedy)
    try:
        for row in range(n):
            ids = evaluation.x[row, : int(evaluation.lengths[row])]
            top, _, found = next_token_figures(decoder.logits(ids), ids)
            top1[row, : len(ids)], nll[row, : len(ids)] = top, found
        for row in range(len(greedy)):
            made = decoder.greedy(evaluation.prompt(row), greedy.shape[1])
            greedy[row] = made.new_ids
    except (RuntimeError, ValueError) as exc:  # the runtime failed on a model it loaded
        return ModeResult(mode, "failed", load_ms=load_ms, thresholds=entry.thresholds,
                          failures=[f"{runtime.name} failed running it: {exc}"])  # fmt: skip
    peak_mb, increase_mb = memory.peak_mb()
    parity = bundle.task.measure(LanguageOutputs(top1, nll, greedy), evaluation)
    failures = entry.thresholds.failures(parity, math.nan)
    return ModeResult(
        mode=mode,
        status="failed" if failures else "passed",
        **{f.name: getattr(parity, f.name) for f in dataclasses.fields(parity)},
        prefill_tokens_per_s=round(decoder.tokens_per_second("prefill"), 1),
        decode_tokens_per_s=round(decoder.tokens_per_second("decode"), 1),
        load_ms=round(load_ms, 3),
        peak_rss_mb=round(peak_mb, 1),
        rss_increase_mb=round(increase_mb, 2) if math.isfinite(increase_mb) else math.nan,
        memory_scope=memory.scope,
        model_bytes=len(content),
        samples=n,
        timed_invocations=sum(decoder.tokens.values()),
        thresholds=entry.thresholds,
        failures=failures,
        raw=nll if keep_raw else None,
    )
