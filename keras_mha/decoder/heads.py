"""The lesson's question on a language model: which heads, and which key/value groups, matter.

Michel, Levy & Neubig (2019) asked "are sixteen heads really better than
one?" with a mask xi_h on each head's output (1 = on) and its importance
I_h = E_x |dL(x) / d xi_h| (keras_mha/heads/importance.py does it for the
classifiers). A language model's loss is what it is for: the negative
log-likelihood of each next token of an eval text, here the project's corpus
held-out sentences (keras_mha/pretrained/corpus.txt), which no test tunes on.

Grouped-query attention adds a second unit: key/value group g, read by the
query heads i with i // (h / h_kv) = g. Silencing all of them is removing
the group: its keys and values are never computed, and the KV cache loses
its share. A group's importance is the sum of its query heads'.

    importance(lm, text)             (L, h): I per query head, L2-normalised per layer
    prune_curve(lm, text, I, unit)   the least important units silenced, k at a time;
                                     each cut scored by next-token agreement with the
                                     full model, perplexity, and the cache left

The masks silence heads in a forward pass (`Decoder(ids, head_mask=...)`);
the scores are what a model with those heads cut out would compute.
Importance takes gradients: TensorFlow only (a GradientTape), as the
classifiers'.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bundle_contract.errors import UsageError

EVAL_SENTENCES = 64  # held-out corpus sentences: about 1,300 next tokens for SmolLM2
BATCH = 16


@dataclasses.dataclass
class EvalText:
    """Sentences as right-padded ids `(N, T)` and where a next token is scored
    (`valid[n, t]`: position t predicts token t + 1 of sentence n)."""

    ids: np.ndarray
    valid: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.valid.sum())


def eval_text(lm, sentences: int = EVAL_SENTENCES) -> EvalText:
    """The corpus's first `sentences` held-out sentences in `lm`'s tokens."""
    from keras_mha.pretrained import corpus

    _, held_out = corpus.split()
    encoded = [lm.encode(s) for s in held_out[:sentences]]
    ids = np.zeros((len(encoded), max(map(len, encoded))), np.int32)
    valid = np.zeros((len(encoded), ids.shape[1] - 1), bool)
    for row, tokens in enumerate(
        encoded
    ):  # causal: the padding after a sentence changes none of it
        ids[row, : len(tokens)] = tokens
        valid[row, : len(tokens) - 1] = True
    return EvalText(ids, valid)


def all_heads(lm) -> np.ndarray:
    c = lm.config
    return np.ones((c.num_hidden_layers, c.num_attention_heads), np.float32)


def _scored(logits: np.ndarray, ids: np.ndarray, valid: np.ndarray):
    """Each valid position's NLL of the next token and the top token."""
    logits = np.asarray(logits[:, :-1], np.float64)
    top = logits.max(-1, keepdims=True)
    log_z = top[..., 0] + np.log(np.exp(logits - top).sum(-1))
    picked = np.take_along_axis(logits, ids[:, 1:, None].astype(np.int64), -1)[..., 0]
    return (log_z - picked)[valid], logits.argmax(-1)[valid]


def evaluate(lm, text: EvalText, head_mask=None) -> tuple[np.ndarray, np.ndarray]:
    """(NLL, top token) at each scored position, with `head_mask` `(L, h)` applied."""
    from keras import ops

    nll, top = [], []
    mask = None if head_mask is None else np.asarray(head_mask, np.float32)
    for start in range(0, len(text.ids), BATCH):
        ids = text.ids[start : start + BATCH]
        logits = ops.convert_to_numpy(lm.model(ids, head_mask=mask))
        n, t = _scored(logits, ids, text.valid[start : start + BATCH])
        nll.append(n)
        top.append(t)
    return np.concatenate(nll), np.concatenate(top)


def importance(lm, text: EvalText) -> np.ndarray:
    """I_h = mean over sentences of |dL/d xi_h| (L: the sentence's summed NLL),
    `(L, h)`, L2-normalised per layer (Michel et al.)."""
    scores = np.abs(head_gradients(lm, text)).mean(axis=1)
    return scores / np.maximum(np.linalg.norm(scores, axis=1, keepdims=True), 1e-12)


def head_gradients(lm, text: EvalText) -> np.ndarray:
    """dL(x)/d xi_h at xi = 1 for each sentence x, `(L, N, h)` (L(x): its summed NLL)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        raise UsageError("head importance takes gradients with TensorFlow", "KERAS_BACKEND")
    import tensorflow as tf

    layers, heads = all_heads(lm).shape
    found = []
    for start in range(0, len(text.ids), BATCH):
        ids = text.ids[start : start + BATCH]
        valid = tf.constant(text.valid[start : start + BATCH], tf.float32)
        xi = tf.Variable(tf.ones((layers, len(ids), heads)))  # one mask a sentence
        with tf.GradientTape() as tape:
            logits = lm.model(ids, head_mask=xi)[:, :-1]
            nll = tf.nn.sparse_softmax_cross_entropy_with_logits(ids[:, 1:], logits)
            loss = tf.reduce_sum(nll * valid)
        found.append(tape.gradient(loss, xi).numpy())
    return np.concatenate(found, axis=1)


def group_importance(lm, scores: np.ndarray) -> np.ndarray:
    """`(L, h_kv)`: each key/value group's query heads' importance, summed."""
    c = lm.config
    return scores.reshape(c.num_hidden_layers, c.num_key_value_heads, -1).sum(-1)


def cache_bytes_per_token(config, groups_kept: int, itemsize: int = 4) -> int:
    """The KV cache's bytes a token, for `groups_kept` key/value heads over all layers
    (`config`: a DecoderConfig): keys and values, head_dim floats each."""
    return 2 * groups_kept * config.head_dim * itemsize


def prune_curve(lm, text: EvalText, scores: np.ndarray, unit: str, counts) -> list[dict]:
    """For each k in `counts`: the k least important units ("head": query heads,
    "group": key/value groups) silenced at once, scored against the full model."""
    c = lm.config
    group = c.num_attention_heads // c.num_key_value_heads
    if unit == "head":
        ranked = np.dstack(np.unravel_index(np.argsort(scores, axis=None), scores.shape))[0]
    elif unit == "group":
        g = group_importance(lm, scores)
        ranked = np.dstack(np.unravel_index(np.argsort(g, axis=None), g.shape))[0]
    else:
        raise ValueError(f"unit must be 'head' or 'group', got {unit!r}")
    full_nll, full_top = evaluate(lm, text)
    rows = []
    for k in counts:
        mask = all_heads(lm)
        for layer, index in ranked[:k]:
            if unit == "head":
                mask[layer, index] = 0.0
            else:
                mask[layer, index * group : (index + 1) * group] = 0.0
        nll, top = (full_nll, full_top) if k == 0 else evaluate(lm, text, mask)
        groups_kept = int((mask.reshape(c.num_hidden_layers, c.num_key_value_heads, -1)
                           .max(-1) > 0).sum())  # fmt: skip
        rows.append({
            "unit": unit,
            "removed": int(k),
            "query_heads_left": int(mask.sum()),
            "groups_left": groups_kept,
            "agreement": float((top == full_top).mean()),
            "perplexity": float(np.exp(nll.mean())),
            "cache_bytes_per_token": cache_bytes_per_token(lm.config, groups_kept),
        })  # fmt: skip
    return rows
