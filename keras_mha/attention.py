"""Multi-head attention, written the way the lesson explains it.

    head_i    = Attention(Q W_i^Q, K W_i^K, V W_i^V)              (1) (2)
    Attention(q, k, v) = softmax(q k^T / sqrt(d_k)) v             (2)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O          (3)

(1) each head projects d_model into its own d_k = d_model / h subspace,
(2) every head runs scaled dot-product attention in parallel,
(3) the head outputs are concatenated and one matrix W^O mixes them.

Every equation is a line of `_per_head_attention`; `_fused_attention` computes
the same numbers for all heads at once from the same per-head weights.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import constraints, initializers, ops, regularizers

try:  # The mask a tensor carries (Embedding(mask_zero=True), Masking, ...).
    from keras.src.backend import get_keras_mask as _get_keras_mask
except ImportError:  # pragma: no cover - older/newer layouts

    def _get_keras_mask(x):
        return getattr(x, "_keras_mask", None)


IMPLEMENTATIONS = ("fused", "per_head")


# Masked scores sit this far below the row's smallest score (see _masked_softmax).
_MASK_MARGIN = 16.0


def _check_positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        expected = "a positive integer" + (" or `None`" if allow_none else "")
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected "
            f"{expected}. Received: {name}={value!r}"
        )


@keras.saving.register_keras_serializable(package="keras_mha")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with explicit per-head projections.

    A drop-in replacement for `keras.layers.MultiHeadAttention` (rank-3
    inputs, attention over the sequence axis) whose weights are laid out the
    way the lesson writes them: head `i` owns `W_i^Q`, `W_i^K`, `W_i^V`
    (and biases) that project `d_model` into a `d_k = d_model / h` subspace;
    the heads' outputs are concatenated and one matrix `W^O` mixes them.

    Weights (created in `build`, names are API):

    | variable         | shape               | lesson        |
    | ---------------- | ------------------- | ------------- |
    | `query_kernel`   | `(h, d_query, d_k)` | `W_i^Q = query_kernel[i]` |
    | `query_bias`     | `(h, d_k)`          | `b_i^Q`       |
    | `key_kernel`     | `(h, d_key, d_k)`   | `W_i^K`       |
    | `key_bias`       | `(h, d_k)`          | `b_i^K`       |
    | `value_kernel`   | `(h, d_value, d_v)` | `W_i^V`       |
    | `value_bias`     | `(h, d_v)`          | `b_i^V`       |
    | `output_kernel`  | `(h * d_v, d_out)`  | `W^O`; rows `i*d_v:(i+1)*d_v` read head i |
    | `output_bias`    | `(d_out,)`          | `b^O`         |

    `head_weights(i)` returns head `i`'s matrices as numpy arrays.
    `concat_heads(query, ...)` returns Concat(head_1, ..., head_h), the
    `(B, T, h * d_v)` tensor that W^O multiplies.

    Args:
        num_heads: Number of attention heads `h`.
        key_dim: Size `d_k` of each head's query/key subspace. Defaults to
            `d_model // num_heads` (the lesson's 768 / 12 = 64), where
            `d_model` is the query's feature size; `d_model` must then be
            divisible by `num_heads`.
        value_dim: Size `d_v` of each head's value subspace. Defaults to
            `key_dim`.
        output_dim: Feature size `d_out` of the output. Defaults to the
            query's feature size.
        dropout: Dropout rate on the attention weights, in `[0, 1)`.
        use_bias: Whether the projections have biases.
        implementation: `"fused"` (default) computes all heads in one batched
            contraction; `"per_head"` loops over the heads and concatenates
            them explicitly, line for line with the lesson. Both use the same
            weights and agree to ~1e-6.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: As for `keras.layers.Dense`.
        seed: Seed for the dropout layer.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, d_query)`.
        value: `(B, S, d_value)`; `None` means self-attention (`value=query`).
        key: `(B, S, d_key)`; defaults to `value`.
        attention_mask: Boolean, broadcastable to `(B, T, S)`; `True` means
            "may attend". Combined with the Keras masks carried by the inputs
            (e.g. from `Embedding(mask_zero=True)`) and the causal mask.
        use_causal_mask: Forbid position `t` to attend to positions `> t`.
        return_attention_scores: Also return the attention weights.
        training: Dropout on the attention weights only when `True`.
        head_mask: Optional `(h,)` or `(B, h)` multiplier on each head's
            output (1 keeps a head, 0 silences it); used by head analysis.

    Returns:
        `(B, T, d_out)`, and with `return_attention_scores=True` also the
        attention weights `(B, h, T, S)`.

    Example:

    >>> layer = MultiHeadAttention(num_heads=2)
    >>> x = keras.random.normal((3, 5, 8))
    >>> y, scores = layer(x, return_attention_scores=True)
    >>> y.shape, scores.shape
    ((3, 5, 8), (3, 2, 5, 5))

    Reference: Vaswani et al., "Attention Is All You Need", 2017, section 3.2.
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int | None = None,
        value_dim: int | None = None,
        output_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        implementation: str = "fused",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed: int | None = None,
        **kwargs,
    ):
        _check_positive_int("num_heads", num_heads)
        _check_positive_int("key_dim", key_dim, allow_none=True)
        _check_positive_int("value_dim", value_dim, allow_none=True)
        _check_positive_int("output_dim", output_dim, allow_none=True)
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0.0 <= dropout < 1.0
        ):
            raise ValueError(
                "Received an invalid value for argument `dropout`, expected a "
                f"float in [0, 1). Received: dropout={dropout!r}"
            )
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(
                "Received an invalid value for argument `implementation`, "
                f"expected one of {IMPLEMENTATIONS}. "
                f"Received: implementation={implementation!r}"
            )
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        self.supports_masking = True
        self.num_heads = int(num_heads)
        self.key_dim = None if key_dim is None else int(key_dim)
        self.value_dim = None if value_dim is None else int(value_dim)
        self.output_dim = None if output_dim is None else int(output_dim)
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.implementation = implementation
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.bias_constraint = constraints.get(bias_constraint)
        self.seed = seed
        self._dropout_layer = keras.layers.Dropout(
            rate=self.dropout, seed=seed, dtype=self.dtype_policy
        )
        # Resolved in build(): the lesson's d_model, d_k, d_v.
        self.d_model = None
        self.d_k = None
        self.d_v = None

    # ------------------------------------------------------------------ build
    def _resolve_dims(self, query_shape, value_shape, key_shape):
        for name, shape in (
            ("query", query_shape),
            ("value", value_shape),
            ("key", key_shape),
        ):
            if len(shape) != 3:
                raise ValueError(
                    f"`{name}` must be a rank-3 tensor (batch, sequence, "
                    f"features). Received: {name}.shape={tuple(shape)}"
                )
            if shape[-1] is None:
                raise ValueError(
                    f"The last dimension of `{name}` must be known. "
                    f"Received: {name}.shape={tuple(shape)}"
                )
        d_model = int(query_shape[-1])
        key_dim = self.key_dim
        if key_dim is None:
            if d_model % self.num_heads:
                raise ValueError(
                    "With `key_dim=None`, the query feature size d_model must "
                    f"be divisible by `num_heads` (d_k = d_model / h). "
                    f"Received: d_model={d_model}, num_heads={self.num_heads}"
                )
            key_dim = d_model // self.num_heads
        value_dim = self.value_dim or key_dim
        output_dim = self.output_dim or d_model
        return d_model, key_dim, value_dim, output_dim

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        d_model, d_k, d_v, d_out = self._resolve_dims(query_shape, value_shape, key_shape)
        h = self.num_heads
        self.d_model, self.d_k, self.d_v = d_model, d_k, d_v
        self._d_out = d_out
        self._d_key_in = int(key_shape[-1])
        self._d_value_in = int(value_shape[-1])

        def kernel(name, shape, keras_shape, to_ours):
            return self.add_weight(
                name=name,
                shape=shape,
                initializer=self._like_keras(keras_shape, to_ours),
                regularizer=self.kernel_regularizer,
                constraint=self.kernel_constraint,
            )

        def bias(name, shape):
            if not self.use_bias:
                return None
            return self.add_weight(
                name=name,
                shape=shape,
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )

        # Head i owns query_kernel[i], key_kernel[i], value_kernel[i].
        heads_first = lambda w: ops.transpose(w, (1, 0, 2))  # noqa: E731
        self.query_kernel = kernel(  # W_i^Q = query_kernel[i]
            "query_kernel", (h, d_model, d_k), (d_model, h, d_k), heads_first
        )
        self.query_bias = bias("query_bias", (h, d_k))
        self.key_kernel = kernel(  # W_i^K = key_kernel[i]
            "key_kernel", (h, self._d_key_in, d_k), (self._d_key_in, h, d_k), heads_first
        )
        self.key_bias = bias("key_bias", (h, d_k))
        self.value_kernel = kernel(  # W_i^V = value_kernel[i]
            "value_kernel", (h, self._d_value_in, d_v), (self._d_value_in, h, d_v), heads_first
        )
        self.value_bias = bias("value_bias", (h, d_v))
        self.output_kernel = kernel(  # W^O
            "output_kernel",
            (h * d_v, d_out),
            (h, d_v, d_out),
            lambda w: ops.reshape(w, (h * d_v, d_out)),
        )
        self.output_bias = bias("output_bias", (d_out,))
        self._dropout_layer.build((None, h, None, None))
        self.built = True

    def _like_keras(self, keras_shape, to_ours):
        """Draw a kernel in keras.layers.MultiHeadAttention's layout, then
        rearrange it into ours, so both layers start from the same
        distribution (Glorot's fans depend on the layout)."""
        init = self.kernel_initializer

        def initializer(shape, dtype=None):
            return to_ours(init(keras_shape, dtype=dtype))

        return initializer

    # ------------------------------------------------------------------- call
    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        head_mask=None,
    ):
        query, key, value, mask = self._inputs_and_mask(
            query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask
        )
        output, scores = self._attend(query, key, value, mask, training, head_mask)
        if return_attention_scores:
            return output, scores
        return output

    def concat_heads(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        head_mask=None,
    ):
        """Concat(head_1, ..., head_h) before W^O: `(B, T, h * d_v)`.

        Head `i` fills columns `i*d_v:(i+1)*d_v`; the layer's output is this
        times `output_kernel` plus `output_bias`. Arguments as for `call`
        (inference: no dropout), masks carried by the inputs included. A
        plain method, not a Keras call: it computes in the weights' dtype
        (float32 under a mixed-precision policy). Used to refit W^O after
        pruning.
        """
        self._require_built("concat_heads")
        masks = [query_mask, value_mask, key_mask]
        tensors = [query, value, key]
        for i, x in enumerate(tensors):
            if x is not None:
                masks[i] = masks[i] if masks[i] is not None else _get_keras_mask(x)
                tensors[i] = ops.cast(x, self.variable_dtype)
        query, value, key = tensors
        query_mask, value_mask, key_mask = masks
        query, key, value, mask = self._inputs_and_mask(
            query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask
        )
        concat, _ = self._attend(query, key, value, mask, False, head_mask, project=False)
        return concat

    def _attend(self, *args, **kwargs):
        if self.implementation == "per_head":
            return self._per_head_attention(*args, **kwargs)
        return self._fused_attention(*args, **kwargs)

    def _inputs_and_mask(
        self, query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask
    ):
        """(query, key, value, mask): defaults filled in, mask `(B, 1, T, S)` or None."""
        if query_mask is None:
            # Keras fills `<arg>_mask` only when several tensors are passed.
            query_mask = _get_keras_mask(query)
        if value is None:
            value, value_mask = query, query_mask
        if key is None:
            key, key_mask = value, value_mask
        self._check_call_shapes(query, value, key, attention_mask)
        # Keras fills query_mask/value_mask/key_mask from the masks the
        # inputs carry (Embedding(mask_zero=True), Masking); the output keeps
        # the query's mask.
        mask = self._compute_attention_mask(
            query,
            value,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
        )
        if mask is not None:
            mask = ops.expand_dims(mask, axis=1)  # (B, 1, T, S): every head
        return query, key, value, mask

    def _scaled_dot_product_attention(self, q, k, v, mask, training):
        """Equation (2): softmax(q k^T / sqrt(d_k)) v, for one or all heads.

        q = [..., T, d_k], k = [..., S, d_k], v = [..., S, d_v],
        mask broadcastable to [..., T, S].
        """
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2))  # q k^T   [..., T, S]
        scores = scores / ops.cast(math.sqrt(self.d_k), scores.dtype)
        weights = self._masked_softmax(scores, mask)  # [..., T, S]
        dropped = self._dropout_layer(weights, training=training)
        return ops.matmul(dropped, v), weights  # [..., T, d_v]

    def _masked_softmax(self, scores, mask):
        """softmax over the positions the mask allows; zeros for empty rows.

        Keras sets masked scores to -1e9. That is exact in float, but an int8
        or int16 model calibrates the tensor's range from it and loses every
        real score to one quantum. We set masked scores to the row's smallest
        score minus 16 instead: each masked position then weighs at most
        e^-16 (1e-7) of the best allowed one, and the range stays tight.
        """
        if mask is None:
            return ops.softmax(scores, axis=-1)
        floor = ops.min(scores, axis=-1, keepdims=True) - _MASK_MARGIN
        weights = ops.softmax(ops.where(mask, scores, floor), axis=-1)
        # A query row with nothing to attend to gets zeros, as in Keras.
        return ops.where(mask, weights, ops.zeros_like(weights))

    def _per_head_attention(self, query, key, value, mask, training, head_mask, project=True):
        """The lesson, line by line: each head on its own, then Concat, W^O."""
        heads, head_scores = [], []
        for i in range(self.num_heads):
            q_i = ops.matmul(query, self.query_kernel[i])  # Q W_i^Q [B, T, d_k]
            k_i = ops.matmul(key, self.key_kernel[i])  # K W_i^K     [B, S, d_k]
            v_i = ops.matmul(value, self.value_kernel[i])  # V W_i^V [B, S, d_v]
            if self.use_bias:
                q_i = q_i + self.query_bias[i]
                k_i = k_i + self.key_bias[i]
                v_i = v_i + self.value_bias[i]
            head_mask_i = None if mask is None else mask[:, 0]  # [B, T, S]
            head_i, weights_i = self._scaled_dot_product_attention(
                q_i, k_i, v_i, head_mask_i, training
            )  # [B, T, d_v], [B, T, S]
            if head_mask is not None:
                head_i = head_i * self._head_gate(head_mask, head_i.dtype)[:, i, None, None]
            heads.append(head_i)
            head_scores.append(weights_i)
        # re-assemble all head outputs side by side: Concat(head_1..head_h)
        concat = ops.concatenate(heads, axis=-1)  # [B, T, h * d_v]
        if not project:
            return concat, ops.stack(head_scores, axis=1)
        output = ops.matmul(concat, self.output_kernel)  # Concat(...) W^O
        if self.use_bias:
            output = output + self.output_bias
        return output, ops.stack(head_scores, axis=1)  # [B, T, d_out], [B, h, T, S]

    def _fused_attention(self, query, key, value, mask, training, head_mask, project=True):
        """All heads in one batched contraction, from the same weights.

        Head i's W_i^Q sits in columns i*d_k:(i+1)*d_k of one (d_model, h*d_k)
        matrix, so a single matmul projects every head at once.
        """
        h, d_v = self.num_heads, self.d_v
        q = self._project_all_heads(query, self.query_kernel, self.query_bias)  # [B, h, T, d_k]
        k = self._project_all_heads(key, self.key_kernel, self.key_bias)  # [B, h, S, d_k]
        v = self._project_all_heads(value, self.value_kernel, self.value_bias)  # [B, h, S, d_v]
        heads, weights = self._scaled_dot_product_attention(
            q, k, v, mask, training
        )  # [B, h, T, d_v], [B, h, T, S]
        if head_mask is not None:
            heads = heads * self._head_gate(head_mask, heads.dtype)[:, :, None, None]
        # re-assemble all head outputs side by side: Concat(head_1..head_h)
        heads = ops.transpose(heads, (0, 2, 1, 3))  # [B, T, h, d_v]
        concat = ops.reshape(heads, (-1, self._length(query), h * d_v))  # [B, T, h * d_v]
        if not project:
            return concat, weights
        output = ops.matmul(concat, self.output_kernel)  # Concat(...) W^O
        if self.use_bias:
            output = output + self.output_bias
        return output, weights

    @staticmethod
    def _length(x):
        return x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]

    def _project_all_heads(self, x, kernel, bias):
        """x [B, L, d_in] -> [B, h, L, d] with kernel [h, d_in, d], bias [h, d]."""
        h, d_in, d = kernel.shape
        side_by_side = ops.reshape(ops.transpose(kernel, (1, 0, 2)), (d_in, h * d))
        y = ops.matmul(x, side_by_side)  # [B, L, h * d]
        if bias is not None:
            y = y + ops.reshape(bias, (h * d,))
        y = ops.reshape(y, (-1, self._length(x), h, d))  # [B, L, h, d]
        return ops.transpose(y, (0, 2, 1, 3))

    def _head_gate(self, head_mask, dtype):
        gate = ops.cast(ops.convert_to_tensor(head_mask), dtype)
        if len(gate.shape) == 1:
            gate = ops.expand_dims(gate, 0)
        if len(gate.shape) != 2 or gate.shape[-1] != self.num_heads:
            raise ValueError(
                "`head_mask` must have shape (num_heads,) or (batch, num_heads)"
                f" with num_heads={self.num_heads}. Received: "
                f"head_mask.shape={tuple(gate.shape)}"
            )
        return gate  # [B or 1, h]

    # ------------------------------------------------------------------ masks
    def _compute_attention_mask(
        self,
        query,
        value,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
    ):
        """Boolean [B, T, S] mask, or None: input masks & causal & explicit."""
        mask = None

        def merge(m):
            return m if mask is None else ops.logical_and(mask, m)

        if query_mask is not None:
            mask = merge(ops.expand_dims(ops.cast(query_mask, "bool"), -1))  # [B, T, 1]
        if value_mask is not None:
            mask = merge(ops.expand_dims(ops.cast(value_mask, "bool"), -2))  # [B, 1, S]
        if key_mask is not None:
            mask = merge(ops.expand_dims(ops.cast(key_mask, "bool"), -2))  # [B, 1, S]
        if use_causal_mask:
            mask = merge(self._compute_causal_mask(query, value))  # [1, T, S]
        if attention_mask is not None:
            mask = merge(ops.cast(attention_mask, "bool"))
        return mask

    @staticmethod
    def _compute_causal_mask(query, value):
        """[1, T, S] lower-triangular: position t sees positions <= t."""
        t = ops.shape(query)[1]
        s = ops.shape(value)[1]
        rows = ops.expand_dims(ops.arange(t), -1)
        cols = ops.expand_dims(ops.arange(s), 0)
        return ops.expand_dims(ops.greater_equal(rows, cols), 0)

    def _check_call_shapes(self, query, value, key, attention_mask):
        shapes = {"query": query.shape, "value": value.shape, "key": key.shape}
        for name, shape in shapes.items():
            if len(shape) != 3:
                raise ValueError(
                    f"`{name}` must be a rank-3 tensor (batch, sequence, "
                    f"features). Received: {name}.shape={tuple(shape)}"
                )
        if self.built:
            expected = {
                "query": self.d_model,
                "value": self._d_value_in,
                "key": self._d_key_in,
            }
            for name, shape in shapes.items():
                if shape[-1] is not None and shape[-1] != expected[name]:
                    raise ValueError(
                        f"`{name}` has {shape[-1]} features but the layer was "
                        f"built for {expected[name]}. Received: "
                        f"{name}.shape={tuple(shape)}"
                    )
        s_value, s_key = value.shape[1], key.shape[1]
        if s_value is not None and s_key is not None and s_value != s_key:
            raise ValueError(
                "`key` and `value` must have the same sequence length. "
                f"Received: key.shape={tuple(key.shape)}, "
                f"value.shape={tuple(value.shape)}"
            )
        if attention_mask is not None:
            target = (query.shape[0], query.shape[1], value.shape[1])
            m = tuple(attention_mask.shape)
            ok = len(m) <= 3 and all(
                a is None or b is None or a == 1 or a == b for a, b in zip(m[::-1], target[::-1])
            )
            if not ok:
                raise ValueError(
                    "`attention_mask` must be broadcastable to (batch, T, S) = "
                    f"{target}. Received: attention_mask.shape={m}"
                )

    # ---------------------------------------------------------------- shapes
    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        if value_shape[1:-1] != key_shape[1:-1]:
            raise ValueError(
                "`key` and `value` must have the same sequence length. "
                f"Received: key_shape={tuple(key_shape)}, "
                f"value_shape={tuple(value_shape)}"
            )
        d_out = self.output_dim or query_shape[-1]
        return tuple(query_shape[:-1]) + (d_out,)

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        head_mask=None,
    ):
        value = query if value is None else value
        key = value if key is None else key
        self._check_call_shapes(query, value, key, attention_mask)
        out = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape, key.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return out
        scores_shape = (query.shape[0], self.num_heads, query.shape[1], value.shape[1])
        return out, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    # ---------------------------------------------------------------- config
    def get_config(self):
        base_config = super().get_config()
        config = {
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "output_dim": self.output_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "implementation": self.implementation,
            "kernel_initializer": initializers.serialize(self.kernel_initializer),
            "bias_initializer": initializers.serialize(self.bias_initializer),
            "kernel_regularizer": regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": regularizers.serialize(self.bias_regularizer),
            "activity_regularizer": regularizers.serialize(self.activity_regularizer),
            "kernel_constraint": constraints.serialize(self.kernel_constraint),
            "bias_constraint": constraints.serialize(self.bias_constraint),
            "seed": self.seed,
        }
        return {**base_config, **config}

    # ------------------------------------------------------- per-head access
    def _require_built(self, what: str):
        if not self.built:
            raise ValueError(f"`{what}` needs a built layer; call the layer on an input first.")

    def head_weights(self, i: int) -> dict[str, np.ndarray]:
        """Head `i`'s own matrices as numpy arrays.

        Returns `query_kernel` (d_model, d_k), `key_kernel`, `value_kernel`
        (d_value, d_v), their biases (zeros when `use_bias=False`) and
        `output_kernel`, the (d_v, d_out) block of W^O that reads head `i`.
        """
        self._require_built("head_weights")
        if (
            isinstance(i, bool)
            or not isinstance(i, (int, np.integer))
            or not 0 <= i < self.num_heads
        ):
            raise ValueError(
                f"Head index must be an integer in [0, {self.num_heads}). Received: i={i!r}"
            )

        def bias(var, size):
            return np.zeros((size,), "float32") if var is None else ops.convert_to_numpy(var[i])

        d_v = self.d_v
        return {
            "query_kernel": ops.convert_to_numpy(self.query_kernel[i]),
            "query_bias": bias(self.query_bias, self.d_k),
            "key_kernel": ops.convert_to_numpy(self.key_kernel[i]),
            "key_bias": bias(self.key_bias, self.d_k),
            "value_kernel": ops.convert_to_numpy(self.value_kernel[i]),
            "value_bias": bias(self.value_bias, d_v),
            "output_kernel": ops.convert_to_numpy(self.output_kernel)[i * d_v : (i + 1) * d_v],
        }

    def pruned(self, keep_heads) -> MultiHeadAttention:
        """A new, built layer with only the heads in `keep_heads`.

        The removed heads' W_i^Q, W_i^K, W_i^V, biases and their rows of W^O
        are gone, so its output equals this layer's with those heads masked
        out (`head_mask` 0). `key_dim`/`value_dim` are pinned, since d_k no
        longer equals d_model / h.
        """
        self._require_built("pruned")
        keep = sorted({int(i) for i in keep_heads})
        if not keep:
            raise ValueError("`keep_heads` must keep at least one head. Received: keep_heads=[]")
        if keep[0] < 0 or keep[-1] >= self.num_heads:
            raise ValueError(
                f"`keep_heads` must be head indices in [0, {self.num_heads}). "
                f"Received: keep_heads={list(keep_heads)}"
            )
        config = self.get_config()
        config.update(num_heads=len(keep), key_dim=self.d_k, value_dim=self.d_v)
        if self.output_dim is None:
            config["output_dim"] = self._d_out
        new = MultiHeadAttention.from_config(config)
        new.build(
            (None, None, self.d_model),
            (None, None, self._d_value_in),
            (None, None, self._d_key_in),
        )
        idx = np.array(keep)
        rows = np.concatenate([np.arange(i * self.d_v, (i + 1) * self.d_v) for i in keep])
        for name in ("query_kernel", "key_kernel", "value_kernel"):
            getattr(new, name).assign(ops.convert_to_numpy(getattr(self, name))[idx])
        new.output_kernel.assign(ops.convert_to_numpy(self.output_kernel)[rows])
        if self.use_bias:
            for name in ("query_bias", "key_bias", "value_bias"):
                getattr(new, name).assign(ops.convert_to_numpy(getattr(self, name))[idx])
            new.output_bias.assign(ops.convert_to_numpy(self.output_bias))
        return new

    # ------------------------------------------------------ Keras interop
    @classmethod
    def from_keras(cls, layer, implementation: str = "fused") -> MultiHeadAttention:
        """Build ours from a built `keras.layers.MultiHeadAttention`.

        Supports rank-3 inputs with the default attention axes. Keras stores
        the query kernel as (d_model, h, d_k); head i's W_i^Q is [:, i, :].
        """
        if not isinstance(layer, keras.layers.MultiHeadAttention):
            raise ValueError(
                "`from_keras` expects a keras.layers.MultiHeadAttention. "
                f"Received: {type(layer).__name__}"
            )
        if not layer.built:
            raise ValueError(
                "`from_keras` needs a built keras.layers.MultiHeadAttention "
                "(call it on an input first)."
            )
        q_kernel = ops.convert_to_numpy(layer.query_dense.kernel)
        if q_kernel.ndim != 3 or layer.attention_axes not in (None, (1,)):
            raise ValueError(
                "`from_keras` supports rank-3 inputs with the default attention "
                f"axes. Received: query kernel shape {q_kernel.shape}, "
                f"attention_axes={layer.attention_axes}"
            )
        if getattr(layer, "_use_gate", False) or getattr(layer, "_sliding_window", None):
            raise ValueError("`from_keras` does not support `use_gate` or `sliding_window`.")
        out_kernel = ops.convert_to_numpy(layer.output_dense.kernel)  # (h, d_v, d_out)
        d_model = q_kernel.shape[0]
        d_out = out_kernel.shape[-1]
        new = cls(
            num_heads=layer.num_heads,
            key_dim=layer.key_dim,
            value_dim=layer.value_dim,
            output_dim=None if d_out == d_model else d_out,
            dropout=layer.dropout,
            use_bias=layer.use_bias,
            implementation=implementation,
            seed=layer.seed,
            name=layer.name,
            dtype=layer.dtype_policy,
        )
        k_kernel = ops.convert_to_numpy(layer.key_dense.kernel)
        v_kernel = ops.convert_to_numpy(layer.value_dense.kernel)
        new.build(
            (None, None, d_model),
            (None, None, v_kernel.shape[0]),
            (None, None, k_kernel.shape[0]),
        )
        to_heads = (1, 0, 2)  # (d_in, h, d) -> (h, d_in, d)
        new.query_kernel.assign(np.transpose(q_kernel, to_heads))
        new.key_kernel.assign(np.transpose(k_kernel, to_heads))
        new.value_kernel.assign(np.transpose(v_kernel, to_heads))
        new.output_kernel.assign(out_kernel.reshape(-1, d_out))
        if layer.use_bias:
            new.query_bias.assign(ops.convert_to_numpy(layer.query_dense.bias))
            new.key_bias.assign(ops.convert_to_numpy(layer.key_dense.bias))
            new.value_bias.assign(ops.convert_to_numpy(layer.value_dense.bias))
            new.output_bias.assign(ops.convert_to_numpy(layer.output_dense.bias))
        return new

    def to_keras(self) -> keras.layers.MultiHeadAttention:
        """The equivalent built `keras.layers.MultiHeadAttention`."""
        self._require_built("to_keras")
        layer = keras.layers.MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.d_k,
            value_dim=self.d_v,
            output_shape=None if self._d_out == self.d_model else self._d_out,
            dropout=self.dropout,
            use_bias=self.use_bias,
            seed=self.seed,
            name=self.name,
            dtype=self.dtype_policy,
        )
        layer.build(
            (None, None, self.d_model),
            (None, None, self._d_value_in),
            (None, None, self._d_key_in),
        )
        from_heads = (1, 0, 2)
        layer.query_dense.kernel.assign(
            np.transpose(ops.convert_to_numpy(self.query_kernel), from_heads)
        )
        layer.key_dense.kernel.assign(
            np.transpose(ops.convert_to_numpy(self.key_kernel), from_heads)
        )
        layer.value_dense.kernel.assign(
            np.transpose(ops.convert_to_numpy(self.value_kernel), from_heads)
        )
        layer.output_dense.kernel.assign(
            ops.convert_to_numpy(self.output_kernel).reshape(self.num_heads, self.d_v, self._d_out)
        )
        if self.use_bias:
            layer.query_dense.bias.assign(ops.convert_to_numpy(self.query_bias))
            layer.key_dense.bias.assign(ops.convert_to_numpy(self.key_bias))
            layer.value_dense.bias.assign(ops.convert_to_numpy(self.value_bias))
            layer.output_dense.bias.assign(ops.convert_to_numpy(self.output_bias))
        return layer
