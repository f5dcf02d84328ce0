"""Multi-head attention, written the way the lesson explains it.

    head_i    = Attention(Q W_i^Q, K W_i^K, V W_i^V)              (1) (2)
    Attention(q, k, v) = softmax(q k^T / sqrt(d_k)) v             (2)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O          (3)

(1) each head projects d_model into its own d_k = d_model / h subspace,
(2) every head runs scaled dot-product attention in parallel,
(3) the head outputs are concatenated and one matrix W^O mixes them.

The whole layer is the class below, in this order: the constructor, `build`,
`call` (which picks the path), the lesson (`_per_head_attention`: each
equation a line), the fused path (`_fused_attention` and Keras's override
point `_compute_attention`: the same numbers for all heads at once), shapes,
config, and the per-head accessors (`head_weights`, `pruned`,
`concat_heads`, `from_keras`, `to_keras`). The weights sit in Keras
`EinsumDense` sublayers laid out exactly as in
`keras.layers.MultiHeadAttention`, with the head axis kept: W_i^Q is
`query_kernel[:, i, :]` (docs/layer.md says why, and lists every argument).
What is not the lesson sits beside it in this package: args.py (arguments,
input sizes), masks.py (masks, axes, input resolution), weights.py (weight
slicing and copying, the per-head accessors' work, 0.1 files),
keras_names.py (Keras's private names, for subclasses written for its
layer) and recording.py (the attention weights a model records).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import constraints, initializers, ops, regularizers

from keras_mha.qat import HOOK, point

from . import weights as weights_io
from .args import (
    IMPLEMENTATIONS,
    attention_axes_arg,
    check_constructor_args,
    check_key_value,
    output_shape_arg,
    resolve_dims,
)
from .keras_names import KerasNames, override_point
from .masks import (
    AttentionAxes,
    InputMasks,
    causal_mask,
    check_input_masks,
    get_keras_mask,
    head_mask_tensor,
    inverse_sqrt,
    is_weight_mask,
    mask_for_head,
    mask_scores,
    plain_inputs,
    projection_equation,
    resolve_inputs,
    set_keras_mask,
    zero_masked_rows,
)
from .recording import attention_sink
from .weights import PROJECTIONS, bias_of, kernel_of

__all__ = ["IMPLEMENTATIONS", "MultiHeadAttention"]

# Masked scores sit this far below the row's smallest score (see _masked_softmax).
_MASK_MARGIN = 16.0


@keras.saving.register_keras_serializable(package="keras_mha")
class MultiHeadAttention(KerasNames, keras.layers.Layer):
    """Multi-head attention with the lesson's per-head matrices, a drop-in
    replacement for `keras.layers.MultiHeadAttention`.

    The lesson's equations (1)-(3) are in the module docstring, and line by
    line in `_per_head_attention`. Head `i` owns `W_i^Q`, `W_i^K`, `W_i^V`
    (and biases), slices of the head axis of Keras `EinsumDense` sublayers in
    Keras's layout (`query_kernel[:, i, :]`; the properties' table is in
    docs/layer.md); W^O (`output_kernel`) mixes the concatenated heads.

    Args and call arguments: as `keras.layers.MultiHeadAttention`, plus
    `implementation` (`"fused"`, or `"per_head"`: the lesson's loop),
    `head_mask` (a call's multiplier per head) and `use_gate`; `key_dim` may
    be left out (d_model / h) and `value=None` is self-attention. The full
    list is in docs/layer.md.

    Example:

    >>> layer = MultiHeadAttention(num_heads=2)
    >>> y, scores = layer(keras.random.normal((3, 5, 8)), return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((3, 5, 8), (3, 2, 5, 5))

    Reference: Vaswani et al., "Attention Is All You Need", 2017, section 3.2.
    """

    _keeps_input_masks = False  # see `call`

    # ------------------------------------------------------------ constructor
    def __init__(
        self,
        num_heads: int,
        key_dim: int | None = None,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_shape=None,
        attention_axes=None,
        sliding_window: int | None = None,
        flash_attention: bool | None = None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate: bool = False,
        seed: int | None = None,
        implementation: str = "fused",
        num_key_value_heads: int | None = None,
        **kwargs,
    ):
        check_constructor_args(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            implementation=implementation,
            sliding_window=sliding_window,
            num_key_value_heads=num_key_value_heads,
        )
        super().__init__(**kwargs)
        self.supports_masking = True
        self.num_heads = int(num_heads)
        # Grouped-query attention: h_kv key/value heads, each shared by a group of
        # h / h_kv query heads (h_kv = h: every head its own; h_kv = 1: multi-query).
        self.num_key_value_heads = (
            self.num_heads if num_key_value_heads is None else int(num_key_value_heads)
        )
        self.key_dim = None if key_dim is None else int(key_dim)
        self.value_dim = None if value_dim is None else int(value_dim)
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.implementation = implementation
        self._output_shape = output_shape_arg(output_shape)
        self.attention_axes = attention_axes_arg(attention_axes)
        self._sliding_window = None if sliding_window is None else int(sliding_window)
        self._flash_attention_arg = flash_attention
        self._flash_attention = flash_attention or keras.config.is_flash_attention_enabled()
        if self._flash_attention and self.dropout > 0.0:
            raise ValueError(
                "Dropout is not supported when flash attention is enabled. "
                "Please set dropout to 0.0 to use flash attention."
            )
        self._use_gate = bool(use_gate)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self._activity_regularizer = regularizers.get(activity_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.bias_constraint = constraints.get(bias_constraint)
        self.seed = seed
        self._dropout_layer = keras.layers.Dropout(
            rate=self.dropout, seed=seed, dtype=self.dtype_policy
        )
        # Resolved in build(): the lesson's d_model, d_k, d_v, and the axes.
        self.d_model = None
        self.d_k = None
        self.d_v = None
        self._axes = None
        for attr, _ in PROJECTIONS:
            setattr(self, f"_{attr}", None)

    @property
    def use_gate(self) -> bool:
        return self._use_gate

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: head i reads key/value head i // group_size."""
        return self.num_heads // self.num_key_value_heads

    @property
    def sliding_window(self) -> int | None:
        return self._sliding_window

    # ------------------------------------------------------------------ build
    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        d_model, d_k, d_v = self._resolve_dims(query_shape, value_shape, key_shape)
        self.d_model, self.d_k, self.d_v = d_model, d_k, d_v
        rank = len(query_shape)
        self._build_attention(rank + 1)  # the axes, Keras's equations
        self._d_out = self._output_shape or (d_model,)
        self._d_key_in = int(key_shape[-1])
        self._d_value_in = int(value_shape[-1])
        h, h_kv = self.num_heads, self.num_key_value_heads
        self._check_layout(query_shape, d_k, d_v)
        # Query head i owns kernel[:, i, :] of the query (and gate) projection;
        # key/value head g owns kernel[:, g, :] of the key and value projections.
        inputs = {
            "query": (query_shape, h, d_k),
            "key": (key_shape, h_kv, d_k),
            "gate": (query_shape, h, d_v),
            "value": (value_shape, h_kv, d_v),
        }
        equation, bias_axes, _ = projection_equation(rank - 1, 1, 2)
        for attr, name in PROJECTIONS[:-1]:
            if name == "gate" and not self._use_gate:
                continue
            shape, heads, size = inputs[name]
            dense = keras.layers.EinsumDense(
                equation,
                output_shape=[None] * (rank - 2) + [heads, size],
                bias_axes=bias_axes if self.use_bias else None,
                activation="sigmoid" if name == "gate" else None,
                name=name,
                **self._sublayer_kwargs(),
            )
            dense.build(shape)
            setattr(self, f"_{attr}", dense)
        # W^O contracts (h, d_v): output_kernel[i] reads head i.
        equation, bias_axes, _ = projection_equation(rank - 1, 2, len(self._d_out))
        self._output_dense = keras.layers.EinsumDense(
            equation,
            output_shape=[None] * (rank - 2) + list(self._d_out),
            bias_axes=bias_axes if self.use_bias else None,
            name="attention_output",
            **self._sublayer_kwargs(),
        )
        self._output_dense.build(tuple(query_shape[:-1]) + (h, d_v))
        self._dropout_layer.build(None)
        self.built = True

    def _check_layout(self, query_shape, d_k: int, d_v: int) -> None:
        """Under keras.distribution.ModelParallel: a LayoutMap that splits the
        heads (or any axis) over devices that do not divide them is refused in
        one line naming this layer (keras_mha/distribution.py)."""
        from keras_mha.distribution import check_layer_layout

        h, h_kv = self.num_heads, self.num_key_value_heads
        d_in = (int(query_shape[-1]), self._d_key_in, self._d_value_in)
        shapes = {
            "query": ((d_in[0], h, d_k), (h, d_k)),
            "key": ((d_in[1], h_kv, d_k), (h_kv, d_k)),
            "value": ((d_in[2], h_kv, d_v), (h_kv, d_v)),
            "attention_output": ((h, d_v, *self._d_out), tuple(self._d_out)),
        }
        if self._use_gate:
            shapes["gate"] = ((d_in[0], h, d_v), (h, d_v))
        variables = {}
        for name, (kernel, bias) in shapes.items():
            variables[f"{name}/kernel"] = kernel
            if self.use_bias:
                variables[f"{name}/bias"] = bias
        check_layer_layout(self, variables)

    def _sublayer_kwargs(self) -> dict:
        """Keras's: fresh initializer instances per projection (so they are
        not equal), and the layer's dtype policy (or policy map)."""

        def fresh(init):
            return init.__class__.from_config(init.get_config())

        return {
            "kernel_initializer": fresh(self.kernel_initializer),
            "bias_initializer": fresh(self.bias_initializer),
            "kernel_regularizer": self.kernel_regularizer,
            "bias_regularizer": self.bias_regularizer,
            "activity_regularizer": self._activity_regularizer,
            "kernel_constraint": self.kernel_constraint,
            "bias_constraint": self.bias_constraint,
            "dtype": self.dtype_policy,
        }

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
            query=query,
            value=value,
            key=key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
        )
        # As Keras's layer does: the masks are used here, so the projections
        # are not handed masked tensors (they would warn that they drop them).
        # Keras's MultiHeadAttention leaves the caller's tensors without them, its
        # GroupedQueryAttention does not touch them (`_keeps_input_masks`).
        carried = [(x, get_keras_mask(x)) for x in (query, value, key)]
        for x, _ in carried:
            set_keras_mask(x, None)
        sink = attention_sink(self)
        try:
            output, scores = self._attend(
                query=query,
                value=value,
                key=key,
                masks=masks,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                head_mask=head_mask,
                training=training,
                return_attention_scores=return_attention_scores or sink is not None,
            )
        finally:
            for x, mask in carried if self._keeps_input_masks else ():
                if mask is not None:
                    set_keras_mask(x, mask)
        if sink is not None:  # recorded for the attention signature
            sink.append((self, scores))
        if return_attention_scores:
            return output, scores
        return output

    def _attend(
        self,
        *,
        query,
        value,
        key,
        masks: InputMasks,
        attention_mask,
        use_causal_mask,
        head_mask,
        training,
        return_attention_scores,
        concat_only=False,
    ):
        """The path, chosen once: the lesson when it applies, else fused.
        `concat_only`: stop before W^O (for `concat_heads`)."""
        self._check_call_shapes(
            query=query, value=value, key=key, attention_mask=attention_mask, masks=masks
        )
        if head_mask is not None:
            head_mask = head_mask_tensor(
                head_mask, num_heads=self.num_heads, dtype=self.compute_dtype
            )  # [B or 1, h]
        if self._runs_lesson():
            mask = self._compute_attention_mask(
                query,
                value,
                query_mask=masks.query,
                value_mask=masks.value,
                key_mask=masks.key,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
            )
            return self._per_head_attention(
                query,
                key,
                value,
                mask=mask,
                training=training,
                head_mask=head_mask,
                concat_only=concat_only,
            )
        return self._fused_attention(
            query=query,
            key=key,
            value=value,
            masks=masks,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            head_mask=head_mask,
            training=training,
            return_attention_scores=return_attention_scores,
            concat_only=concat_only,
        )

    def _runs_lesson(self) -> bool:
        """Whether the call takes the lesson's path: `implementation="per_head"`
        and the case the lesson teaches. The others compute the same numbers
        fused (tested for every option)."""
        return (
            self.implementation == "per_head"
            and self._axes.simple  # rank-3 inputs, attention over T
            and len(self._d_out) == 1  # W^O is a matrix: `output_shape` an int
            and all(d.quantization_mode is None for d in self._projections())  # float kernels
            and self._activity_regularizer is None  # the sublayers' calls add its losses
            and not self._overrides_compute_attention  # a subclass's attention is called
        )

    # ---------------------------------------------------- the lesson, per head
    def _per_head_attention(
        self, query, key, value, mask, training, head_mask=None, concat_only=False
    ):
        """The lesson: each head projects (1) and attends (2); Concat, W^O (3).

        query [B, T, d_model], key [B, S, d_key], value [B, S, d_value];
        mask: boolean [B|1, h|1, T|1, S|1] or None; head_mask: [B|1, h] or None.
        `point(self, name, x, i)`: x, or as int8 holds it (keras_mha.qat), point `name_i`.
        GQA: head i reads key/value head g = i // group_size, projected once per group.
        """
        heads, weights, shared = [], [], {}
        for i in range(self.num_heads):
            q_i = self._head_projection(self.query_dense, query, i)  # (1) Q W_i^Q  [B, T, d_k]
            g = i // self.group_size  # the key/value head of head i's group (g = i without GQA)
            if g not in shared:
                k_g = self._head_projection(self.key_dense, key, g)  # (1) K W_g^K  [B, S, d_k]
                v_g = self._head_projection(self.value_dense, value, g)  # (1) V W_g^V  [B, S, d_v]
                shared[g] = k_g, v_g
            k_i, v_i = shared[g]
            head_i, weights_i = self._scaled_dot_product_attention(
                q_i, k_i, v_i, mask=mask_for_head(mask, i), training=training, head=i
            )  # (2) softmax(q_i k_i^T / sqrt(d_k)) v_i  [B, T, d_v], [B, T, S]
            if self.use_gate:  # optional sigmoid gate: head_i * sigmoid(Q W_i^G + b_i^G)
                head_i = head_i * ops.sigmoid(self._head_projection(self.gate_dense, query, i))
            if head_mask is not None:  # head analysis: head_i * head_mask[:, i] (0 silences it)
                head_i = head_i * head_mask[:, i, None, None]
            heads.append(head_i)
            weights.append(weights_i)
        concat = point(self, "heads", ops.concatenate(heads, -1))  # (3) Concat(head_1..head_h)
        if concat_only:  # concat_heads stops before W^O
            return concat, None
        return self._output_projection(concat), ops.stack(weights, 1)  # [B,T,d_out], [B,h,T,S]

    def _output_projection(self, concat):
        """Step (3)'s end: Concat(head_1..head_h) W^O + b^O, [B, T, h d_v] -> [B, T, d_out]."""
        w_o = ops.reshape(self.output_dense.kernel, (self.num_heads * self.d_v, -1))  # W^O
        output = ops.matmul(concat, w_o)  # (3) Concat(head_1..head_h) W^O  [B, T, d_out]
        if self.use_bias:
            output = output + self.output_dense.bias  # + b^O
        return point(self, "output", output)

    def _head_projection(self, dense, x, i):
        """Step (1) for head i: x W_i + b_i, W_i = `dense.kernel[:, i, :]`: [B, T|S, d]."""
        y = ops.matmul(x, dense.kernel[:, i, :])  # x W_i
        return point(self, dense.name, y if dense.bias is None else y + dense.bias[i], i)  # + b_i

    def _scaled_dot_product_attention(self, q, k, v, mask, training, head=None):
        """Step (2): softmax(q k^T / sqrt(d_k)) v, for one head (`head`) or all.

        q = [..., T, d_k], k = [..., S, d_k], v = [..., S, d_v],
        mask broadcastable to [..., T, S].
        """
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2))  # q k^T  [..., T, S]
        scale = ops.cast(inverse_sqrt(self.d_k), scores.dtype)  # 1 / sqrt(d_k)
        scores = point(self, "scores", scores * scale, head)  # q k^T / sqrt(d_k)
        weights = point(self, "weights", self._masked_softmax(scores, mask, head), head)  # softmax
        dropped = self._dropout_layer(weights, training=training) if self.dropout else weights
        return ops.matmul(dropped, v), weights  # softmax(...) v  [..., T, d_v], [..., T, S]

    def _masked_softmax(self, scores, mask=None, head=None):
        """softmax over the positions the mask allows; zeros for empty rows.

        Keras sets masked scores to -1e9. That is exact in float, but an int8
        or int16 model calibrates the tensor's range from it and loses every
        real score to one quantum. We set masked scores to the row's smallest
        score minus 16 instead (masks.mask_scores): each masked position then
        weighs at most e^-16 (1e-7) of the best allowed one, and the range
        stays tight.
        """
        if mask is None:
            return ops.softmax(scores, axis=-1)
        if len(mask.shape) < len(scores.shape):  # a subclass's (B, T, S): Keras adds the heads
            mask = self._axes.expand_mask(mask)
        masked, keep = mask_scores(scores, mask, _MASK_MARGIN)
        masked = point(self, "masked_scores", masked, head)
        return zero_masked_rows(ops.softmax(masked, axis=-1), keep)  # nothing kept: zeros

    # ------------------------------------------------------- all heads fused
    def _fused_attention(
        self,
        *,
        query,
        key,
        value,
        masks: InputMasks,
        attention_mask,
        use_causal_mask,
        head_mask,
        training,
        return_attention_scores,
        concat_only=False,
    ):
        """All heads at once: one EinsumDense per projection (quantized, LoRA,
        activity regularizer: as Keras's sublayers do it), the heads a batch
        axis of `_compute_attention`, W^O one contraction over (h, d_v)."""
        # Causal alone: no (T, S) mask is built; the backend's causal kernel
        # may run (as in Keras). A subclass always receives the mask.
        causal_only = (
            use_causal_mask
            and all(m is None for m in masks)
            and attention_mask is None
            and self._sliding_window is None
            and not self._overrides_compute_attention
        )
        mask = None
        if not causal_only:
            mask = self._compute_attention_mask(
                query,
                value,
                query_mask=masks.query,
                value_mask=masks.value,
                key_mask=masks.key,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
            )
        gate = self._gate_dense(query) if self._use_gate else None  # sigmoid  [B, T, h, d_v]
        q = point(self, "query", self._query_dense(query))  # [B, T, h, d_k]
        k = point(self, "key", self._key_dense(key))  # [B, S, h_kv, d_k]
        v = point(self, "value", self._value_dense(value))  # [B, S, h_kv, d_v]
        if self.group_size > 1:  # GQA: each key/value head serves its group of query heads
            k = ops.repeat(k, self.group_size, axis=-2)  # [B, S, h, d_k]
            v = ops.repeat(v, self.group_size, axis=-2)  # [B, S, h, d_v]
        options = {}
        if self._compute_attention_takes_scores_flag:
            options["return_attention_scores"] = return_attention_scores
        if causal_only:
            options["use_causal_mask"] = True
        heads, scores = self._compute_attention(
            query=q, key=k, value=v, attention_mask=mask, training=training, **options
        )  # [B, T, h, d_v], [B, h, T, S]
        if gate is not None:
            heads = heads * gate
        if head_mask is not None:  # [B|1, h] -> [B|1, 1.., h, 1]
            rank = len(heads.shape)
            heads = heads * ops.reshape(head_mask, (-1,) + (1,) * (rank - 3) + (self.num_heads, 1))
        if concat_only:
            # re-assemble all head outputs side by side: Concat(head_1..head_h)
            shape = tuple(ops.shape(heads)[:-2]) + (self.num_heads * self.d_v,)
            return ops.reshape(heads, shape), None  # [B, T, h * d_v]
        return point(self, "output", self._output_dense(heads)), scores  # Concat W^O [B, T, d_out]

    @override_point
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

        A subclass that overrides it runs on the fused path whatever
        `implementation` says, called by keyword; keras-hub's shorter
        signature `(query, key, value, attention_mask=None, training=None)`
        is accepted.

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
        use_dot_product = self._use_dot_product_attention(
            query=query, value=value, return_attention_scores=return_attention_scores
        )
        if attention_mask is not None:
            # 0/1 float weights stay floats for the explicit softmax (is_weight_mask)
            keep_weights = not (use_dot_product or use_causal_mask)
            if not (keep_weights and is_weight_mask(attention_mask)):
                attention_mask = ops.cast(attention_mask, "bool")
            attention_mask = axes.expand_mask(attention_mask)
        if use_causal_mask:
            causal = axes.expand_mask(causal_mask(query, key))
            if attention_mask is not None or not use_dot_product:
                attention_mask = (
                    causal if attention_mask is None else ops.logical_and(attention_mask, causal)
                )
                use_causal_mask = False
        if use_dot_product:
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
                output = ops.where(rows, output, 0.0)
            return output, None
        mask = None if attention_mask is None else axes.flatten_mask(attention_mask, query, key)
        heads, weights = self._scaled_dot_product_attention(
            axes.to_heads(query),
            axes.to_heads(key),
            axes.to_heads(value),
            mask=mask,
            training=training,
        )  # [B, h, T, d_v], [B, h, T, S]
        heads = point(self, "heads", heads)  # int8 rounds all heads' outputs as one tensor
        return axes.from_heads(heads, query), axes.unflatten_scores(weights, query, key)

    def _use_dot_product_attention(self, *, query, value, return_attention_scores) -> bool:
        """Whether `_compute_attention` calls ops.dot_product_attention for
        these projected heads: (B, T, h, d_k) queries, (B, S, h, d_v) values."""
        if return_attention_scores or self.dropout > 0.0 or len(query.shape) != 4:
            return False
        if HOOK in self.__dict__:  # quantization-aware: the explicit softmax's points
            return False
        backend = keras.backend.backend()
        if backend == "jax" and query.shape[-1] != value.shape[-1]:
            # Keras 3.15's JAX dot_product_attention: jax.nn's refuses
            # d_v != d_k, and its fallback reshapes the (B, T, h, d_v) output
            # to the query's shape, which fails (docs/layer.md). The heads'
            # own sizes decide, whatever the layer's attributes say.
            return False
        return backend != "tensorflow" or self._flash_attention is True

    # ---------------------------------------------------------------- shapes
    def _resolve_dims(self, query_shape, value_shape, key_shape):
        """`(d_model, d_k, d_v)` for these input shapes (args.py)."""
        sizes = {"num_heads": self.num_heads, "key_dim": self.key_dim, "value_dim": self.value_dim}
        return resolve_dims(query_shape, value_shape, key_shape, **sizes)

    def _check_call_shapes(self, *, query, value, key, attention_mask, masks=None):
        self._resolve_dims(query.shape, value.shape, key.shape)
        if self.built:
            expected = {"query": self.d_model, "value": self._d_value_in, "key": self._d_key_in}
            for name, x in (("query", query), ("value", value), ("key", key)):
                if x.shape[-1] != expected[name]:
                    raise ValueError(
                        f"`{name}` has {x.shape[-1]} features but the layer was "
                        f"built for {expected[name]}. Received: "
                        f"{name}.shape={tuple(x.shape)}"
                    )
            if len(query.shape) != self._axes.rank:
                raise ValueError(
                    f"The layer was built for rank-{self._axes.rank} inputs. "
                    f"Received: query.shape={tuple(query.shape)}"
                )
        axes = self._axes or AttentionAxes(len(query.shape), self.attention_axes)
        if attention_mask is not None:
            mask_shape = getattr(attention_mask, "shape", np.shape(attention_mask))
            axes.check_mask(mask_shape, axes.scores_shape(query.shape, key.shape, self.num_heads))
        if masks is not None:
            check_input_masks(axes, query=query, value=value, key=key, masks=masks)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        query_shape = tuple(query_shape)
        value_shape = query_shape if value_shape is None else tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        check_key_value(value_shape, key_shape)
        return query_shape[:-1] + (self._output_shape or query_shape[-1:])

    def compute_output_spec(
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
            query=query,
            value=value,
            key=key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
        )
        self._check_call_shapes(
            query=query, value=value, key=key, attention_mask=attention_mask, masks=masks
        )
        out = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape, key.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return out
        axes = self._axes or AttentionAxes(len(query.shape), self.attention_axes)
        scores_shape = axes.scores_shape(query.shape, key.shape, self.num_heads)
        return out, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    # ---------------------------------------------------------------- config
    def get_config(self):
        base_config = super().get_config()
        config = {
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "use_gate": self._use_gate,
            "output_shape": self._output_shape,
            "attention_axes": self.attention_axes,
            "sliding_window": self._sliding_window,
            "flash_attention": self._flash_attention_arg,
            "kernel_initializer": initializers.serialize(self.kernel_initializer),
            "bias_initializer": initializers.serialize(self.bias_initializer),
            "kernel_regularizer": regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": regularizers.serialize(self.bias_regularizer),
            "activity_regularizer": regularizers.serialize(self._activity_regularizer),
            "kernel_constraint": constraints.serialize(self.kernel_constraint),
            "bias_constraint": constraints.serialize(self.bias_constraint),
            "seed": self.seed,
            "implementation": self.implementation,
        }
        if self.group_size > 1:  # written only when grouped: files of plain MHA as before
            config["num_key_value_heads"] = self.num_key_value_heads
        return {**base_config, **config}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "output_dim" in config:  # keras_mha 0.1's name for output_shape
            output_dim = config.pop("output_dim")
            config.setdefault("output_shape", output_dim)
        return super().from_config(config)

    def load_own_variables(self, store):
        """Loads keras_mha 0.1 files too (their weights sat on this layer)."""
        if not len(store.keys()):
            super().load_own_variables(store)
            return
        weights_io.load_legacy_variables(
            store,
            query=self.query_dense,
            key=self.key_dense,
            value=self.value_dense,
            output=self.output_dense,
            num_heads=self.num_heads,
            d_v=self.d_v,
            use_bias=self.use_bias,
            use_gate=self.use_gate,
            layer_name=self.name,
        )

    # ------------------------------------------------- projections and weights
    query_dense = property(lambda self: self._query_dense, doc="The W^Q EinsumDense.")
    key_dense = property(lambda self: self._key_dense, doc="The W^K EinsumDense.")
    value_dense = property(lambda self: self._value_dense, doc="The W^V EinsumDense.")
    gate_dense = property(lambda self: self._gate_dense, doc="The gate EinsumDense (use_gate).")
    output_dense = property(lambda self: self._output_dense, doc="The W^O EinsumDense.")

    query_kernel = property(lambda self: kernel_of(self._query_dense))
    query_bias = property(lambda self: bias_of(self._query_dense))
    key_kernel = property(lambda self: kernel_of(self._key_dense))
    key_bias = property(lambda self: bias_of(self._key_dense))
    value_kernel = property(lambda self: kernel_of(self._value_dense))
    value_bias = property(lambda self: bias_of(self._value_dense))
    gate_kernel = property(lambda self: kernel_of(self._gate_dense))
    gate_bias = property(lambda self: bias_of(self._gate_dense))
    output_kernel = property(lambda self: kernel_of(self._output_dense))
    output_bias = property(lambda self: bias_of(self._output_dense))

    def _projections(self) -> list:
        """The built projections, in Keras's order."""
        return [d for d in (getattr(self, f"_{a}") for a, _ in PROJECTIONS) if d is not None]

    def quantize(self, mode=None, type_check=True, config=None):
        """Quantize every projection as Keras quantizes an EinsumDense
        (`"int8"`, `"int4"`, `"float8"`, ...); `model.quantize` reaches
        the projections directly. Quantized, the layer runs fused."""
        for dense in self._projections():
            dense.quantize(mode, type_check=type_check, config=config)

    def enable_lora(self, rank: int, **kwargs) -> None:
        """LoRA on the query, key and value projections (as keras-hub does)."""
        for dense in (self._query_dense, self._key_dense, self._value_dense):
            dense.enable_lora(rank, **kwargs)

    # ------------------------------------------------------- per-head access
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
        weights_io.require_built(self, "concat_heads")
        query, value, key, masks = plain_inputs(
            self.compute_dtype, query, value, key, query_mask, value_mask, key_mask
        )
        concat, _ = self._attend(
            query=query,
            value=value,
            key=key,
            masks=masks,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            head_mask=head_mask,
            training=False,
            return_attention_scores=False,
            concat_only=True,
        )
        return concat

    def head_weights(self, i: int) -> dict[str, np.ndarray]:
        """Head `i`'s own matrices as numpy arrays.

        `query_kernel` (d_model, d_k), `key_kernel`, `value_kernel`
        (d_value, d_v), their biases (zeros when `use_bias=False`),
        `gate_kernel`/`gate_bias` with `use_gate`, and `output_kernel`, the
        (d_v, *d_out) block of W^O that reads head `i`.
        """
        return weights_io.head_weights(self, i)

    def pruned(self, keep_heads) -> MultiHeadAttention:
        """A new, built layer with only the heads in `keep_heads`.

        The removed heads' W_i^Q, W_i^K, W_i^V (gate), biases and their rows
        of W^O are gone, so its output equals this layer's with those heads
        masked out (`head_mask` 0). `key_dim`/`value_dim`/`output_shape` are
        pinned, since d_k no longer equals d_model / h.
        """
        return weights_io.pruned(self, keep_heads)

    @classmethod
    def from_keras(cls, layer, implementation: str = "fused") -> MultiHeadAttention:
        """Build ours from a built `keras.layers.MultiHeadAttention` (any
        configuration: the weights are copied as they are)."""
        return weights_io.from_keras(cls, layer, implementation)

    def to_keras(self) -> keras.layers.MultiHeadAttention:
        """The equivalent built `keras.layers.MultiHeadAttention`."""
        return weights_io.to_keras(self)

    def _input_shapes(self):
        """Build shapes (query, value, key) with the layer's rank and widths."""
        pad = (None,) * (self._axes.rank - 1)
        return pad + (self.d_model,), pad + (self._d_value_in,), pad + (self._d_key_in,)
