"""A Llama checkpoint's tensors into `Decoder`'s layers (transformers' names).

transformers stores each Linear as (out, in); Keras's kernels are (in, out).
The attention projections keep the head axis, as everywhere in the package:
W_i^Q is `query_kernel[:, i, :]`, rows i*d_k .. (i+1)*d_k of q_proj.weight;
W_g^K and W_g^V are rows g*d_k .. (g+1)*d_k of k_proj and v_proj.
"""

from __future__ import annotations

import keras
import numpy as np

NAMES = {
    "embedding": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
    "attention_norm": "model.layers.{l}.input_layernorm.weight",
    "ffn_norm": "model.layers.{l}.post_attention_layernorm.weight",
    "query": "model.layers.{l}.self_attn.q_proj.weight",
    "key": "model.layers.{l}.self_attn.k_proj.weight",
    "value": "model.layers.{l}.self_attn.v_proj.weight",
    "output": "model.layers.{l}.self_attn.o_proj.weight",
    "gate": "model.layers.{l}.mlp.gate_proj.weight",
    "up": "model.layers.{l}.mlp.up_proj.weight",
    "down": "model.layers.{l}.mlp.down_proj.weight",
}


def _take(tensors: dict, name: str, shape: tuple) -> np.ndarray:
    if name not in tensors:
        raise ValueError(f"the checkpoint has no tensor {name!r}")
    array = np.asarray(tensors[name], np.float32)
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, expected {shape}")
    return array


def load_llama_weights(model, tensors: dict) -> None:
    """Set `model` (a built `Decoder`) from transformers-named `tensors`; ValueError
    naming the first tensor missing or of the wrong shape."""
    c = model.decoder_config
    d, h, h_kv, dk = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    vocab, ffn = c.vocab_size, c.intermediate_size
    model.embedding.embeddings.assign(_take(tensors, NAMES["embedding"], (vocab, d)))
    model.final_norm.scale.assign(_take(tensors, NAMES["final_norm"], (d,)))
    if model.lm_head is not None:
        model.lm_head.kernel.assign(_take(tensors, NAMES["lm_head"], (vocab, d)).T)
    for layer, block in enumerate(model.blocks):

        def get(key, shape, layer=layer):
            return _take(tensors, NAMES[key].format(l=layer), shape)

        block.attention_norm.scale.assign(get("attention_norm", (d,)))
        block.ffn_norm.scale.assign(get("ffn_norm", (d,)))
        attention = block.attention
        attention.query_dense.kernel.assign(get("query", (h * dk, d)).T.reshape(d, h, dk))
        attention.key_dense.kernel.assign(get("key", (h_kv * dk, d)).T.reshape(d, h_kv, dk))
        attention.value_dense.kernel.assign(get("value", (h_kv * dk, d)).T.reshape(d, h_kv, dk))
        attention.output_dense.kernel.assign(get("output", (d, h * dk)).T.reshape(h, dk, d))
        block.ffn.gate.kernel.assign(get("gate", (ffn, d)).T)
        block.ffn.up.kernel.assign(get("up", (ffn, d)).T)
        block.ffn.down.kernel.assign(get("down", (d, ffn)).T)


def llama_tensors(model) -> dict[str, np.ndarray]:
    """`model`'s weights under transformers' names, (out, in): the inverse of
    `load_llama_weights` (a pruned or fine-tuned Decoder saved as a Llama folder)."""
    c = model.decoder_config
    d, h, h_kv, dk = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def value(variable):
        return np.asarray(keras.ops.convert_to_numpy(variable), np.float32)

    tensors = {
        NAMES["embedding"]: value(model.embedding.embeddings),
        NAMES["final_norm"]: value(model.final_norm.scale),
    }
    if model.lm_head is not None:
        tensors[NAMES["lm_head"]] = value(model.lm_head.kernel).T
    for layer, block in enumerate(model.blocks):
        a = block.attention
        found = {
            "attention_norm": value(block.attention_norm.scale),
            "ffn_norm": value(block.ffn_norm.scale),
            "query": value(a.query_dense.kernel).reshape(d, h * dk).T,
            "key": value(a.key_dense.kernel).reshape(d, h_kv * dk).T,
            "value": value(a.value_dense.kernel).reshape(d, h_kv * dk).T,
            "output": value(a.output_dense.kernel).reshape(h * dk, d).T,
            "gate": value(block.ffn.gate.kernel).T,
            "up": value(block.ffn.up.kernel).T,
            "down": value(block.ffn.down.kernel).T,
        }
        tensors.update(
            {NAMES[k].format(l=layer): np.ascontiguousarray(v) for k, v in found.items()}
        )
    return tensors
