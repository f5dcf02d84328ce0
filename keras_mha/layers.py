"""The other pieces of a transformer encoder, written to quantize cleanly.

- `LayerNorm`: layer normalization as `(x - mean) * rsqrt(var + eps)`.
  Keras's `LayerNormalization` computes `-mean * inv` internally; the TFLite
  converter keeps that NEG in float, which leaves float islands in a "full
  int8" model and makes int16x8 conversion fail. This one converts to a fully
  integer graph in both modes (docs/field_notes.md).
- `PositionalEncoding`: sinusoidal (the original Transformer's) or learned.
- `TransformerEncoderBlock`: post-norm encoder block (attention, residual,
  norm, feed-forward, residual, norm), with our `MultiHeadAttention`.
- `BertEmbeddings`, `L2Normalize`: a BERT checkpoint's input embeddings and
  sentence-transformers' normalisation (keras_mha/pretrained/bert.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras
import numpy as np
from keras import ops

from keras_mha.attention import MultiHeadAttention, attention_sink
from keras_mha.attention.masks import is_weight_mask
from keras_mha.qat import HOOK, point

# Masked mean pooling with a 0/1 float mask: padding's score below the kept
# tokens' (0). Its weight is then e^-30 (1e-13) of a kept token's before it is
# zeroed, so 1/n is exact to float32 for any length.
_POOL_MARGIN = 30.0
# A LayerNorm whose __dict__ holds an int under this name follows its RSQRT with
# that many Newton steps (`newton_refined`; not tracked, not in the config).
NEWTON_STEPS = "_newton_steps"


def _newton_step(v, y):
    """One Newton step from y towards 1/sqrt(v): y (3 - v y^2) / 2.

    Written 1.5 y - 0.5 (v y)(y y): in float the same number, and no
    intermediate is the constant 1 (v y^2 would be), because an integer model
    takes each intermediate's range from the float model, and a range of
    [1, 1] could not hold the error the step is there to remove.
    """
    return 1.5 * y - 0.5 * ((v * y) * (y * y))


@contextlib.contextmanager
def newton_refined(model: keras.Model, steps: int = 2) -> Iterator[keras.Model]:
    """Within the block, every `LayerNorm` of `model` refines its inverse std
    with `steps` Newton steps; the same function in float (to float32
    rounding: a few ulps of the normalised output).

    For int16 activations: LiteRT's int16 RSQRT loses up to 14.5 % (relative)
    at the small end of an input range as wide as a BERT LayerNorm's variance
    (0.3 to 131, the [CLS] token's outlier); each step squares the relative
    error (3.2 % after one, 0.15 % after two; the int16 intermediates leave
    0.6 %, tests/test_layer_norm_int16.py). Export traces the int16x8 graph of
    a token-id model this way (docs/quantization.md); int8's RSQRT is a table
    exact for each of its 256 inputs and needs none.
    """
    norms = [
        layer
        for layer in model._flatten_layers(include_self=True, recursive=True)
        if isinstance(layer, LayerNorm)
    ]
    for layer in norms:
        object.__setattr__(layer, NEWTON_STEPS, int(steps))  # not a tracked attribute
    try:
        yield model
    finally:
        for layer in norms:
            layer.__dict__.pop(NEWTON_STEPS, None)


def _mean_square(x):
    """mean(x * x) over the last axis, as one dot product per token `(..., d) -> (..., 1)`.

    Equal in float; in int8 the d products are summed in int32 by one
    BATCH_MATMUL, where MUL-then-MEAN would round each small square to a
    quantum of the largest one first (MiniLM's rescaled embedding LayerNorm:
    its variance 27 % off that way; docs/quantization.md).
    """
    rows, columns = ops.expand_dims(x, -2), ops.expand_dims(x, -1)  # (..., 1, d), (..., d, 1)
    return ops.squeeze(ops.matmul(rows, columns), -1) * (1.0 / x.shape[-1])


@keras.saving.register_keras_serializable(package="keras_mha")
class LayerNorm(keras.layers.Layer):
    """Layer normalization over the last axis, integer-quantization friendly.

    y = (x - mean(x)) / sqrt(var(x) + epsilon) * gamma + beta

    Numerically equal to `keras.layers.LayerNormalization(axis=-1)`.
    The variance is `mean(xc * xc)`, not `ops.square`, which lowers to
    SQUARED_DIFFERENCE, an op with no int16 kernel in TFLite.

    `input_scale=True` adds a fixed per-channel scale s (non-trainable, ones
    until set): the layer then reads x' = x / s and normalises x, so a
    residual stream can be carried divided by s, its outlier channels brought
    to the size of the others before int8 sees them
    (keras_mha.pretrained.rescale). The centred x' stays divided by s; only
    the per-token mean and variance, which the outliers dominate anyway, see
    the full-size values. gamma then carries s (gamma * s): the normalised
    value is (x s - mean) / std = s (x' - mean / s) / std.
    """

    def __init__(self, epsilon: float = 1e-6, input_scale: bool = False, **kwargs):
        if not isinstance(epsilon, (int, float)) or epsilon <= 0:
            raise ValueError(
                "Received an invalid value for argument `epsilon`, expected a "
                f"positive float. Received: epsilon={epsilon!r}"
            )
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        self.input_scale = bool(input_scale)
        self.supports_masking = True

    def build(self, input_shape):
        dim = input_shape[-1]
        self.gamma = self.add_weight(name="gamma", shape=(dim,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(dim,), initializer="zeros")
        self.scale = None
        if self.input_scale:
            self.scale = self.add_weight(
                name="input_scale", shape=(dim,), initializer="ones", trainable=False
            )

    def call(self, x):
        if self.scale is None:
            # point(): where an int8 model rounds, when quantization-aware (keras_mha.qat)
            mean = point(self, "mean", ops.mean(x, axis=-1, keepdims=True))
            xc = point(self, "centred", x - mean)
            var = point(self, "variance", ops.mean(xc * xc, axis=-1, keepdims=True))
        else:  # x is x' = x / s: the statistics of x s; the centred values stay divided by s
            s = ops.cast(self.scale, x.dtype)
            mean = point(self, "mean", ops.mean(x * s, axis=-1, keepdims=True))
            xc = point(self, "centred", x - mean * (1.0 / s))  # (x s - mean) / s
            var = point(self, "variance", _mean_square(xc * s))
        inverse_std = point(self, "inverse_std", ops.rsqrt(var + self.epsilon))
        for _ in range(self.__dict__.get(NEWTON_STEPS, 0)):  # newton_refined()
            inverse_std = _newton_step(var + self.epsilon, inverse_std)
        normalized = point(self, "normalized", xc * inverse_std)
        return point(self, "output", normalized * self.gamma + self.beta)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {**super().get_config(), "epsilon": self.epsilon}
        if self.input_scale:
            config["input_scale"] = True
        return config


def sinusoidal_table(length: int, d_model: int) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...)."""
    pos = np.arange(length)[:, None].astype("float64")
    i = np.arange(d_model)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / d_model)
    table = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    return table.astype("float32")


@keras.saving.register_keras_serializable(package="keras_mha")
class PositionalEncoding(keras.layers.Layer):
    """Adds position information to a `(B, T, d_model)` sequence.

    Args:
        max_length: Longest sequence the layer accepts.
        kind: `"sinusoidal"` (fixed, Vaswani et al. 2017) or `"learned"`.
    """

    KINDS = ("sinusoidal", "learned")

    def __init__(self, max_length: int, kind: str = "sinusoidal", **kwargs):
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
            raise ValueError(
                "Received an invalid value for argument `max_length`, expected "
                f"a positive integer. Received: max_length={max_length!r}"
            )
        if kind not in self.KINDS:
            raise ValueError(
                "Received an invalid value for argument `kind`, expected one of "
                f"{self.KINDS}. Received: kind={kind!r}"
            )
        super().__init__(**kwargs)
        self.max_length = max_length
        self.kind = kind
        self.supports_masking = True

    def build(self, input_shape):
        d_model = input_shape[-1]
        if self.kind == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.max_length, d_model),
                initializer=keras.initializers.RandomNormal(stddev=0.02),
            )
        else:
            self._table = sinusoidal_table(self.max_length, d_model)

    def call(self, x):
        length = x.shape[1]
        if length is not None and length > self.max_length:
            raise ValueError(f"Sequence length {length} exceeds `max_length`={self.max_length}.")
        table = self.position_embeddings if self.kind == "learned" else self._table
        table = ops.cast(table, x.dtype)
        if length is None:
            length = ops.shape(x)[1]
        return x + ops.expand_dims(table[:length], 0)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length, "kind": self.kind}


@keras.saving.register_keras_serializable(package="keras_mha")
class TokenEmbedding(keras.layers.Embedding):
    """`keras.layers.Embedding(mask_zero=True)` whose mask is 0/1 floats, not booleans.

    Keras's mask is `ids != 0`. Every operator on a boolean (NOT_EQUAL, the
    query and key masks ANDed, `where`) is one an integer-only NPU such as
    Arm's Ethos-U55 has no kernel for: each splits its graph and runs on the
    CPU. This mask is looked up like the embedding itself, in a table of one
    0 (the padding id 0) and 1s, and the layers after it (MultiHeadAttention,
    MaskedMeanPooling, MaskedMaxPooling) read a float mask with MUL and SUB
    only (`attention.masks.is_weight_mask`). The numbers are those of the
    boolean mask; the weights, config and `mask_zero` are Keras's.
    """

    def __init__(self, input_dim, output_dim, mask_zero=True, **kwargs):
        super().__init__(input_dim, output_dim, mask_zero=mask_zero, **kwargs)

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        table = np.ones((self.input_dim,), "float32")
        table[0] = 0.0  # the padding id
        table = ops.convert_to_tensor(table, self.compute_dtype)  # bfloat16 too
        return ops.take(table, ops.cast(inputs, "int32"), axis=0)


@keras.saving.register_keras_serializable(package="keras_mha")
class MaskedMeanPooling(keras.layers.Layer):
    """Mean over the tokens the mask keeps: `(B, T, d) -> (B, d)`.

    Equal to `GlobalAveragePooling1D` with a mask, but the 0/1 weights come
    from `where(mask, 1, 0)` rather than a bool->float cast, which the TFLite
    converter leaves as a float CAST in an otherwise integer int8 graph.
    A sequence with no token kept gives zeros, not NaN.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x, mask=None):
        if mask is None:
            return ops.mean(x, axis=1)
        if is_weight_mask(mask):  # 0/1 floats (TokenEmbedding): no DIV, no boolean op
            # softmax of 0 on kept tokens and -30 on padding: 1/n on the n kept
            # (and e^-30 of that on padding, then zeroed): the mean as attention
            # with equal scores, which an NPU without DIV (Ethos-U55) runs.
            keep = ops.cast(mask, x.dtype)  # (B, T)
            weights = ops.softmax((keep - 1.0) * _POOL_MARGIN, axis=-1) * keep
            return point(self, "mean", ops.sum(x * ops.expand_dims(weights, -1), axis=1))
        keep = ops.where(ops.expand_dims(mask, -1), 1.0, 0.0)  # (B, T, 1)
        keep = ops.cast(keep, x.dtype)
        return point(
            self, "mean", ops.sum(x * keep, axis=1) / ops.maximum(ops.sum(keep, axis=1), 1.0)
        )

    def compute_mask(self, x, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


@keras.saving.register_keras_serializable(package="keras_mha")
class FirstTokenPooling(keras.layers.Layer):
    """The first token's vector: `(B, T, d) -> (B, d)` (BERT's [CLS] pooling,
    sentence-transformers' `pooling_mode_cls_token`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x, mask=None):
        return point(self, "first", x[:, 0, :])

    def compute_mask(self, x, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


@keras.saving.register_keras_serializable(package="keras_mha")
class MaskedMaxPooling(keras.layers.Layer):
    """Max over the tokens the mask keeps: `(B, T, d) -> (B, d)`
    (sentence-transformers' `pooling_mode_max_tokens`).

    A masked position takes the sequence's smallest value (over every
    position) rather than -1e9, as the attention's masked softmax does: it
    never wins the max, and an int8 model's range stays the tensor's own.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x, mask=None):
        if mask is not None:
            floor = ops.min(x, axis=1, keepdims=True)  # (B, 1, d): never above a kept value
            if is_weight_mask(mask):  # 0/1 floats: kept x - 0, masked x - (x - floor)
                keep = ops.expand_dims(ops.cast(mask, x.dtype), -1)
                x = x - (1.0 - keep) * (x - floor)
            else:
                x = ops.where(ops.expand_dims(mask, -1), x, floor)
        return point(self, "max", ops.max(x, axis=1))

    def compute_mask(self, x, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


def _gelu_tanh(x):
    """GELU with the tanh approximation (Hugging Face's `"gelu_new"`)."""
    return keras.activations.gelu(x, approximate=True)


def _ffn_activation(name: str):
    """`relu`; `gelu`: x * Phi(x) with the exact erf (BERT's `"gelu"`, Keras's default); `gelu_tanh`."""
    return _gelu_tanh if name == "gelu_tanh" else name


@keras.saving.register_keras_serializable(package="keras_mha")
class TransformerEncoderBlock(keras.layers.Layer):
    """x = LN(x + Dropout(MHA(x))); x = LN(x + Dropout(FFN(x))).

    Args:
        num_heads: Heads of the attention.
        ff_dim: Hidden size of the feed-forward network.
        dropout: Dropout after attention and feed-forward (and on the
            attention weights).
        key_dim: Per-head size; defaults to d_model / num_heads.
        implementation: Passed to `MultiHeadAttention` (`"fused"` or
            `"per_head"`); `"keras"` uses `keras.layers.MultiHeadAttention`
            instead, the anchor our layer is compared with.
        epsilon: LayerNorm's epsilon (BERT's checkpoints: 1e-12).
        activation: The feed-forward network's hidden activation: `"relu"`
            (ours), `"gelu"` (BERT's exact erf GELU) or `"gelu_tanh"`.
        seed: Seed for the dropout layers.
        norm_input_scale: Both LayerNorms read a rescaled residual stream
            (`LayerNorm(input_scale=True)`; keras_mha.pretrained.rescale).
        ffn_outliers: The last `ffn_outliers` of the `ff_dim` hidden units
            in their own pair of Dense layers (`ffn_in_outliers`,
            `ffn_out_outliers`, summed into the output): the same function,
            but an int8 model gives their few large activations a scale of
            their own (keras_mha.pretrained.rescale).
    """

    ACTIVATIONS = ("relu", "gelu", "gelu_tanh")

    def __init__(
        self,
        num_heads: int,
        ff_dim: int,
        dropout: float = 0.0,
        key_dim: int | None = None,
        implementation: str = "fused",
        epsilon: float = 1e-6,
        seed: int | None = None,
        activation: str = "relu",
        norm_input_scale: bool = False,
        ffn_outliers: int = 0,
        **kwargs,
    ):
        if activation not in self.ACTIVATIONS:
            raise ValueError(
                "Received an invalid value for argument `activation`, expected one of "
                f"{self.ACTIVATIONS}. Received: activation={activation!r}"
            )
        if isinstance(ff_dim, bool) or not isinstance(ff_dim, int) or ff_dim <= 0:
            raise ValueError(
                "Received an invalid value for argument `ff_dim`, expected a "
                f"positive integer. Received: ff_dim={ff_dim!r}"
            )
        if (
            isinstance(ffn_outliers, bool)
            or not isinstance(ffn_outliers, int)
            or not 0 <= ffn_outliers < ff_dim
        ):
            raise ValueError(
                "Received an invalid value for argument `ffn_outliers`, expected an "
                f"integer in [0, ff_dim={ff_dim}). Received: ffn_outliers={ffn_outliers!r}"
            )
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.ff_dim = ff_dim
        self.ffn_outliers = ffn_outliers
        self.dropout = dropout
        self.key_dim = key_dim
        self.implementation = implementation
        self.epsilon = epsilon
        self.seed = seed
        self.activation = activation
        self.supports_masking = True
        self.attention = None  # "keras": made in build(), once d_model is known
        if implementation != "keras":
            self.attention = MultiHeadAttention(
                num_heads,
                key_dim=key_dim,
                dropout=dropout,
                implementation=implementation,
                seed=seed,
                name="attention",
            )
        self.norm_input_scale = bool(norm_input_scale)
        self.attention_norm = LayerNorm(epsilon, norm_input_scale, name="attention_norm")
        self.ffn_norm = LayerNorm(epsilon, norm_input_scale, name="ffn_norm")
        self.attention_dropout = keras.layers.Dropout(dropout, seed=seed)
        self.ffn_dropout = keras.layers.Dropout(dropout, seed=None if seed is None else seed + 1)
        self._ffn_in = None
        self._ffn_out = None
        self._ffn_in_outliers = None
        self._ffn_out_outliers = None

    def build(self, input_shape):
        d_model = input_shape[-1]
        if self.implementation == "keras":
            self.attention = keras.layers.MultiHeadAttention(
                self.num_heads,
                key_dim=self.key_dim or d_model // self.num_heads,
                dropout=self.dropout,
                seed=self.seed,
                name="attention",
            )
            self.attention.build(input_shape, input_shape)
        else:
            self.attention.build(input_shape)
        self.attention_norm.build(input_shape)
        self.ffn_norm.build(input_shape)
        activation = _ffn_activation(self.activation)
        units = self.ff_dim - self.ffn_outliers
        self._ffn_in = keras.layers.Dense(units, activation=activation, name="ffn_in")
        self._ffn_out = keras.layers.Dense(d_model, name="ffn_out")
        self._ffn_in.build(input_shape)
        self._ffn_out.build(tuple(input_shape[:-1]) + (units,))
        if self.ffn_outliers:
            self._ffn_in_outliers = keras.layers.Dense(
                self.ffn_outliers, activation=activation, name="ffn_in_outliers"
            )
            self._ffn_out_outliers = keras.layers.Dense(
                d_model, use_bias=False, name="ffn_out_outliers"
            )
            self._ffn_in_outliers.build(input_shape)
            self._ffn_out_outliers.build(tuple(input_shape[:-1]) + (self.ffn_outliers,))

    def call(self, x, mask=None, training=None, head_mask=None, return_attention_scores=False):
        # Scores only when asked; without them the fused attention may take
        # ops.dot_product_attention on JAX and PyTorch. A block on Keras's layer
        # records its weights itself (keras_mha.model.attention_model; ours
        # records them in its own call).
        sink = attention_sink(self)
        scored = return_attention_scores or sink is not None
        if self.implementation == "keras":
            if head_mask is not None:
                raise ValueError("`head_mask` needs keras_mha's MultiHeadAttention.")
            out = self.attention(
                x, x, value_mask=mask, training=training, return_attention_scores=scored
            )
        else:
            out = self.attention(
                x,
                query_mask=mask,
                value_mask=mask,
                training=training,
                head_mask=head_mask,
                return_attention_scores=scored,
            )
        attended, scores = out if scored else (out, None)
        if sink is not None:
            sink.append((self, scores))
        # point(): where int8 rounds, when quantization-aware (keras_mha.qat)
        x = point(self, "attention_sum", x + self.attention_dropout(attended, training=training))
        x = self.attention_norm(x)
        ffn = self._ffn_out(point(self, "ffn_hidden", self._hidden(self._ffn_in, x, "ffn_pre")))
        if self.ffn_outliers:
            outliers = self._hidden(self._ffn_in_outliers, x, "ffn_pre_outliers")
            outliers = point(self, "ffn_hidden_outliers", outliers)
            ffn = point(self, "ffn_output", ffn) + self._ffn_out_outliers(outliers)
        ffn = point(self, "ffn", ffn)
        x = self.ffn_norm(point(self, "ffn_sum", x + self.ffn_dropout(ffn, training=training)))
        if return_attention_scores:
            return x, scores
        return x

    def _hidden(self, dense, x, name: str):
        """The FFN's hidden units, `dense(x)`; quantization-aware, its input to
        the activation is a point too (TFLite keeps it as a tensor of its own)."""
        if HOOK not in self.__dict__ or self.activation == "relu":  # TFLite fuses a ReLU
            return dense(x)
        linear = ops.matmul(x, dense.kernel) + dense.bias
        return dense.activation(point(self, name, linear))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "ff_dim": self.ff_dim,
            "dropout": self.dropout,
            "key_dim": self.key_dim,
            "implementation": self.implementation,
            "epsilon": self.epsilon,
            "seed": self.seed,
            "activation": self.activation,
            **({"norm_input_scale": True} if self.norm_input_scale else {}),
            **({"ffn_outliers": self.ffn_outliers} if self.ffn_outliers else {}),
        }


@keras.saving.register_keras_serializable(package="keras_mha")
class BertEmbeddings(keras.layers.Layer):
    """word_embeddings[ids] + position_embeddings[offset + t] + token_type_embeddings[type], then LayerNorm.

    Every sentence is one segment (token type 0); a cross-encoder's pair
    (`pair_sep_id` set) gives the tokens after the first [SEP] type 1, as
    its tokenizer does, so the model needs only the ids. The output carries the
    mask `ids != pad_id` for the blocks and the pooling, as 0/1 floats (see
    `compute_mask`): BERT's [PAD] is 0,
    RoBERTa's and XLM-R's <pad> is 1. RoBERTa numbers positions from
    `pad_id + 1` (its `padding_idx + 1`), so `position_offset` is 2 there and
    0 for BERT; with padding only at the end (how every batch here is made),
    token t's position is `position_offset + t`, as transformers computes it.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_positions: int,
        type_vocab_size: int = 2,
        epsilon: float = 1e-12,
        norm_input_scale: bool = False,
        pad_id: int = 0,
        position_offset: int = 0,
        pair_sep_id: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.pad_id = int(pad_id)
        self.pair_sep_id = None if pair_sep_id is None else int(pair_sep_id)
        self.position_offset = int(position_offset)
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.max_positions = int(max_positions)
        self.type_vocab_size = int(type_vocab_size)
        self.epsilon = float(epsilon)
        self.norm_input_scale = bool(norm_input_scale)  # keras_mha.pretrained.rescale
        self.norm = LayerNorm(self.epsilon, self.norm_input_scale, name="norm")

    def build(self, input_shape=None):
        d_model = self.hidden_size
        self.word_embeddings = self.add_weight(
            name="word_embeddings", shape=(self.vocab_size, d_model), initializer="zeros"
        )
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=(self.max_positions, d_model), initializer="zeros"
        )
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings",
            shape=(self.type_vocab_size, d_model),
            initializer="zeros",
        )
        self.norm.build((None, None, d_model))
        self.built = True

    def call(self, ids):
        length = ids.shape[1]
        first = self.position_offset
        if length is None:
            length = ops.shape(ids)[1]
        elif first + length > self.max_positions:
            raise ValueError(
                f"Sequence length {length} exceeds max_positions={self.max_positions}"
                + (f" less position_offset={first}." if first else ".")
            )
        x = ops.take(self.word_embeddings, ids, axis=0)  # (B, T, d)
        positions = self.position_embeddings[first : first + length]
        x = x + ops.expand_dims(positions, 0)  # + position offset + t
        if self.pair_sep_id is None:
            x = x + self.token_type_embeddings[0]  # + segment A
        else:  # a pair: segment A up to the first [SEP], segment B after it
            x = x + ops.take(self.token_type_embeddings, self.token_types(ids), axis=0)
        return self.norm(point(self, "sum", x))

    def token_types(self, ids):
        """A pair's token types from its ids, as the tokenizer gives them: 0 up to and with
        the first `pair_sep_id` ([CLS] query [SEP]), 1 after it (passage [SEP]), 0 on
        padding. Without `pair_sep_id`, 0 everywhere."""
        if self.pair_sep_id is None:
            return ops.zeros_like(ids)
        sep = ops.cast(ops.equal(ids, self.pair_sep_id), "int32")
        before = ops.cumsum(sep, axis=1) - sep  # [SEP]s strictly before each token
        real = ops.cast(ops.not_equal(ids, self.pad_id), "int32")
        return ops.cast(ops.greater(before, 0), "int32") * real

    def compute_mask(self, ids, mask=None):
        # 0/1 floats looked up like the ids, as TokenEmbedding's: the attention and
        # the poolings read them with MUL and SUB, so no boolean operator (which an
        # integer-only NPU such as Ethos-U55 cannot run) is left in the graph.
        table = np.ones((self.vocab_size,), "float32")
        table[self.pad_id] = 0.0
        table = ops.convert_to_tensor(table, self.compute_dtype)
        return ops.take(table, ops.cast(ids, "int32"), axis=0)

    def compute_output_spec(self, ids):
        return keras.KerasTensor(tuple(ids.shape) + (self.hidden_size,), dtype=self.compute_dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "max_positions": self.max_positions,
            "type_vocab_size": self.type_vocab_size,
            "epsilon": self.epsilon,
            **({"norm_input_scale": True} if self.norm_input_scale else {}),
            **({"pad_id": self.pad_id} if self.pad_id else {}),
            **({"position_offset": self.position_offset} if self.position_offset else {}),
            **({"pair_sep_id": self.pair_sep_id} if self.pair_sep_id is not None else {}),
        }


@keras.saving.register_keras_serializable(package="keras_mha")
class L2Normalize(keras.layers.Layer):
    """x / max(||x||, 1e-12) over the last axis (sentence-transformers' Normalize).

    Computed as x * rsqrt(max(||x||^2, 1e-24)): the same numbers, and RSQRT and
    MUL are operators every Ethos-U NPU runs (SQRT and DIV are not)."""

    def call(self, x):
        squared = ops.sum(x * x, axis=-1, keepdims=True)
        return x * ops.rsqrt(ops.maximum(squared, 1e-24))

    def compute_output_shape(self, input_shape):
        return input_shape
