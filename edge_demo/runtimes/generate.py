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

import numpy as np

from bundle_contract.errors import UsageError

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

    def __init__(self, runtime, content: bytes, num_threads: int | None = None):
        self.interpreter = runtime.interpreter(model_content=content, num_threads=num_threads)
        found = self.interpreter.get_signature_list()
        missing = [name for name in SIGNATURES if name not in found]
        if missing:
            raise UsageError(
                f"has no {' or '.join(missing)} signature (found: {', '.join(found) or 'none'}); "
                "a language model's file has prefill and decode",
                "model",
            )
        self.prefill = self.interpreter.get_signature_runner("prefill")
        self.decode = self.interpreter.get_signature_runner("decode")
        shapes = {}
        for name, runner in (("prefill", self.prefill), ("decode", self.decode)):
            details = runner.get_input_details()
            if set(details) != {"ids", "cache", "index"}:
                raise UsageError(
                    f"its {name} signature takes {sorted(details)}, not ids, cache and index",
                    "model",
                )
            shapes[name] = {k: tuple(int(d) for d in v["shape"]) for k, v in details.items()}
        self.cache_shape = shapes["prefill"]["cache"]
        if shapes["decode"]["cache"] != self.cache_shape or len(self.cache_shape) != 6:
            raise UsageError(
                f"its caches disagree: prefill {shapes['prefill']['cache']}, "
                f"decode {shapes['decode']['cache']} (expected the same (L, 2, 1, S, h_kv, d))",
                "model",
            )
        if shapes["decode"]["ids"] != (1, 1) or len(shapes["prefill"]["ids"]) != 2:
            raise UsageError(
                f"its ids are {shapes['prefill']['ids']} (prefill) and "
                f"{shapes['decode']['ids']} (decode), expected (1, P) and (1, 1)",
                "model",
            )
        self.chunk = shapes["prefill"]["ids"][1]  # P
        self.context = self.cache_shape[3]  # S

    def empty_cache(self) -> np.ndarray:
        return np.zeros(self.cache_shape, np.float32)

    def _call(self, runner, ids: list[int], cache: np.ndarray, index: int, width: int):
        x = np.zeros((1, width), np.int32)
        x[0, : len(ids)] = ids
        out = runner(ids=x, cache=cache, index=np.asarray(index, np.int32))
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
