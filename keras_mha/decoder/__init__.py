"""`keras_mha.decoder`: a Llama-architecture language model on the package's layers.

    model = keras_mha.decoder.load("path/to/llama-folder")
    model.generate("The animal didn't cross the street because", max_new_tokens=16)

    layers.py     RMSNorm, SwiGLU, the rotary position embedding (RoPE)
    attention.py  CausalSelfAttention: the lesson's heads, grouped, rotated, cached
    model.py      DecoderConfig, DecoderBlock, Decoder (config.json's sizes)
    weights.py    transformers' tensor names into the layers
    generate.py   greedy decoding over a KV cache

A folder is what transformers saves for a LlamaForCausalLM: config.json,
model.safetensors (or its shards with model.safetensors.index.json) and the
tokenizer's tokenizer.json (Hugging Face `tokenizers` reads it).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from bundle_contract.errors import UsageError

__all__ = ["LanguageModel", "load"]


@dataclasses.dataclass
class LanguageModel:
    """A decoder, its tokenizer and config: `generate` text, `logits` of ids."""

    model: object  # Decoder
    tokenizer: object  # tokenizers.Tokenizer
    config: object  # DecoderConfig
    source: str

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def logits(self, ids, return_attention_scores=False):
        """The next-token logits of every position of `ids` `(B, T)`, float32 numpy
        (and every layer's attention weights `(B, h, T, T)`)."""
        import numpy as np
        from keras import ops

        out = self.model(np.asarray(ids, np.int32), return_attention_scores=return_attention_scores)
        if return_attention_scores:
            logits, scores = out
            return ops.convert_to_numpy(logits), [ops.convert_to_numpy(s) for s in scores]
        return ops.convert_to_numpy(out)

    def generate_ids(self, prompt_ids, max_new_tokens: int = 32):
        from .generate import greedy

        return greedy(self.model, prompt_ids, max_new_tokens, self.config.eos_token_id)

    def generate(self, prompt: str, max_new_tokens: int = 32) -> str:
        """The prompt's greedy continuation, as text."""
        done = self.generate_ids(self.encode(prompt), max_new_tokens)
        return self.decode(done.new_ids)


def _tensors(folder: pathlib.Path) -> dict:
    from keras_mha.pretrained.checkpoint import read_safetensors

    single = folder / "model.safetensors"
    if single.is_file():
        return read_safetensors(single)
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise UsageError("has no model.safetensors (nor model.safetensors.index.json)", folder)
    shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(folder / shard))
    return tensors


def load(source, implementation: str = "fused") -> LanguageModel:
    """A transformers Llama folder as a `LanguageModel` (UsageError, one line, for
    a file missing or a model we do not build)."""
    from tokenizers import Tokenizer

    from .model import Decoder, read_llama_config
    from .weights import load_llama_weights

    folder = pathlib.Path(source)
    if not folder.is_dir():
        raise UsageError(
            "is not a folder with config.json, model.safetensors, tokenizer.json", source
        )
    for name in ("config.json", "tokenizer.json"):
        if not (folder / name).is_file():
            raise UsageError(f"has no {name}", folder)
    config = read_llama_config(folder / "config.json")
    model = Decoder(config.to_dict(), implementation=implementation)
    try:
        load_llama_weights(model, _tensors(folder))
    except ValueError as error:
        raise UsageError(str(error), folder) from None
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return LanguageModel(model, tokenizer, config, str(folder))
