"""The Keras side of keras_mha.MultiHeadAttention: arguments, sublayers, weights.

`MultiHeadAttentionBase` validates the constructor's arguments as
`keras.layers.MultiHeadAttention` does, builds the projections as Keras
`EinsumDense` sublayers in Keras's layout (docs/layer.md), exposes their
kernels per head, and carries config, shapes, quantization, LoRA and
keras_mha 0.1 files. The computation, the lesson's, is in attention.py.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import constraints, initializers, regularizers

from keras_mha import attention_weights
from keras_mha.attention_axes import AttentionAxes, projection_equation

try:  # The mask a tensor carries (Embedding(mask_zero=True), Masking, ...).
    from keras.src.backend import get_keras_mask, set_keras_mask
except ImportError:  # pragma: no cover - older/newer layouts

    def get_keras_mask(x):
        return getattr(x, "_keras_mask", None)

    def set_keras_mask(x, mask):
        if mask is None and hasattr(x, "_keras_mask"):
            del x._keras_mask


IMPLEMENTATIONS = ("fused", "per_head")

# (attribute, sublayer name): the projections, in Keras's order and names.
PROJECTIONS = (
    ("_query_dense", "query"),
    ("_key_dense", "key"),
    ("_gate_dense", "gate"),
    ("_value_dense", "value"),
    ("_output_dense", "attention_output"),
)


def _check_positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        expected = "a positive integer" + (" or `None`" if allow_none else "")
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected "
            f"{expected}. Received: {name}={value!r}"
        )


def _output_shape_arg(output_shape):
    if output_shape is None:
        return None
    if isinstance(output_shape, (int, np.integer)) and not isinstance(output_shape, bool):
        output_shape = (output_shape,)
    try:
        shape = tuple(output_shape)
    except TypeError:
        shape = None
    if not shape or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0 for d in shape
    ):
        raise ValueError(
            f"Invalid `output_shape`: {output_shape!r}. When specified, the "
            "`output_shape` should be a positive int or a tuple or list of them."
        )
    return tuple(int(d) for d in shape)


def resolve_inputs(query, value, key, query_mask, value_mask, key_mask):
    """`(query, value, key, (query_mask, value_mask, key_mask))` as
    `keras.layers.MultiHeadAttention` reads a call.

    Every mask given is used, for its own tensor; one not given is the mask
    that tensor carries (`Embedding(mask_zero=True)`, `Masking`), which is
    what Keras's `Layer.__call__` fills in. `value` omitted is the query
    (Keras's `mha(x, x)`): its mask is `value_mask`, or else the one the query
    carries, never an explicit `query_mask`. `key` omitted is the value (as
    in Keras): `key_mask` is then only an explicit one, the value's mask
    already covering that tensor. Unlike Keras 3.15, which reads the query's
    carried mask only and drops an explicit `query_mask`, an explicit
    `query_mask` is used (and replaces the carried one, as the others do).
    """
    carried = get_keras_mask(query)
    if query_mask is None:
        query_mask = carried
    if value is None:
        value = query
        if value_mask is None:
            value_mask = carried
    elif value_mask is None:
        value_mask = get_keras_mask(value)
    if key is None:
        key = value
    elif key_mask is None:
        key_mask = get_keras_mask(key)
    return query, value, key, (query_mask, value_mask, key_mask)


class MultiHeadAttentionBase(keras.layers.Layer):
    """Arguments, sublayers and weights of `MultiHeadAttention` (see there)."""

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
        **kwargs,
    ):
        _check_positive_int("num_heads", num_heads)
        _check_positive_int("key_dim", key_dim, allow_none=True)
        _check_positive_int("value_dim", value_dim, allow_none=True)
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
        if isinstance(attention_axes, (int, np.integer)) and not isinstance(attention_axes, bool):
            attention_axes = (int(attention_axes),)
        elif attention_axes is not None:
            if not isinstance(attention_axes, (list, tuple)) or not all(
                isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in attention_axes
            ):
                raise ValueError(
                    "`attention_axes` must be an int, list, or tuple of ints. "
                    f"Received: attention_axes={attention_axes!r}"
                )
            attention_axes = tuple(int(a) for a in attention_axes)
        if sliding_window is not None and (
            isinstance(sliding_window, bool)
            or not isinstance(sliding_window, (int, np.integer))
            or sliding_window <= 0
        ):
            raise ValueError(
                "`sliding_window` must be `None` or a positive integer. "
                f"Received: sliding_window={sliding_window!r}"
            )
        super().__init__(**kwargs)
        self.supports_masking = True
        self.num_heads = int(num_heads)
        self.key_dim = None if key_dim is None else int(key_dim)
        self.value_dim = None if value_dim is None else int(value_dim)
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.implementation = implementation
        self._output_shape = _output_shape_arg(output_shape)
        self.attention_axes = attention_axes
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
            setattr(self, attr, None)

    @property
    def use_gate(self) -> bool:
        return self._use_gate

    @property
    def sliding_window(self) -> int | None:
        return self._sliding_window

    # ------------------------------------------------------------------ build
    @staticmethod
    def _check_key_value(value_shape, key_shape) -> None:
        if tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
            raise ValueError(
                "All dimensions of `value` and `key`, except the last one, "
                f"must be equal. Received: value_shape={tuple(value_shape)} and "
                f"key_shape={tuple(key_shape)}"
            )

    def _resolve_dims(self, query_shape, value_shape, key_shape):
        self._check_key_value(value_shape, key_shape)
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) < 3:
                raise ValueError(
                    f"`{name}` must have rank >= 3 (batch, sequence, features). "
                    f"Received: {name}.shape={tuple(shape)}"
                )
            if shape[-1] is None:
                raise ValueError(
                    f"The last dimension of `{name}` must be known. "
                    f"Received: {name}.shape={tuple(shape)}"
                )
        if len(value_shape) != len(query_shape):
            raise ValueError(
                "`query` and `value` must have the same rank. Received: "
                f"query.shape={tuple(query_shape)}, value.shape={tuple(value_shape)}"
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
        return d_model, key_dim, self.value_dim or key_dim

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        d_model, d_k, d_v = self._resolve_dims(query_shape, value_shape, key_shape)
        self.d_model, self.d_k, self.d_v = d_model, d_k, d_v
        rank = len(query_shape)
        self._axes = AttentionAxes(rank, self.attention_axes)
        self._d_out = self._output_shape or (d_model,)
        self._d_key_in = int(key_shape[-1])
        self._d_value_in = int(value_shape[-1])
        h = self.num_heads
        # Head i owns kernel[:, i, :] of every input projection.
        sizes = {"_query_dense": d_k, "_key_dense": d_k, "_gate_dense": d_v, "_value_dense": d_v}
        inputs = {
            "_query_dense": query_shape,
            "_key_dense": key_shape,
            "_gate_dense": query_shape,
            "_value_dense": value_shape,
        }
        for attr, name in PROJECTIONS[:-1]:
            if attr == "_gate_dense" and not self._use_gate:
                continue
            equation, bias_axes, _ = projection_equation(rank - 1, 1, 2)
            dense = keras.layers.EinsumDense(
                equation,
                output_shape=[None] * (rank - 2) + [h, sizes[attr]],
                bias_axes=bias_axes if self.use_bias else None,
                activation="sigmoid" if attr == "_gate_dense" else None,
                name=name,
                **self._sublayer_kwargs(),
            )
            dense.build(inputs[attr])
            setattr(self, attr, dense)
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

    # ------------------------------------------------- projections and weights
    query_dense = property(lambda self: self._query_dense, doc="The W^Q EinsumDense.")
    key_dense = property(lambda self: self._key_dense, doc="The W^K EinsumDense.")
    value_dense = property(lambda self: self._value_dense, doc="The W^V EinsumDense.")
    gate_dense = property(lambda self: self._gate_dense, doc="The gate EinsumDense (use_gate).")
    output_dense = property(lambda self: self._output_dense, doc="The W^O EinsumDense.")

    def _kernel_of(self, attr):
        dense = getattr(self, attr)
        return None if dense is None else dense._kernel

    def _bias_of(self, attr):
        dense = getattr(self, attr)
        return None if dense is None else dense.bias

    query_kernel = property(lambda self: self._kernel_of("_query_dense"))
    query_bias = property(lambda self: self._bias_of("_query_dense"))
    key_kernel = property(lambda self: self._kernel_of("_key_dense"))
    key_bias = property(lambda self: self._bias_of("_key_dense"))
    value_kernel = property(lambda self: self._kernel_of("_value_dense"))
    value_bias = property(lambda self: self._bias_of("_value_dense"))
    gate_kernel = property(lambda self: self._kernel_of("_gate_dense"))
    gate_bias = property(lambda self: self._bias_of("_gate_dense"))
    output_kernel = property(lambda self: self._kernel_of("_output_dense"))
    output_bias = property(lambda self: self._bias_of("_output_dense"))

    def _projections(self):
        return [d for d in (getattr(self, a) for a, _ in PROJECTIONS) if d is not None]

    def quantize(self, mode=None, type_check=True, config=None):
        """Quantize every projection as Keras quantizes an EinsumDense
        (`"int8"`, `"int4"`, `"float8"`, ...); `model.quantize` reaches
        the projections directly."""
        for dense in self._projections():
            dense.quantize(mode, type_check=type_check, config=config)

    def enable_lora(self, rank: int, **kwargs) -> None:
        """LoRA on the query, key and value projections (as keras-hub does)."""
        for dense in (self._query_dense, self._key_dense, self._value_dense):
            dense.enable_lora(rank, **kwargs)

    def _check_call_shapes(self, query, value, key, attention_mask, masks=None):
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
            self._check_input_masks(axes, query, value, key, masks)

    @staticmethod
    def _check_input_masks(axes, query, value, key, masks) -> None:
        """ValueError unless each input mask applies as in Keras's layer: one
        flag per position of its tensor (broadcastable to `tensor.shape[:-1]`),
        with attention over the last axis before the features."""
        for name, x, mask in zip(("query", "value", "key"), (query, value, key), masks):
            if mask is None:
                continue
            shape = tuple(getattr(mask, "shape", np.shape(mask)))
            if not axes.last_axis_only:
                raise ValueError(
                    f"`{name}_mask` (or the mask `{name}` carries) needs attention over the "
                    f"last axis before the features (attention_axes=({axes.rank - 2},)), as "
                    f"in keras.layers.MultiHeadAttention; pass `attention_mask` for "
                    f"attention_axes={axes.axes}. Received: {name}_mask.shape={shape}"
                )
            want = tuple(x.shape[:-1])
            if not 1 <= len(shape) <= len(want) or not all(
                a is None or b is None or a in (1, b) for a, b in zip(shape[::-1], want[::-1])
            ):
                raise ValueError(
                    f"`{name}_mask` (or the mask `{name}` carries) must have `{name}`'s shape "
                    f"without its features, {want} (one flag per position). "
                    f"Received: {name}_mask.shape={shape}"
                )

    # ---------------------------------------------------------------- shapes
    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        query_shape = tuple(query_shape)
        value_shape = query_shape if value_shape is None else tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        self._check_key_value(value_shape, key_shape)
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
            query, value, key, query_mask, value_mask, key_mask
        )
        self._check_call_shapes(query, value, key, attention_mask, masks)
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
        if len(store.keys()):
            attention_weights.load_legacy_variables(self, store)
        else:
            super().load_own_variables(store)

    # ------------------------------------------------------- per-head access
    def _require_built(self, what: str):
        if not self.built:
            raise ValueError(f"`{what}` needs a built layer; call the layer on an input first.")

    def head_weights(self, i: int) -> dict[str, np.ndarray]:
        """Head `i`'s own matrices as numpy arrays.

        `query_kernel` (d_model, d_k), `key_kernel`, `value_kernel`
        (d_value, d_v), their biases (zeros when `use_bias=False`),
        `gate_kernel`/`gate_bias` with `use_gate`, and `output_kernel`, the
        (d_v, *d_out) block of W^O that reads head `i`.
        """
        return attention_weights.head_weights(self, i)

    def pruned(self, keep_heads) -> MultiHeadAttentionBase:
        """A new, built layer with only the heads in `keep_heads`.

        The removed heads' W_i^Q, W_i^K, W_i^V (gate), biases and their rows
        of W^O are gone, so its output equals this layer's with those heads
        masked out (`head_mask` 0). `key_dim`/`value_dim`/`output_shape` are
        pinned, since d_k no longer equals d_model / h.
        """
        return attention_weights.pruned(self, keep_heads)

    @classmethod
    def from_keras(cls, layer, implementation: str = "fused") -> MultiHeadAttentionBase:
        """Build ours from a built `keras.layers.MultiHeadAttention` (any
        configuration: the weights are copied as they are)."""
        return attention_weights.from_keras(cls, layer, implementation)

    def to_keras(self) -> keras.layers.MultiHeadAttention:
        """The equivalent built `keras.layers.MultiHeadAttention`."""
        return attention_weights.to_keras(self)
