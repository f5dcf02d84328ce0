"""A small transformer classifier built from keras_mha layers.

    inputs -> embedding -> + positional encoding
           -> transformer_layer_0 .. transformer_layer_{N-1}
           -> pooling -> dropout -> softmax over classes

Two input kinds: `"features"` (a sequence of feature vectors, e.g. the rows
of a digit image, projected by a Dense layer) and `"tokens"` (integer token
ids with 0 as padding, embedded with `mask_zero=True` so padded positions are
never attended to).

Pooling turns the `(T, d_model)` sequence into one vector: `"mean"` (masked
mean over the tokens, the default) or `"flatten"` (the tokens side by side,
`T * d_model`, keeping where each token sits; for fixed-length feature
sequences only, e.g. the rows of an image).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from bundle_contract.attention import output_name
from keras_mha.attention import MultiHeadAttention, recording
from keras_mha.layers import (
    MaskedMeanPooling,
    PositionalEncoding,
    TokenEmbedding,
    TransformerEncoderBlock,
)

INPUT_KINDS = ("features", "tokens")
POOLINGS = ("mean", "flatten")


@dataclasses.dataclass
class ModelConfig:
    """Flat hyperparameters of the classifier (plain data, JSON-friendly).

    `num_heads` may be a list with one count per layer (a pruned model);
    `key_dim` then pins d_k, which no longer equals d_model / h. `pooling`
    is `"mean"` (masked mean) or `"flatten"` (feature inputs only).
    """

    input_kind: str = "features"
    sequence_length: int = 8
    feature_dim: int = 8  # features per token ("features") or vocabulary size ("tokens")
    num_classes: int = 10
    d_model: int = 32
    num_heads: int | list[int] = 4
    num_layers: int = 1
    ff_dim: int = 64
    dropout: float = 0.1
    key_dim: int | None = None
    positional: str = "sinusoidal"
    implementation: str = "fused"  # or "per_head"; "keras": keras.layers.MultiHeadAttention
    pooling: str = "mean"
    seed: int = 0

    def heads_per_layer(self) -> list[int]:
        if isinstance(self.num_heads, (list, tuple)):
            return [int(h) for h in self.num_heads]
        return [int(self.num_heads)] * self.num_layers

    def validate(self) -> None:
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(
                f"`input_kind` must be one of {INPUT_KINDS}. Received: {self.input_kind!r}"
            )
        for name in (
            "sequence_length",
            "feature_dim",
            "num_classes",
            "d_model",
            "num_layers",
            "ff_dim",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        heads = self.heads_per_layer()
        if len(heads) != self.num_layers:
            raise ValueError(
                f"`num_heads` lists {len(heads)} layers but num_layers={self.num_layers}."
            )
        for h in heads:
            if h <= 0:
                raise ValueError(
                    f"`num_heads` must be positive. Received: num_heads={self.num_heads!r}"
                )
            if self.key_dim is None and self.d_model % h:
                raise ValueError(
                    f"d_model must be divisible by num_heads (d_k = d_model / h). "
                    f"Received: d_model={self.d_model}, num_heads={h}"
                )
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"`pooling` must be one of {POOLINGS}. Received: pooling={self.pooling!r}"
            )
        if self.pooling == "flatten" and self.input_kind == "tokens":
            raise ValueError(
                "`pooling='flatten'` would mix padding into the features; use 'mean' for tokens."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={self.dropout!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """The inverse of `to_dict`; a key it does not know is a ValueError, not dropped."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(
                f"unknown ModelConfig key(s): {', '.join(unknown)}; expected some of: "
                f"{', '.join(names)}"
            )
        return cls(**data)


def build_classifier(config: ModelConfig, batch_size: int | None = None) -> keras.Model:
    """The classifier as a Functional model named `keras_mha_classifier`."""
    config.validate()
    keras.utils.set_random_seed(config.seed)
    if config.input_kind == "features":
        inputs = keras.Input(
            (config.sequence_length, config.feature_dim), batch_size=batch_size, name="inputs"
        )
        x = keras.layers.Dense(config.d_model, name="embedding")(inputs)
    else:
        inputs = keras.Input(
            (config.sequence_length,), batch_size=batch_size, dtype="int32", name="inputs"
        )
        # mask_zero with a 0/1 float mask: no boolean op for an NPU (layers.py)
        x = TokenEmbedding(config.feature_dim, config.d_model, name="embedding")(inputs)
    x = PositionalEncoding(config.sequence_length, config.positional, name="positional_encoding")(x)
    for i, heads in enumerate(config.heads_per_layer()):
        x = TransformerEncoderBlock(
            num_heads=heads,
            ff_dim=config.ff_dim,
            dropout=config.dropout,
            key_dim=config.key_dim,
            implementation=config.implementation,
            seed=config.seed + 10 * i,
            name=f"transformer_layer_{i}",
        )(x)
    if config.pooling == "flatten":
        x = keras.layers.Flatten(name="pooling")(x)  # (B, T * d_model)
    else:
        x = MaskedMeanPooling(name="pooling")(x)  # mean over unpadded tokens
    x = keras.layers.Dropout(config.dropout, seed=config.seed, name="head_dropout")(x)
    outputs = keras.layers.Dense(config.num_classes, activation="softmax", name="classifier")(x)
    return keras.Model(inputs, outputs, name="keras_mha_classifier")


def encoder_blocks(model: keras.Model) -> list[TransformerEncoderBlock]:
    """The model's encoder blocks in order (`transformer_layer_{i}`)."""
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerEncoderBlock)]
    if not blocks:
        raise ValueError(
            f"Model {model.name!r} has no TransformerEncoderBlock with a keras_mha "
            "MultiHeadAttention; expected a model built from keras_mha's blocks "
            "(keras_mha.build_classifier, keras_mha.pretrained.load)."
        )
    return blocks


def attention_layers(model: keras.Model) -> list[MultiHeadAttention]:
    return [block.attention for block in encoder_blocks(model)]


def forward(model: keras.Model, x, head_masks=None, return_attention_scores=False, training=False):
    """Run the classifier layer by layer.

    `head_masks`: optional list with one `(h,)` multiplier per encoder block
    (head analysis). With `return_attention_scores`, also returns the list of
    `(B, h, T, S)` attention weights of every block.
    """
    blocks = encoder_blocks(model)
    embedding = model.get_layer("embedding")
    h = embedding(x)
    mask = embedding.compute_mask(x) if isinstance(embedding, keras.layers.Embedding) else None
    h = model.get_layer("positional_encoding")(h)
    all_scores = []
    for i, block in enumerate(blocks):
        head_mask = None if head_masks is None else head_masks[i]
        h, scores = block(
            h, mask=mask, training=training, head_mask=head_mask, return_attention_scores=True
        )
        all_scores.append(scores)
    pooling = model.get_layer("pooling")
    h = pooling(h) if mask is None else pooling(h, mask=mask)
    h = model.get_layer("head_dropout")(h, training=training)
    probs = model.get_layer("classifier")(h)
    if return_attention_scores:
        return probs, all_scores
    return probs


def attention_recorders(model: keras.Model) -> list[keras.layers.Layer]:
    """The layers whose attention weights `attention_model` returns.

    Every `keras_mha.MultiHeadAttention` in the model, at any depth (inside a
    block, a keras-hub `TransformerEncoder`, a nested model: what
    `keras_mha.convert` makes), and every `TransformerEncoderBlock` that still
    holds Keras's own layer (`implementation="keras"`, not converted). Empty:
    the model has none. (In no particular order: `attention_model` names them
    in the order they run.)
    """
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, MultiHeadAttention) or (
            isinstance(layer, TransformerEncoderBlock)
            and layer.implementation == "keras"
            and not isinstance(layer.attention, MultiHeadAttention)  # converted: it records
        ):
            found.append(layer)
    return found


class _AttentionWeights(keras.layers.Layer):
    """Runs a model and returns the attention weights of each of its attention layers.

    Holds the model itself (its layers and variables, not copies), so a model
    built on it follows any later change of the weights. Any model with
    keras_mha attention works (a classifier, a pretrained encoder, a Keras or
    keras-hub model after `keras_mha.convert`): each layer of
    `attention_recorders` appends `(itself, weights)` to a list while the model
    runs (`attention.recording`); output `attention_i` is the weights of
    the i-th of them to run (the lesson's layer i).
    """

    def __init__(self, classifier: keras.Model, **kwargs):
        super().__init__(**kwargs)
        self.classifier = classifier

    def call(self, x):
        recorders = attention_recorders(self.classifier)
        with recording(recorders) as sink:
            self.classifier(x, training=False)
        order = {id(layer): i for i, layer in enumerate(recorders)}
        runs = [order[id(layer)] for layer, _ in sink]
        if sorted(runs) != list(range(len(recorders))):  # one ran twice, or never
            missing = [recorders[i].name for i in range(len(recorders)) if i not in runs]
            twice = sorted({recorders[i].name for i in runs if runs.count(i) > 1})
            raise ValueError(
                f"Model {self.classifier.name!r} ran its {len(recorders)} keras_mha "
                f"attention layers {len(runs)} times"
                + (f" ({', '.join(twice)} more than once)" if twice else "")
                + (f" ({', '.join(missing)} never)" if missing else "")
                + "; attention weights are read from a model whose attention layers "
                "each run once in its call."
            )
        return {output_name(i): scores for i, (_, scores) in enumerate(sink)}  # (B, h, T, S)


def attention_model(model: keras.Model, batch_size: int | None = 1) -> keras.Model:
    """A model from the model's input to the attention weights of every head.

    Shares the model's weights (no copy). Its output is a dict of each
    attention layer's weights in the order they run, `{"attention_0": (B,
    h_0, T, S), ...}`; for our classifier, equal to `forward(model, x, return_attention_scores=True)[1]`
    with dropout off (for a pretrained encoder, `encoder_forward`'s). The
    whole model runs in its graph, but only what the weights depend on is
    kept when it is converted: the TFLite attention signature ends at the
    last layer's softmax, so it converts with builtin ops only and an integer
    model keeps it integer (softmax outputs have a fixed scale).
    """
    if not attention_recorders(model):
        raise ValueError(
            f"Model {model.name!r} has no keras_mha MultiHeadAttention; expected a model "
            "built on keras_mha's layer (keras_mha.build_classifier, "
            "keras_mha.pretrained.load, or keras_mha.convert(model) for a model on "
            "keras.layers.MultiHeadAttention)."
        )
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
    ):
        raise ValueError(
            "Received an invalid value for argument `batch_size`, expected a positive "
            f"integer or None. Received: batch_size={batch_size!r}"
        )
    if not getattr(model, "inputs", None):
        raise ValueError(
            f"Model {model.name!r} has no symbolic inputs; expected a functional or "
            "Sequential model (a subclassed model's input shape is not known)."
        )
    spec = model.inputs[0]
    inputs = keras.Input(spec.shape[1:], batch_size=batch_size, dtype=spec.dtype, name="inputs")
    outputs = _AttentionWeights(model, name="attention_weights")(inputs)
    return keras.Model(inputs, outputs, name=f"{model.name}_attention")


def count_params(model: keras.Model) -> int:
    return int(sum(np.prod(w.shape) for w in model.weights))
