"""A BERT-family encoder rebuilt from keras_mha's layers, with a checkpoint's weights.

    ids -> BertEmbeddings (word + position + token type 0, LayerNorm)
        -> transformer_layer_0 .. transformer_layer_{L-1}   (post-LN, GELU)
        -> pooling (mean over the real tokens) -> L2 normalisation

This is the model sentence-transformers runs for all-MiniLM-L6-v2 (6 layers,
12 heads, d_model 384, d_k 32). Every block is the project's
`TransformerEncoderBlock`, so its attention is `keras_mha.MultiHeadAttention`
and head analysis, export and the device treat it as they treat the
classifiers.

Where the lesson's matrices come from (`load_weights`): Hugging Face stores a
Linear as `(out, in)`. The query matrix `Q` of layer l is
`encoder.layer.l.attention.self.query.weight`, so `W = Q.T` is
`(d_model, h * d_k)` and head i's W_i^Q is its columns `i*d_k:(i+1)*d_k`
(rows `i*d_k:(i+1)*d_k` of the checkpoint's matrix). Reshaping `W` to
`(d_model, h, d_k)` is exactly our `query_kernel`, with `query_kernel[:, i, :]`
= W_i^Q. Keys and values alike; W^O is `attention.output.dense.weight.T`
reshaped to `(h, d_v, d_model)`, so `output_kernel[i]` reads head i.

Token id 0 is BERT's [PAD]: the mask is `ids != 0`, as for the classifiers'
`Embedding(mask_zero=True)`; padded keys get no attention and pooling skips
padded positions.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from edge_demo.errors import UsageError
from keras_mha.layers import BertEmbeddings, L2Normalize, MaskedMeanPooling, TransformerEncoderBlock
from keras_mha.pretrained.config import BertConfig


def build_encoder(
    config: BertConfig,
    sequence_length: int | None = None,
    batch_size: int | None = None,
    heads_per_layer: list[int] | None = None,
    key_dim: int | None = None,
) -> keras.Model:
    """The encoder as a Functional model `keras_mha_encoder`: ids (B, T) -> (B, d), unit norm.

    `sequence_length=None` accepts any length up to `max_positions`. A pruned
    encoder (keras_mha/heads/encoder.py) has `heads_per_layer[l]` heads of
    size `key_dim` in block l; the blocks keep both in their own config, so
    the saved model reloads as it is. Without the arguments, a config with
    `heads_per_layer` (a pruned run's metrics.json) gives those heads, each
    of the unpruned size `config.key_dim`.
    """
    config.validate()
    if heads_per_layer is None and config.heads_per_layer is not None:
        heads_per_layer = config.heads
        key_dim = config.key_dim if key_dim is None else key_dim
    heads_per_layer = heads_per_layer or [config.num_heads] * config.num_layers
    ids = keras.Input((sequence_length,), batch_size=batch_size, dtype="int32", name="inputs")
    x = BertEmbeddings(
        config.vocab_size,
        config.hidden_size,
        config.max_positions,
        config.type_vocab_size,
        config.layer_norm_eps,
        name="embedding",
    )(ids)
    for i, heads in enumerate(heads_per_layer):
        x = TransformerEncoderBlock(
            num_heads=int(heads),
            ff_dim=config.intermediate_size,
            dropout=0.0,
            key_dim=None if key_dim is None else int(key_dim),
            epsilon=config.layer_norm_eps,
            activation=config.activation,
            name=f"transformer_layer_{i}",
        )(x)
    x = MaskedMeanPooling(name="pooling")(x)
    x = L2Normalize(name="normalize")(x)
    return keras.Model(ids, x, name="keras_mha_encoder")


# ------------------------------------------------------------------ weights
def _prefix(names: set[str]) -> str:
    """The checkpoint's prefix: "" (BertModel) or "bert." (a task model around it)."""
    for prefix in ("", "bert."):
        if f"{prefix}embeddings.word_embeddings.weight" in names:
            return prefix
    raise UsageError(
        "has no embeddings.word_embeddings.weight; expected a BERT checkpoint", "model.safetensors"
    )


def checkpoint_weights(config: BertConfig, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """Hugging Face tensors -> our layers' weights, every shape checked.

    Returns {"embedding": [...], "transformer_layer_i": {...}} in our layout
    (see the module docstring for W_i^Q).
    """
    p = _prefix(set(tensors))
    d, h, dk, f = config.hidden_size, config.num_heads, config.key_dim, config.intermediate_size

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = p + name
        if key not in tensors:
            raise UsageError(f"has no tensor {key}", "model.safetensors")
        value = np.asarray(tensors[key], np.float32)
        if value.shape != shape:
            raise UsageError(
                f"tensor {key} has shape {value.shape}; config.json implies {shape}",
                "model.safetensors",
            )
        return value

    out: dict[str, Any] = {
        "embedding": [
            get("embeddings.word_embeddings.weight", (config.vocab_size, d)),
            get("embeddings.position_embeddings.weight", (config.max_positions, d)),
            get("embeddings.token_type_embeddings.weight", (config.type_vocab_size, d)),
            get("embeddings.LayerNorm.weight", (d,)),
            get("embeddings.LayerNorm.bias", (d,)),
        ]
    }
    for layer in range(config.num_layers):
        at = f"encoder.layer.{layer}."

        def head_kernel(name: str, at: str = at) -> tuple[np.ndarray, np.ndarray]:
            weight = get(at + f"attention.self.{name}.weight", (d, d))  # (out, in)
            bias = get(at + f"attention.self.{name}.bias", (d,))
            # W = weight.T, (d_model, h * d_k); head i's W_i = W[:, i*d_k:(i+1)*d_k].
            return weight.T.reshape(d, h, dk), bias.reshape(h, dk)

        out[f"transformer_layer_{layer}"] = {
            "query": head_kernel("query"),
            "key": head_kernel("key"),
            "value": head_kernel("value"),
            "output": (
                get(at + "attention.output.dense.weight", (d, d)).T.reshape(h, dk, d),  # W^O
                get(at + "attention.output.dense.bias", (d,)),
            ),
            "attention_norm": (
                get(at + "attention.output.LayerNorm.weight", (d,)),
                get(at + "attention.output.LayerNorm.bias", (d,)),
            ),
            "ffn_in": (
                get(at + "intermediate.dense.weight", (f, d)).T,
                get(at + "intermediate.dense.bias", (f,)),
            ),
            "ffn_out": (
                get(at + "output.dense.weight", (d, f)).T,
                get(at + "output.dense.bias", (d,)),
            ),
            "ffn_norm": (
                get(at + "output.LayerNorm.weight", (d,)),
                get(at + "output.LayerNorm.bias", (d,)),
            ),
        }
    return out


def load_weights(model: keras.Model, config: BertConfig, tensors: dict[str, np.ndarray]) -> None:
    """Assign a checkpoint's tensors to `build_encoder(config)`'s layers."""
    weights = checkpoint_weights(config, tensors)
    embedding = model.get_layer("embedding")
    word, position, token_type, gamma, beta = weights["embedding"]
    embedding.word_embeddings.assign(word)
    embedding.position_embeddings.assign(position)
    embedding.token_type_embeddings.assign(token_type)
    embedding.norm.gamma.assign(gamma)
    embedding.norm.beta.assign(beta)
    for layer in range(config.num_layers):
        block = model.get_layer(f"transformer_layer_{layer}")
        w = weights[f"transformer_layer_{layer}"]
        attention = block.attention
        for name, dense in (
            ("query", attention.query_dense),
            ("key", attention.key_dense),
            ("value", attention.value_dense),
            ("output", attention.output_dense),
        ):
            dense.kernel.assign(w[name][0])
            dense.bias.assign(w[name][1])
        for name, norm in (("attention_norm", block.attention_norm), ("ffn_norm", block.ffn_norm)):
            norm.gamma.assign(w[name][0])
            norm.beta.assign(w[name][1])
        for name, dense in (("ffn_in", block._ffn_in), ("ffn_out", block._ffn_out)):
            dense.kernel.assign(w[name][0])
            dense.bias.assign(w[name][1])


def encoder_forward(model: keras.Model, ids, head_masks=None, return_attention=False):
    """Run `build_encoder`'s model layer by layer: (B, d) vectors [, attention per layer].

    `head_masks`: optional list with one `(h,)` multiplier per block (head
    analysis). The attention weights are `(B, h, T, T)`, rows of padded
    queries zero.
    """
    embedding = model.get_layer("embedding")
    ids = ops.convert_to_tensor(ids, "int32")
    x = embedding(ids)
    mask = embedding.compute_mask(ids)
    weights = []
    for i in range(sum(1 for layer in model.layers if isinstance(layer, TransformerEncoderBlock))):
        block = model.get_layer(f"transformer_layer_{i}")
        head_mask = None if head_masks is None else head_masks[i]
        x, scores = block(x, mask=mask, head_mask=head_mask, return_attention_scores=True)
        weights.append(scores)
    vectors = model.get_layer("normalize")(model.get_layer("pooling")(x, mask=mask))
    return (vectors, weights) if return_attention else vectors
