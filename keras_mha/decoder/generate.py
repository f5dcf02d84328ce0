"""Greedy generation with a KV cache: the prompt once, then one token a step.

    prefill:  logits, caches = step(prompt ids, empty caches, index 0)
    decode:   next = argmax(logits[-1]); logits, caches = step([next], caches, index)

Each step projects only the new token; its query attends over the cached
keys and values of every earlier position (attention.py). Greedy (the
highest logit, ties to the lowest id, as numpy's argmax) is the default
because it is reproducible: the same model gives the same tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from keras import ops

from bundle_contract.errors import UsageError


@dataclasses.dataclass
class Generation:
    """What `generate` returns: the prompt's ids, the new ids, and each step's
    top-two logit gap (how decided the choice was: a gap within rounding is a tie)."""

    prompt_ids: list[int]
    new_ids: list[int]
    gaps: list[float]


def greedy(model, prompt_ids, max_new_tokens: int, eos_id: int | None = None) -> Generation:
    """`max_new_tokens` greedy tokens after `prompt_ids` (stops after `eos_id`)."""
    prompt = [int(t) for t in prompt_ids]
    context = model.decoder_config.max_position_embeddings
    if not prompt:
        raise UsageError("is empty: a prompt needs at least one token", "prompt")
    if max_new_tokens < 1:
        raise UsageError(f"must be at least 1, got {max_new_tokens}", "max_new_tokens")
    if len(prompt) + max_new_tokens > context:
        raise UsageError(
            f"{len(prompt)} tokens + {max_new_tokens} new exceed the model's context of "
            f"{context} positions",
            "prompt",
        )
    caches = model.empty_caches(1, len(prompt) + max_new_tokens)
    ids = np.asarray([prompt], np.int32)
    logits, caches = model.step(ids, caches, 0)  # prefill: the whole prompt once
    new, gaps = [], []
    index = len(prompt)
    for _ in range(max_new_tokens):
        last = np.asarray(ops.convert_to_numpy(logits[0, -1]), np.float64)
        token = int(np.argmax(last))
        top2 = np.partition(last, -2)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        new.append(token)
        if token == eos_id or len(new) == max_new_tokens:
            break
        logits, caches = model.step(np.asarray([[token]], np.int32), caches, index)
        index += 1
    return Generation(prompt, new, gaps)
