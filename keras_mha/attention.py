"""Multi-head attention, written the way the lesson explains it.

    head_i    = Attention(Q W_i^Q, K W_i^K, V W_i^V)              (1) (2)
    Attention(q, k, v) = softmax(q k^T / sqrt(d_k)) v             (2)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O          (3)

(1) each head projects d_model into its own d_k = d_model / h subspace,
(2) every head runs scaled dot-product attention in parallel,
(3) the head outputs are concatenated and one matrix W^O mixes them.

Every equation is a line of `_per_head_attention`; `_fused_attention` computes
the same numbers for all heads at once from the same weights. The weights sit
in Keras `EinsumDense` sublayers laid out exactly as in
`keras.layers.MultiHeadAttention`, with the head axis kept: W_i^Q is
`query_kernel[:, i, :]` (docs/layer.md says why).
"""

from __future__ import annotations

import inspect

import keras
from keras import ops

from keras_mha.attention_axes import causal_mask, inverse_sqrt, sliding_window_mask
from keras_mha.attention_base import (
    IMPLEMENTATIONS,
    MultiHeadAttentionBase,
    get_keras_mask,
    resolve_inputs,
    set_keras_mask,
)

__all__ = ["IMPLEMENTATIONS", "MultiHeadAttention"]

# Masked scores sit this far below the row's smallest score (see _masked_softmax).
_MASK_MARGIN = 16.0


@keras.saving.register_keras_serializable(package="keras_mha")
class MultiHeadAttention(MultiHeadAttentionBase):
    """Multi-head attention with the lesson's per-head matrices, a drop-in
    replacement for `keras.layers.MultiHeadAttention`.

    Head `i` owns `W_i^Q`, `W_i^K`, `W_i^V` (and biases) that project
    `d_model` into a `d_k = d_model / h` subspace; the heads' outputs are
    concatenated and one matrix `W^O` mixes them. The matrices live in Keras
    `EinsumDense` sublayers (`query_dense`, `key_dense`, `value_dense`,
    `output_dense`, and `gate_dense` with `use_gate`) in Keras's own layout,
    so quantization, LoRA, dtype policy maps and Keras's weight files work as
    for Keras's layer. The head is an axis of every kernel:

    | property         | shape                  | lesson                           |
    | ---------------- | ---------------------- | -------------------------------- |
    | `query_kernel`   | `(d_model, h, d_k)`    | `W_i^Q = query_kernel[:, i, :]`  |
    | `query_bias`     | `(h, d_k)`             | `b_i^Q = query_bias[i]`          |
    | `key_kernel`     | `(d_key, h, d_k)`      | `W_i^K = key_kernel[:, i, :]`    |
    | `key_bias`       | `(h, d_k)`             | `b_i^K`                          |
    | `value_kernel`   | `(d_value, h, d_v)`    | `W_i^V = value_kernel[:, i, :]`  |
    | `value_bias`     | `(h, d_v)`             | `b_i^V`                          |
    | `gate_kernel`    | `(d_model, h, d_v)`    | head i's gate (`use_gate`)       |
    | `gate_bias`      | `(h, d_v)`             |                                  |
    | `output_kernel`  | `(h, d_v, *d_out)`     | `W^O`; `output_kernel[i]` reads head i |
    | `output_bias`    | `(*d_out,)`            | `b^O`                            |

    The properties return the sublayers' `keras.Variable`s (biases are
    `None` with `use_bias=False`); `reshape(output_kernel, (h * d_v, -1))` is
    W^O as the lesson writes it. `head_weights(i)` returns head `i`'s
    matrices as numpy arrays, `concat_heads(query, ...)` the `(B, T, h * d_v)`
    Concat(head_1, ..., head_h) that W^O multiplies, `pruned(keep)` a layer
    with fewer heads.

    Args:
        num_heads: Number of attention heads `h`.
        key_dim: Size `d_k` of each head's query/key subspace. Defaults to
            `d_model // num_heads` (the lesson's 768 / 12 = 64), where
            `d_model` is the query's feature size; `d_model` must then be
            divisible by `num_heads`.
        value_dim: Size `d_v` of each head's value subspace. Defaults to
            `key_dim`.
        dropout: Dropout rate on the attention weights, in `[0, 1)`.
        use_bias: Whether the projections have biases.
        output_shape: Shape of the output's features (an int or a tuple).
            Defaults to the query's feature size. (`output_dim`, its name in
            keras_mha 0.1, is still read from saved configs.)
        attention_axes: Axes attention runs over (`None`: all but the batch
            and feature axes), for inputs of rank >= 3.
        sliding_window: Position `t` may attend only to positions `s` with
            `|t - s| < sliding_window`; combined with the causal and explicit
            masks.
        flash_attention: `None` lets the backend decide, `True` asks for a
            flash kernel, `False` forbids it (as in Keras). See
            `_compute_attention` for when `ops.dot_product_attention` is used.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: As for `keras.layers.MultiHeadAttention` (given to
            every projection).
        use_gate: Gated attention (Keras 3.14): each head's output is
            multiplied by `sigmoid(Q W_i^G + b_i^G)` before W^O.
        seed: Seed for the dropout layer.
        implementation: `"fused"` (default) computes all heads in one batched
            contraction; `"per_head"` loops over the heads and concatenates
            them explicitly, line for line with the lesson. Both use the same
            weights and agree to ~1e-6.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, d_query)` (or `(B, <dims>, d_query)`).
        value: `(B, S, d_value)`; `None` means self-attention (`value=query`).
        key: `(B, S, d_key)`; defaults to `value`.
        query_mask, value_mask, key_mask: Boolean `(B, T)` / `(B, S)`, `True`
            for a real position, as in Keras: a query row, a value or key
            column. Each defaults to the mask its tensor carries; one given
            is used even when its tensor is omitted (`mha(x, key_mask=m)`,
            `mha(x, value_mask=m)`). Unlike Keras 3.15, which reads only the
            query's carried mask, an explicit `query_mask` is used. They need
            attention over the last axis before the features.
        attention_mask: Boolean, `True` means "may attend": `(B, T, S)`,
            `(T, S)` or `(B, h, T, S)`, broadcast as Keras does. Combined
            with the Keras masks the inputs carry (`Embedding(mask_zero=True)`),
            the causal mask and the sliding window. A query row with nothing
            to attend to gets zero weights.
        return_attention_scores: Also return the attention weights.
        training: Dropout on the attention weights only when `True`.
        use_causal_mask: Forbid position `t` to attend to positions `> t`.
        head_mask: Optional `(h,)` or `(B, h)` multiplier on each head's
            output (1 keeps a head, 0 silences it); used by head analysis.

    Returns:
        `(B, T, *d_out)`, and with `return_attention_scores=True` also the
        attention weights `(B, h, T, S)` (Keras's shape for other axes).

    Example:

    >>> layer = MultiHeadAttention(num_heads=2)
    >>> x = keras.random.normal((3, 5, 8))
    >>> y, scores = layer(x, return_attention_scores=True)
    >>> y.shape, scores.shape
    ((3, 5, 8), (3, 2, 5, 5))

    Reference: Vaswani et al., "Attention Is All You Need", 2017, section 3.2.
    """

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
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        head_mask=None,
    ):
        query, value, key, masks = resolve_inputs(
            query, value, key, query_mask, value_mask, key_mask
        )
        # As Keras's layer does: the masks are used here, so the projections
        # are not handed masked tensors (they would warn that they drop them).
        for x in (query, value, key):
            set_keras_mask(x, None)
        output, scores = self._attend(
            query,
            value,
            key,
            masks,
            attention_mask,
            use_causal_mask,
            training,
            return_attention_scores,
            head_mask,
        )
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

        Head `i` fills columns `i*d_v:(i+1)*d_v` (gated with `use_gate`);
        the layer's output is this times `reshape(output_kernel, (h*d_v, -1))`
        plus `output_bias`. Arguments as for `call` (inference: no dropout),
        masks carried by the inputs included. A plain method, not a Keras
        call: inputs are cast to the layer's compute dtype. Used to refit W^O
        after pruning.
        """
        self._require_built("concat_heads")
        # The masks as a call reads them (Keras's `__call__` fills in the
        # carried ones there; a plain method reads them itself).
        *tensors, masks = resolve_inputs(query, value, key, query_mask, value_mask, key_mask)
        plain = {}
        for x in tensors:
            if id(x) not in plain:
                y = ops.cast(x, self.compute_dtype)
                # A copy without the mask (used here, as in `call`), leaving the
                # caller's tensor as it was: the projections would warn of it.
                plain[id(x)] = ops.copy(y) if get_keras_mask(y) is not None else y
        query, value, key = (plain[id(x)] for x in tensors)
        concat, _ = self._attend(
            query,
            value,
            key,
            masks,
            attention_mask,
            use_causal_mask,
            False,
            False,
            head_mask,
            project=False,
        )
        return concat

    def _attend(
        self,
        query,
        value,
        key,
        masks,
        attention_mask,
        use_causal_mask,
        training,
        return_attention_scores,
        head_mask,
        project=True,
    ):
        self._check_call_shapes(query, value, key, attention_mask, masks)
        gate = None if head_mask is None else self._head_mask(head_mask)
        if self.implementation == "per_head":
            if self._overrides_compute_attention():
                raise ValueError(
                    "implementation='per_head' computes each head itself; a subclass "
                    "that overrides `_compute_attention` needs implementation='fused'."
                )
            mask = self._compute_attention_mask(
                query, value, *masks, attention_mask, use_causal_mask
            )
            return self._per_head_attention(query, key, value, mask, training, gate, project)
        return self._fused_attention(
            query,
            key,
            value,
            masks,
            attention_mask,
            use_causal_mask,
            training,
            return_attention_scores,
            gate,
            project,
        )

    def _overrides_compute_attention(self) -> bool:
        return type(self)._compute_attention is not MultiHeadAttention._compute_attention

    # ---------------------------------------------------- the lesson, per head
    def _head_projection(self, dense, x, i, full=None):
        """x W_i + b_i for head i: `(B, <dims>, d_in) -> (B, <dims>, d)`.

        A quantized projection has no float matrix to slice: its (quantized)
        output for every head is computed once and head i's slice read.
        """
        if dense.quantization_mode is not None:
            return full[..., i, :]
        y = ops.matmul(x, dense.kernel[:, i, :])  # x W_i
        if dense.bias is not None:
            y = y + dense.bias[i]
        return y

    def _per_head_attention(self, query, key, value, mask, training, gate, project=True):
        """The lesson, line by line: each head on its own, then Concat, W^O."""
        axes = self._axes
        mask = None if mask is None else axes.flatten_mask(mask, query, key)  # [B, h|1, T, S]
        full = {
            a: getattr(self, a)(x) if getattr(self, a).quantization_mode is not None else None
            for a, x in (("_query_dense", query), ("_key_dense", key), ("_value_dense", value))
            + ((("_gate_dense", query),) if self._use_gate else ())
        }
        heads, head_scores = [], []
        projected = {"_query_dense": [], "_key_dense": [], "_value_dense": [], "_gate_dense": []}
        for i in range(self.num_heads):
            q_i = self._head_projection(
                self._query_dense, query, i, full["_query_dense"]
            )  # Q W_i^Q
            k_i = self._head_projection(self._key_dense, key, i, full["_key_dense"])  # K W_i^K
            v_i = self._head_projection(
                self._value_dense, value, i, full["_value_dense"]
            )  # V W_i^V
            projected["_query_dense"].append(q_i)
            projected["_key_dense"].append(k_i)
            projected["_value_dense"].append(v_i)
            mask_i = None if mask is None else mask[:, i if mask.shape[1] > 1 else 0]  # [B, T, S]
            head_i, weights_i = self._scaled_dot_product_attention(
                axes.to_rows(q_i), axes.to_rows(k_i), axes.to_rows(v_i), mask_i, training
            )  # [B, T, d_v], [B, T, S]
            head_i = axes.from_rows(head_i, q_i)
            if self._use_gate:  # head_i * sigmoid(Q W_i^G + b_i^G)
                g_i = self._head_projection(self._gate_dense, query, i, full["_gate_dense"])
                g_i = ops.sigmoid(g_i) if full["_gate_dense"] is None else g_i
                projected["_gate_dense"].append(g_i)
                head_i = head_i * g_i
            if gate is not None:
                head_i = head_i * self._head_mask_for(gate, head_i, i)
            heads.append(head_i)
            head_scores.append(weights_i)
        # re-assemble all head outputs side by side: Concat(head_1..head_h)
        # A layer call (not concat_heads, a plain method outside Keras's call
        # context, where nothing would clear them) adds the projections'
        # activity losses: each projection's output, its heads side by side
        # as EinsumDense's.
        for attr, parts in projected.items():
            if project and parts:
                self._add_activity_loss(getattr(self, attr), parts)
        concat = ops.concatenate(heads, axis=-1)  # [B, T, h * d_v]
        scores = axes.unflatten_scores(ops.stack(head_scores, axis=1), query, key)  # [B, h, T, S]
        if not project:
            return concat, scores
        if self._output_dense.quantization_mode is not None:
            return self._output_dense(ops.stack(heads, axis=-2)), scores
        w_o = ops.reshape(self._output_dense.kernel, (self.num_heads * self.d_v, -1))
        output = ops.matmul(concat, w_o)  # Concat(...) W^O
        if len(self._d_out) > 1:
            output = ops.reshape(output, tuple(ops.shape(output)[:-1]) + self._d_out)
        if self.use_bias:
            output = output + self._output_dense.bias
        self._add_activity_loss(self._output_dense, output)
        return output, scores  # [B, T, d_out], [B, h, T, S]

    @staticmethod
    def _add_activity_loss(dense, output):
        """What calling `dense` would have added: the per-head path computes its
        output from the kernel, so it adds the sublayer's activity regularizer
        loss itself, divided by the batch size as Keras's `Layer.__call__`
        does. `output`: the projection's output, or its heads' outputs to
        stack as EinsumDense's. A quantized projection was called and added
        its own."""
        if dense.activity_regularizer is None or dense.quantization_mode is not None:
            return
        if isinstance(output, list):
            output = ops.stack(output, axis=-2)
        loss = dense.activity_regularizer(output)
        dense.add_loss(ops.divide_no_nan(loss, ops.cast(ops.shape(output)[0], loss.dtype)))

    def _scaled_dot_product_attention(self, q, k, v, mask, training):
        """Equation (2): softmax(q k^T / sqrt(d_k)) v, for one or all heads.

        q = [..., T, d_k], k = [..., S, d_k], v = [..., S, d_v],
        mask broadcastable to [..., T, S].
        """
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2))  # q k^T   [..., T, S]
        scores = scores * ops.cast(inverse_sqrt(self.d_k), scores.dtype)  # / sqrt(d_k)
        weights = self._masked_softmax(scores, mask)  # [..., T, S]
        dropped = self._dropout_layer(weights, training=training) if self.dropout else weights
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

    # ------------------------------------------------------- all heads fused
    def _fused_attention(
        self,
        query,
        key,
        value,
        masks,
        attention_mask,
        use_causal_mask,
        training,
        return_attention_scores,
        gate,
        project=True,
    ):
        """All heads at once: one EinsumDense per projection, the heads a
        batch axis of the attention, W^O one contraction over (h, d_v)."""
        # Causal alone: no (T, S) mask is built; the backend's causal kernel
        # may run (as in Keras). A subclass always receives the mask.
        causal_only = (
            use_causal_mask
            and all(m is None for m in masks)
            and attention_mask is None
            and self._sliding_window is None
            and not self._overrides_compute_attention()
        )
        mask = None
        if not causal_only:
            mask = self._compute_attention_mask(
                query, value, *masks, attention_mask, use_causal_mask
            )
        gate_values = self._gate_dense(query) if self._use_gate else None  # [B, T, h, d_v]
        q = self._query_dense(query)  # [B, T, h, d_k]
        k = self._key_dense(key)  # [B, S, h, d_k]
        v = self._value_dense(value)  # [B, S, h, d_v]
        extra = {"use_causal_mask": True} if causal_only else {}
        heads, scores = self._call_compute_attention(
            q, k, v, mask, training, return_attention_scores, extra
        )  # [B, T, h, d_v], [B, h, T, S]
        if gate_values is not None:
            heads = heads * gate_values
        if gate is not None:
            heads = (
                heads * gate[:, None, :, None]
                if len(heads.shape) == 4
                else heads
                * ops.reshape(gate, (-1,) + (1,) * (len(heads.shape) - 3) + (self.num_heads, 1))
            )
        if not project:
            # re-assemble all head outputs side by side: Concat(head_1..head_h)
            shape = tuple(ops.shape(heads)[:-2]) + (self.num_heads * self.d_v,)
            return ops.reshape(heads, shape), scores  # [B, T, h * d_v]
        return self._output_dense(heads), scores  # Concat(...) W^O   [B, T, d_out]

    def _call_compute_attention(self, q, k, v, mask, training, return_scores, extra):
        method = self._compute_attention
        if self._overrides_compute_attention():
            # keras-hub's subclasses take (query, key, value, attention_mask, training).
            params = inspect.signature(method).parameters
            if "return_attention_scores" not in params and not any(
                p.kind is p.VAR_KEYWORD for p in params.values()
            ):
                return method(q, k, v, mask, training)
        return method(q, k, v, mask, training, return_scores, **extra)

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        """The override point (as in Keras): attention on projected heads.

        Args:
            query: `(B, T, h, d_k)` (`(B, <dims>, h, d_k)` for other axes).
            key: `(B, S, h, d_k)`.
            value: `(B, S, h, d_v)`.
            attention_mask: Boolean, broadcastable to the scores as in
                `call` (`(B, T, S)`, `(T, S)`, `(B, h, T, S)`), or `None`.
            training: Dropout on the attention weights when `True`.
            return_attention_scores: Whether the caller needs the weights.
            use_causal_mask: Also apply the causal mask.

        Returns:
            `(attention_output (B, T, h, d_v), scores (B, h, T, S) or None)`.

        With rank-3 inputs, no dropout and no scores requested, this goes
        through `keras.ops.dot_product_attention` (flash when the backend
        has it and `flash_attention` allows) on JAX and PyTorch, and on
        TensorFlow only with `flash_attention=True` (which TensorFlow
        refuses, as with Keras's layer): TensorFlow's path is the
        explicit softmax below, the one the int8 TFLite export relies on.
        Rows with nothing to attend to give zeros either way.
        """
        if self._flash_attention and return_attention_scores:
            raise ValueError(
                "Returning attention scores is not supported when flash "
                "attention is enabled. Please disable flash attention to access"
                " attention scores."
            )
        axes = self._axes
        if attention_mask is not None:
            attention_mask = axes.expand_mask(ops.cast(attention_mask, "bool"))
        if use_causal_mask:
            causal = axes.expand_mask(causal_mask(query, key))
            if attention_mask is not None or not self._use_dot_product_attention(
                query, value, return_attention_scores
            ):
                attention_mask = (
                    causal if attention_mask is None else ops.logical_and(attention_mask, causal)
                )
                use_causal_mask = False
        if self._use_dot_product_attention(query, value, return_attention_scores):
            output = ops.dot_product_attention(
                query,
                key,
                value,
                mask=attention_mask,
                scale=inverse_sqrt(self.d_k),
                is_causal=bool(use_causal_mask),
                flash_attention=self._flash_attention,
            )  # [B, T, h, d_v]
            if attention_mask is not None:  # a row with nothing allowed: zeros
                rows = ops.transpose(ops.any(attention_mask, axis=-1, keepdims=True), (0, 2, 1, 3))
                output = ops.where(rows, output, ops.zeros_like(output))
            return output, None
        mask = None if attention_mask is None else axes.flatten_mask(attention_mask, query, key)
        heads, weights = self._scaled_dot_product_attention(
            axes.to_heads(query), axes.to_heads(key), axes.to_heads(value), mask, training
        )  # [B, h, T, d_v], [B, h, T, S]
        return axes.from_heads(heads, query), axes.unflatten_scores(weights, query, key)

    def _use_dot_product_attention(self, query, value, return_attention_scores) -> bool:
        """Whether `_compute_attention` calls ops.dot_product_attention for
        these projected heads: (B, T, h, d_k) queries, (B, S, h, d_v) values."""
        if return_attention_scores or self.dropout > 0.0 or len(query.shape) != 4:
            return False
        backend = keras.backend.backend()
        if backend == "jax" and query.shape[-1] != value.shape[-1]:
            # Keras 3.15's JAX dot_product_attention: jax.nn's refuses
            # d_v != d_k, and its fallback reshapes the (B, T, h, d_v) output
            # to the query's shape, which fails (docs/layer.md). The heads'
            # own sizes decide, whatever the layer's attributes say.
            return False
        return backend != "tensorflow" or self._flash_attention is True

    # ---------------------------------------------------------------- masks
    def _head_mask(self, head_mask):
        gate = ops.convert_to_tensor(head_mask)
        if len(gate.shape) == 1:
            gate = ops.expand_dims(gate, 0)
        if len(gate.shape) != 2 or gate.shape[-1] != self.num_heads:
            raise ValueError(
                "`head_mask` must have shape (num_heads,) or (batch, num_heads)"
                f" with num_heads={self.num_heads}. Received: "
                f"head_mask.shape={tuple(gate.shape)}"
            )
        return ops.cast(gate, self.compute_dtype)  # [B or 1, h]

    @staticmethod
    def _head_mask_for(gate, head_i, i):
        """Head i's column of the `(B, h)` head mask, shaped for head_i."""
        return ops.reshape(gate[:, i], (-1,) + (1,) * (len(head_i.shape) - 1))

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
        """Boolean mask of the scores' rank, or None: the inputs' masks,
        causal, sliding window and the explicit mask, ANDed."""
        expand = self._axes.expand_mask
        parts = []
        if query_mask is not None:
            parts.append(ops.expand_dims(ops.cast(query_mask, "bool"), -1))  # [B, T, 1]
        for m in (value_mask, key_mask):
            if m is not None:
                parts.append(ops.expand_dims(ops.cast(m, "bool"), -2))  # [B, 1, S]
        if use_causal_mask:
            parts.append(causal_mask(query, value))  # [1, T, S]
        if self._sliding_window is not None:
            parts.append(sliding_window_mask(query, value, self._sliding_window))  # [1, T, S]
        if attention_mask is not None:
            parts.append(ops.cast(attention_mask, "bool"))
        mask = None
        for part in parts:
            part = expand(part)  # [B|1, h|1, T|1, S|1]
            mask = part if mask is None else ops.logical_and(mask, part)
        return mask
