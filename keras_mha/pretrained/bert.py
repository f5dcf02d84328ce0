"""A BERT-family encoder rebuilt from keras_mha's layers, with a checkpoint's weights.

    ids -> BertEmbeddings (word + position + token type 0, LayerNorm)
        -> transformer_layer_0 .. transformer_layer_{L-1}   (post-LN, GELU)
        -> pooling (the checkpoint's: mean over the real tokens, the first
           token [CLS], or the max over the real tokens) -> L2 normalisation
    or, for a sequence classifier (config.json's *ForSequenceClassification):
        -> the first token -> Dense(d, tanh | relu) -> Dense(classes) -> softmax
    or, for a cross-encoder (the same with one label; its input a pair, the
    tokens after the first [SEP] token type 1):
        -> the first token -> Dense(d, tanh | relu) -> Dense(1) -> sigmoid (or none)

This is the model sentence-transformers runs for all-MiniLM-L6-v2 (6 layers,
12 heads, d_model 384, d_k 32, mean pooling), and for BERT, DistilBERT,
RoBERTa and XLM-RoBERTa checkpoints with other shapes and poolings
(config.json's `model_type`: `NAMES` has each family's tensor names). Every block is the project's
`TransformerEncoderBlock`, so its attention is `keras_mha.MultiHeadAttention`
and head analysis, export and the device treat it as they treat the
classifiers. DistilBERT has no token types: its token type embedding is one
row of zeros.

Where the lesson's matrices come from (`checkpoint_weights`): Hugging Face
stores a Linear as `(out, in)`. The query matrix `Q` of layer l (BERT's
`encoder.layer.l.attention.self.query.weight`, DistilBERT's
`transformer.layer.l.attention.q_lin.weight`), transposed, is `W = Q.T`,
`(d_model, h * d_k)`, and head i's W_i^Q is its columns `i*d_k:(i+1)*d_k`
(rows `i*d_k:(i+1)*d_k` of the checkpoint's matrix). Reshaping `W` to
`(d_model, h, d_k)` is exactly our `query_kernel`, with `query_kernel[:, i, :]`
= W_i^Q. Keys and values alike; W^O (BERT's `attention.output.dense`,
DistilBERT's `attention.out_lin`) transposed and reshaped to
`(h, d_v, d_model)`, so `output_kernel[i]` reads head i.

The mask is `ids != pad_token_id` (config.json's: BERT's and DistilBERT's
[PAD] is 0, RoBERTa's and XLM-R's <pad> is 1); padded keys get no attention
and pooling skips padded positions. RoBERTa and XLM-R number positions from
pad_token_id + 1 (`BertConfig.position_offset`).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from bundle_contract.errors import UsageError
from keras_mha.layers import (
    BertEmbeddings,
    FirstTokenPooling,
    L2Normalize,
    MaskedMaxPooling,
    MaskedMeanPooling,
    TransformerEncoderBlock,
)
from keras_mha.pretrained.config import BertConfig

# sentence-transformers' pooling modes (BertConfig.pooling) as our layers
POOLING_LAYERS = {"mean": MaskedMeanPooling, "cls": FirstTokenPooling, "max": MaskedMaxPooling}


def build_encoder(
    config: BertConfig,
    sequence_length: int | None = None,
    batch_size: int | None = None,
    heads_per_layer: list[int] | None = None,
    key_dim: int | None = None,
) -> keras.Model:
    """The encoder as a Functional model `keras_mha_encoder`: ids (B, T) -> (B, d), unit norm.

    `sequence_length=None` accepts any length up to `max_positions`. A pruned
    encoder (`encoding.build_pruned_encoder`) has `heads_per_layer[l]` heads of
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
        pad_id=config.pad_token_id,  # the mask: ids != pad_id
        position_offset=config.position_offset,  # RoBERTa's positions start at pad_id + 1
        pair_sep_id=config.pair_sep_id,  # a cross-encoder's pair: type 1 after the first [SEP]
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
    x = POOLING_LAYERS[config.pooling](name="pooling")(x)  # the checkpoint's sentence vector
    if not config.labels and not config.score_activation:
        x = L2Normalize(name="normalize")(x)
        return keras.Model(ids, x, name="keras_mha_encoder")
    # the checkpoint's classifier head on the first token: BERT's pooler (tanh),
    # DistilBERT's pre_classifier (relu), RoBERTa's classifier.dense (tanh)
    x = keras.layers.Dense(
        config.hidden_size, activation=config.classifier_activation, name="pre_classifier"
    )(x)
    if config.score_activation:  # a cross-encoder: one logit, CrossEncoder's activation
        x = keras.layers.Dense(1, name="classifier")(x)
        x = keras.layers.Activation(
            "sigmoid" if config.score_activation == "sigmoid" else "linear", name="score"
        )(x)
        return keras.Model(ids, x, name="keras_mha_cross_encoder")
    x = keras.layers.Dense(config.num_labels, name="classifier")(x)  # logits
    x = keras.layers.Softmax(name="softmax")(x)
    return keras.Model(ids, x, name="keras_mha_classifier")


# The layers after the last block, in order (those a model has): a sentence
# encoder's pooling and normalize; a classifier's pooling, pre_classifier,
# classifier and softmax; a cross-encoder's the same with its score activation.
HEAD_LAYERS = ("pooling", "pre_classifier", "classifier", "softmax", "score", "normalize")


def head_forward(model: keras.Model, x, mask):
    """The model's output from the last block's `x` (B, T, d) and the mask: unit
    vectors (an encoder) or class probabilities (a classifier)."""
    names = {layer.name for layer in model.layers}
    x = model.get_layer("pooling")(x, mask=mask)
    for name in HEAD_LAYERS[1:]:
        if name in names:
            x = model.get_layer(name)(x)
    return x


# ------------------------------------------------------------------ weights
# Each family's checkpoint names (config.json's model_type). A Linear is
# stored (out, in); `attention.query` of layer l, transposed, is W^Q =
# (d_model, h * d_k), and head i's W_i^Q is its columns i*d_k:(i+1)*d_k, so
# reshaping it to (d_model, h, d_k) is our `query_kernel` with
# `query_kernel[:, i, :]` = W_i^Q (`head_kernel` below), the same for every
# family: BERT's, RoBERTa's and XLM-R's `attention.self.query`, DistilBERT's
# `attention.q_lin`.
NAMES = {
    "bert": {
        "prefixes": ("", "bert."),
        # a sequence classifier's head ("{p}": the encoder's prefix): (Dense(d), Dense(C))
        "pre_classifier": "{p}pooler.dense",
        "classifier": "classifier",
        "word": "embeddings.word_embeddings.weight",
        "position": "embeddings.position_embeddings.weight",
        "token_type": "embeddings.token_type_embeddings.weight",
        "embedding_norm": "embeddings.LayerNorm",
        "layer": "encoder.layer.{}.",
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "output": "attention.output.dense",
        "attention_norm": "attention.output.LayerNorm",
        "ffn_in": "intermediate.dense",
        "ffn_out": "output.dense",
        "ffn_norm": "output.LayerNorm",
    },
    "distilbert": {
        "prefixes": ("", "distilbert."),
        "pre_classifier": "pre_classifier",
        "classifier": "classifier",
        "word": "embeddings.word_embeddings.weight",
        "position": "embeddings.position_embeddings.weight",
        "token_type": None,  # no token types: BertEmbeddings adds a zero type embedding
        "embedding_norm": "embeddings.LayerNorm",
        "layer": "transformer.layer.{}.",
        "query": "attention.q_lin",
        "key": "attention.k_lin",
        "value": "attention.v_lin",
        "output": "attention.out_lin",
        "attention_norm": "sa_layer_norm",
        "ffn_in": "ffn.lin1",
        "ffn_out": "ffn.lin2",
        "ffn_norm": "output_layer_norm",
    },
}
# RoBERTa and XLM-RoBERTa store BERT's names (transformers' RobertaSelfAttention is
# BertSelfAttention's layout): head i is query_kernel[:, i, :] there too.
for _kind in ("roberta", "xlm-roberta"):
    NAMES[_kind] = {
        **NAMES["bert"],
        "prefixes": ("", "roberta."),
        "pre_classifier": "classifier.dense",  # RobertaClassificationHead
        "classifier": "classifier.out_proj",
    }


# Tensors of task heads (transformers' *ForSequenceClassification, ...ForTokenClassification,
# ...ForQuestionAnswering, ...ForMultipleChoice): their models are refused, not stripped.
TASK_HEADS = ("classifier.", "pre_classifier.", "qa_outputs.", "score.")


def _prefix(names: set[str], family: dict) -> str:
    """The checkpoint's prefix: "" (the bare model) or "bert." (a model around it)."""
    for prefix in family["prefixes"]:
        if prefix + family["word"] in names:
            return prefix
    raise UsageError(
        f"has no {family['word']}; expected a checkpoint of config.json's model_type",
        "model.safetensors",
    )


def checkpoint_weights(config: BertConfig, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """Hugging Face tensors -> our layers' weights, every shape checked.

    Returns {"embedding": [...], "transformer_layer_i": {...}} in our layout
    (see NAMES for W_i^Q).
    """
    names = NAMES[config.family]
    p = _prefix(set(tensors), names)
    heads = sorted(k for k in tensors if k.startswith(TASK_HEADS))
    if heads and not (config.labels or config.score_activation):  # a task head config.json hides
        raise UsageError(
            f"holds {heads[0]}, a task head's tensor that a sentence encoder import would "
            "drop (a classifier's labels are not kept)",
            "model.safetensors",
        )
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

    types = (config.type_vocab_size, d)
    out: dict[str, Any] = {
        "embedding": [
            get(names["word"], (config.vocab_size, d)),
            get(names["position"], (config.max_positions, d)),
            np.zeros(types, np.float32)
            if names["token_type"] is None
            else get(names["token_type"], types),
            get(names["embedding_norm"] + ".weight", (d,)),
            get(names["embedding_norm"] + ".bias", (d,)),
        ]
    }
    for layer in range(config.num_layers):
        at = names["layer"].format(layer)

        def dense(name: str, shape: tuple[int, int], at: str = at) -> tuple[np.ndarray, np.ndarray]:
            """A Linear's (weight.T, bias): weight is stored (out, in)."""
            return get(at + names[name] + ".weight", shape).T, get(
                at + names[name] + ".bias", shape[:1]
            )

        def head_kernel(name: str) -> tuple[np.ndarray, np.ndarray]:
            weight, bias = dense(name, (d, d))  # W = weight.T, (d_model, h * d_k)
            return weight.reshape(d, h, dk), bias.reshape(h, dk)  # W_i = W[:, i*d_k:(i+1)*d_k]

        def norm(name: str, at: str = at) -> tuple[np.ndarray, np.ndarray]:
            return get(at + names[name] + ".weight", (d,)), get(at + names[name] + ".bias", (d,))

        w_o, b_o = dense("output", (d, d))
        out[f"transformer_layer_{layer}"] = {
            "query": head_kernel("query"),
            "key": head_kernel("key"),
            "value": head_kernel("value"),
            "output": (w_o.reshape(h, dk, d), b_o),  # W^O; output_kernel[i] reads head i
            "attention_norm": norm("attention_norm"),
            "ffn_in": dense("ffn_in", (f, d)),
            "ffn_out": dense("ffn_out", (d, f)),
            "ffn_norm": norm("ffn_norm"),
        }
    classes = config.output_width
    if config.labels or config.score_activation:  # the head: (out, in) Linears, transposed
        for name, shape in (("pre_classifier", (d, d)), ("classifier", (classes, d))):
            out[name] = _linear(tensors, names[name].format(p=p), shape)
    return out


def _linear(tensors: dict, key: str, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A head's Linear `key` (its full name) as (weight.T, bias), shapes checked."""
    found = []
    for name, want in ((key + ".weight", shape), (key + ".bias", shape[:1])):
        if name not in tensors:
            raise UsageError(f"has no tensor {name} (the classifier head)", "model.safetensors")
        value = np.asarray(tensors[name], np.float32)
        if value.shape != want:
            raise UsageError(
                f"tensor {name} has shape {value.shape}; config.json implies {want}",
                "model.safetensors",
            )
        found.append(value)
    return found[0].T, found[1]


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
    for name in ("pre_classifier", "classifier") if "classifier" in weights else ():
        dense = model.get_layer(name)
        dense.kernel.assign(weights[name][0])
        dense.bias.assign(weights[name][1])


def encoder_forward(model: keras.Model, ids, head_masks=None, return_attention=False):
    """Run `build_encoder`'s model layer by layer: (B, d) vectors or (B, C) class
    probabilities [, attention per layer].

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
    vectors = head_forward(model, x, mask)
    return (vectors, weights) if return_attention else vectors
