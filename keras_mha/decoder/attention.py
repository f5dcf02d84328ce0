"""Causal self-attention for a decoder: the lesson's heads, rotated, with a KV cache.

    q_i = RoPE(X W_i^Q, p)          query head i                          (1)
    k_g = RoPE(X W_g^K, p)          key/value head g = i // (h / h_kv)    (1)
    v_g = X W_g^V
    head_i = softmax(q_i k_g^T / sqrt(d_k) + causal) v_g                  (2)
    out = Concat(head_1, ..., head_h) W^O                                 (3)

It is `keras_mha.MultiHeadAttention` (grouped-query attention with
`num_key_value_heads`, the lesson's per-head path with
`implementation="per_head"`) with two things a language model adds: the
rotary position embedding on each head's query and key (layers.py), and the
cache. Generating token t+1 needs every earlier token's k_g and v_g; they do
not change once computed (the mask hides later tokens), so the layer keeps
them: `cache` holds the keys and values of positions 0 .. S_max - 1, the call
writes its own tokens' at `cache_index` and attends over the cache, and the
prompt is never projected again. GQA is what makes this cheap: the cache
holds h_kv heads, not h.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_mha.attention import MultiHeadAttention
from keras_mha.attention.masks import head_mask_tensor

from .layers import rotary_angles, rotate


@keras.saving.register_keras_serializable(package="keras_mha")
class CausalSelfAttention(MultiHeadAttention):
    """Grouped-query causal self-attention with rotary positions and a KV cache.

    Args: `MultiHeadAttention`'s, plus `rope_base` (RoPE's base, 10000 in
    Llama 2, 100000 in SmolLM2). Call: `layer(x, cache=None, cache_index=0)`;
    `x` `(B, T, d_model)` holds the tokens at positions cache_index ..
    cache_index + T - 1. Without a cache the output is `(B, T, d_model)`; with
    one (`empty_cache`) it is `(output, cache)`, the cache with these tokens'
    keys and values written in. `return_attention_scores=True` appends the
    weights `(B, h, T, S)` (S: T, or the cache's length).
    """

    def __init__(self, num_heads: int, rope_base: float = 10000.0, **kwargs):
        super().__init__(num_heads, **kwargs)
        self.rope_base = float(rope_base)

    def empty_cache(self, batch_size: int, length: int, dtype="float32"):
        """Zeros for `length` positions: (keys, values), each `(B, S, h_kv, d)`."""
        shape = (batch_size, length, self.num_key_value_heads, self.d_k)
        return ops.zeros(shape, dtype), ops.zeros(shape[:-1] + (self.d_v,), dtype)

    def call(
        self,
        x,
        cache=None,
        cache_index=0,
        return_attention_scores=False,
        training=None,
        head_mask=None,
    ):
        if head_mask is not None:  # (h,) or (B, h): head i's output times column i
            head_mask = head_mask_tensor(head_mask, self.num_heads, self.compute_dtype)
        positions = cache_index + ops.arange(ops.shape(x)[1], dtype="int32")  # p of each token
        cos, sin = rotary_angles(positions, self.d_k, self.rope_base)  # [T, d_k]
        if self.implementation == "per_head":
            q_heads, keys, values = self._per_head_projections(x, cos, sin)
        else:
            q = rotate(self._query_dense(x), cos[:, None, :], sin[:, None, :])  # [B, T, h, d_k]
            keys = rotate(self._key_dense(x), cos[:, None, :], sin[:, None, :])  # [B,T,h_kv,d_k]
            values = self._value_dense(x)  # [B, T, h_kv, d_v]
        if cache is not None:  # these tokens' keys and values join the earlier ones
            start = (0, cache_index, 0, 0)
            keys = ops.slice_update(cache[0], start, ops.cast(keys, cache[0].dtype))
            values = ops.slice_update(cache[1], start, ops.cast(values, cache[1].dtype))
        # causal: the query at position p sees the keys at positions s <= p
        allowed = ops.arange(ops.shape(keys)[1], dtype="int32")[None, :] <= positions[:, None]
        mask = allowed[None]  # [1, T, S]
        if self.implementation == "per_head":
            output, scores = self._attend_per_head(q_heads, keys, values, mask, training, head_mask)
        else:
            output, scores = self._attend_fused(q, keys, values, mask, training, head_mask)
        result = (output,) if cache is None else (output, (keys, values))
        if return_attention_scores:
            result += (scores,)
        return result[0] if len(result) == 1 else result

    def _per_head_projections(self, x, cos, sin):
        """Step (1), head by head: each query head's q_i and each group's k_g, v_g,
        rotated; the keys and values stacked `(B, T, h_kv, d)` for the cache."""
        q_heads = [
            rotate(self._head_projection(self.query_dense, x, i), cos, sin)  # RoPE(X W_i^Q)
            for i in range(self.num_heads)
        ]
        k_groups = [
            rotate(self._head_projection(self.key_dense, x, g), cos, sin)  # RoPE(X W_g^K)
            for g in range(self.num_key_value_heads)
        ]
        v_groups = [
            self._head_projection(self.value_dense, x, g)  # X W_g^V
            for g in range(self.num_key_value_heads)
        ]
        return q_heads, ops.stack(k_groups, axis=2), ops.stack(v_groups, axis=2)

    def _attend_per_head(self, q_heads, keys, values, mask, training, head_mask=None):
        """Steps (2) and (3): head i attends with its group's k_g, v_g; Concat; W^O."""
        heads, weights = [], []
        for i, q_i in enumerate(q_heads):
            g = i // self.group_size  # head i's key/value head
            head_i, weights_i = self._scaled_dot_product_attention(
                q_i, keys[:, :, g, :], values[:, :, g, :], mask=mask, training=training, head=i
            )  # softmax(q_i k_g^T / sqrt(d_k) + causal) v_g  [B, T, d_v]
            if head_mask is not None:  # head analysis: 0 silences head i
                head_i = head_i * head_mask[:, i, None, None]
            heads.append(head_i)
            weights.append(weights_i)
        concat = ops.concatenate(heads, axis=-1)  # Concat(head_1..head_h)  [B, T, h d_v]
        output = self._output_projection(concat)  # Concat(...) W^O  [B, T, d_model]
        return output, ops.stack(weights, axis=1)  # [B, h, T, S]

    def _attend_fused(self, q, keys, values, mask, training, head_mask=None):
        """All heads at once: the key/value heads repeated for their groups."""
        if self.group_size > 1:
            keys = ops.repeat(keys, self.group_size, axis=2)  # [B, S, h, d_k]
            values = ops.repeat(values, self.group_size, axis=2)
        heads, scores = self._compute_attention(
            query=q,
            key=keys,
            value=values,
            attention_mask=mask,
            training=training,
            return_attention_scores=True,
        )  # [B, T, h, d_v], [B, h, T, S]
        if head_mask is not None:
            heads = heads * head_mask[:, None, :, None]
        return self._output_dense(heads), scores

    def get_config(self):
        return {**super().get_config(), "rope_base": self.rope_base}
