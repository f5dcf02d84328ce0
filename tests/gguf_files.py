"""Small GGUF files for the tests, written with llama.cpp's own `gguf` writer.

`write_llama_gguf` lays a Decoder's weights out as llama.cpp's converter does
(its names; the query and key rows of each head interleaved for its rotary
kernel; float32 here, not quantized) with a byte-level BPE of the 256 byte
symbols and one control token, so a test can read it back through
keras_mha.decoder.gguf_import and compare with the Decoder it came from.
`metadata` and `drop` make the hostile variants.
"""

from __future__ import annotations

import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}<|end|>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|end|>assistant\n{% endif %}"
)


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation: Hugging Face's rotary halves
    (h, 2, d/2) interleaved as (h, d/2, 2)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def byte_tokens() -> list[str]:
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet()) + ["<|end|>"]


def write_llama_gguf(path, model, metadata: dict | None = None, drop: tuple = ()) -> None:
    """`model` (a Decoder whose vocabulary is byte_tokens()) as a GGUF file."""
    import gguf

    from keras_mha.decoder.gguf_import import gguf_to_transformers
    from keras_mha.decoder.weights import llama_tensors

    c = model.decoder_config
    tokens = byte_tokens()
    assert c.vocab_size == len(tokens), (c.vocab_size, len(tokens))
    hf_to_gguf = {hf: g for g, hf in gguf_to_transformers(c.num_hidden_layers).items()}
    values = {
        "llama.block_count": c.num_hidden_layers,
        "llama.context_length": c.max_position_embeddings,
        "llama.embedding_length": c.hidden_size,
        "llama.feed_forward_length": c.intermediate_size,
        "llama.attention.head_count": c.num_attention_heads,
        "llama.attention.head_count_kv": c.num_key_value_heads,
        "llama.rope.dimension_count": c.head_dim,
        "llama.rope.freq_base": float(c.rope_theta),
        "llama.attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
        "llama.vocab_size": c.vocab_size,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
        "tokenizer.chat_template": CHAT_TEMPLATE,
        **(metadata or {}),  # a hostile file's overrides (None: left out)
    }
    writer = gguf.GGUFWriter(str(path), values.pop("general.architecture", "llama"))
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_token_list(tokens)
    writer.add_token_merges([])
    writer.add_token_types([1] * (len(tokens) - 1) + [3])  # the last: control
    for name, array in llama_tensors(model).items():
        if name in drop:
            continue
        if name.endswith("q_proj.weight"):
            array = permute(array, c.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = permute(array, c.num_key_value_heads)
        writer.add_tensor(hf_to_gguf[name], np.ascontiguousarray(array, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
