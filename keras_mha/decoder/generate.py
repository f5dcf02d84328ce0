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


PREFILL_BUCKET = 16  # prompts padded to a multiple: one compiled prefill per bucket
CACHE_BUCKET = 64  # caches sized to a multiple: one compiled step per bucket


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def compiled_step(model):
    """`model.step` compiled for the backend: `(ids, caches, index) -> (logits, caches)`,
    numpy ids and a Python index in, the backend's tensors out.

    TensorFlow traces it once per shape (tf.function); JAX compiles it with the
    weights as arguments, not constants (jax.jit over a keras.StatelessScope);
    PyTorch runs it eagerly without building a graph for gradients. The index
    goes in as a tensor, so each new position reuses the compiled step.
    """
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        traced = tf.function(model.step)
        return lambda ids, caches, index: traced(ids, caches, tf.constant(index, tf.int32))
    if backend == "jax":
        import jax

        def pure(state, ids, caches, index):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, state))):
                return model.step(ids, caches, index)

        jitted = jax.jit(pure)
        state = [v.value for v in model.variables]
        return lambda ids, caches, index: jitted(state, ids, caches, np.int32(index))
    if backend == "torch":
        import torch

        def eager(ids, caches, index):
            with torch.no_grad():
                return model.step(ids, caches, index)

        return eager
    return model.step


def greedy(model, prompt_ids, max_new_tokens: int, eos_id: int | None = None,
           step=None) -> Generation:  # fmt: skip
    """`max_new_tokens` greedy tokens after `prompt_ids` (stops after `eos_id`).

    `step`: a `compiled_step(model)` to reuse across calls (one is made if
    None). The prompt goes in padded to a multiple of PREFILL_BUCKET, which
    changes nothing it computes: the padding's keys land in cache positions
    after the prompt, which the causal mask hides until each new token
    overwrites its own position before attending to it.
    """
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
    step = step or compiled_step(model)
    length = min(context, _round_up(len(prompt) + max_new_tokens, CACHE_BUCKET))
    caches = model.empty_caches(1, length)
    padded = min(length, _round_up(len(prompt), PREFILL_BUCKET))
    ids = np.zeros((1, padded), np.int32)
    ids[0, : len(prompt)] = prompt
    logits, caches = step(ids, caches, 0)  # prefill: the whole prompt once
    last = len(prompt) - 1
    new, gaps = [], []
    index = len(prompt)
    for _ in range(max_new_tokens):
        scores = np.asarray(ops.convert_to_numpy(logits[0, last]), np.float64)
        token = int(np.argmax(scores))
        top2 = np.partition(scores, -2)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        new.append(token)
        if token == eos_id or len(new) == max_new_tokens:
            break
        logits, caches = step(np.asarray([[token]], np.int32), caches, index)
        last = 0
        index += 1
    return Generation(prompt, new, gaps)
