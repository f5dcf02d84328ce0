"""A llama.cpp GGUF file as a Llama folder's parts: config, tensors, tokenizer.

The `gguf` package (llama.cpp's own reader) parses the file and dequantizes
each tensor (Q4_1, Q8_0, ... to float32). What this module adds:

- the config from the `llama.*` metadata (block count, heads, RoPE base, ...);
- transformers' tensor names, and the query and key rows put back in
  Hugging Face's rotary layout: llama.cpp's converter interleaves each head's
  two halves (row j of the first half next to row j of the second) for its
  own RoPE kernel, `reshape(h, 2, d/2, in).swapaxes(1, 2)`; we undo it, as
  transformers does when it loads a GGUF;
- the tokenizer: a byte-level BPE (`tokenizer.ggml.model` "gpt2") from the
  file's tokens and merges, built with Hugging Face `tokenizers`, its control
  tokens (`<|im_start|>`, ...) special;
- the chat template (`tokenizer.chat_template`, Jinja).
"""

from __future__ import annotations

import pathlib

import numpy as np

from bundle_contract.errors import UsageError

from .model import DecoderConfig

# GGUF's names, by weights.NAMES' keys (transformers' names: what weights.py reads)
GGUF_NAMES = {
    "embedding": "token_embd.weight",
    "final_norm": "output_norm.weight",
    "lm_head": "output.weight",
    "attention_norm": "blk.{l}.attn_norm.weight",
    "ffn_norm": "blk.{l}.ffn_norm.weight",
    "query": "blk.{l}.attn_q.weight",
    "key": "blk.{l}.attn_k.weight",
    "value": "blk.{l}.attn_v.weight",
    "output": "blk.{l}.attn_output.weight",
    "gate": "blk.{l}.ffn_gate.weight",
    "up": "blk.{l}.ffn_up.weight",
    "down": "blk.{l}.ffn_down.weight",
}
TOKENIZER_MODELS = ("gpt2",)  # byte-level BPE
CONTROL = 3  # tokenizer.ggml.token_type of a control token


def gguf_to_transformers(layers: int) -> dict[str, str]:
    """Every tensor's GGUF name -> its transformers name, for `layers` blocks."""
    from .weights import NAMES

    rename = {}
    for key, gguf_name in GGUF_NAMES.items():
        for layer in range(layers) if "{l}" in gguf_name else [None]:
            rename[gguf_name.format(l=layer)] = NAMES[key].format(l=layer)
    return rename


def unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order back to Hugging Face's, for `heads` heads
    (the query's h, the key's h_kv): rows (h, d/2, 2) -> (h, 2, d/2)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


class GGUFFile:
    """A GGUF file's metadata, tensors and tokenizer (UsageError, one line, naming
    the file, for one that cannot be read or a model we do not build)."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        try:
            from gguf import GGUFReader
        except ImportError:
            raise UsageError(
                "needs the gguf package (pip install gguf, the llm extra)", self.path
            ) from None
        if not self.path.is_file():
            raise UsageError("no such file", self.path)
        try:
            self.reader = GGUFReader(str(self.path))
            self.fields = {name: field.contents() for name, field in self.reader.fields.items()}
        except Exception as error:  # the reader raises many types on a broken file
            raise UsageError(
                f"cannot read it as GGUF ({type(error).__name__}: {error})", self.path
            ) from None
        architecture = self.fields.get("general.architecture")
        if architecture != "llama":
            raise UsageError(
                f"general.architecture {architecture!r} is not built here (expected 'llama')",
                self.path,
            )
        self.config = self._config()

    def _get(self, key: str, kind=int):
        value = self.fields.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{key} is {value!r}, expected a number", self.path)
        return kind(value)

    def _config(self) -> DecoderConfig:
        heads = self._get("llama.attention.head_count")
        hidden = self._get("llama.embedding_length")
        names = {t.name for t in self.reader.tensors}
        tokens = self.fields.get("tokenizer.ggml.tokens") or []
        vocab = self.fields.get("llama.vocab_size", len(tokens))
        head_dim = self.fields.get("llama.rope.dimension_count") or (
            hidden // heads if heads else 0
        )
        config = DecoderConfig(
            vocab_size=int(vocab) if isinstance(vocab, (int, float)) else vocab,
            hidden_size=hidden,
            intermediate_size=self._get("llama.feed_forward_length"),
            num_hidden_layers=self._get("llama.block_count"),
            num_attention_heads=heads,
            num_key_value_heads=int(self.fields.get("llama.attention.head_count_kv") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(
                np.float32(self._get("llama.attention.layer_norm_rms_epsilon", float))
            ),
            rope_theta=self._get("llama.rope.freq_base", float)
            if "llama.rope.freq_base" in self.fields
            else 10000.0,
            max_position_embeddings=self._get("llama.context_length"),
            tie_word_embeddings="output.weight" not in names,
            bos_token_id=self.fields.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=self.fields.get("tokenizer.ggml.eos_token_id"),
        )
        if "llama.rope.scaling.type" in self.fields:
            raise UsageError(
                f"llama.rope.scaling.type {self.fields['llama.rope.scaling.type']!r} is not built here",
                self.path,
            )
        try:
            config.validate()
        except ValueError as error:
            raise UsageError(str(error), self.path) from None
        return config

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor dequantized to float32 under transformers' names, (out, in)."""
        from gguf.quants import dequantize

        c = self.config
        rename = gguf_to_transformers(c.num_hidden_layers)
        found = {}
        for tensor in self.reader.tensors:
            name = rename.get(tensor.name)
            if name is None:
                continue
            try:
                array = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
            except Exception as error:
                raise UsageError(
                    f"cannot dequantize {tensor.name} ({tensor.tensor_type.name}: {error})",
                    self.path,
                ) from None
            shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the inner axis first
            if array.size != int(np.prod(shape)):
                raise UsageError(f"{tensor.name} holds {array.size} values, not {shape}", self.path)
            array = array.reshape(shape)
            if tensor.name.endswith("attn_q.weight"):
                array = unpermute(array, c.num_attention_heads)
            elif tensor.name.endswith("attn_k.weight"):
                array = unpermute(array, c.num_key_value_heads)
            found[name] = array
        return found

    def tokenizer(self):
        """The file's byte-level BPE as a `tokenizers.Tokenizer`."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        kind = self.fields.get("tokenizer.ggml.model")
        if kind not in TOKENIZER_MODELS:
            raise UsageError(
                f"tokenizer.ggml.model {kind!r} is not built here (expected one of "
                f"{', '.join(TOKENIZER_MODELS)})",
                self.path,
            )
        tokens = list(self.fields.get("tokenizer.ggml.tokens") or [])
        merges = [tuple(m.split(" ", 1)) for m in self.fields.get("tokenizer.ggml.merges") or []]
        types = list(self.fields.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        vocab = {token: i for i, token in enumerate(tokens)}
        if len(vocab) != len(tokens) or len(types) != len(tokens):
            raise UsageError("its tokenizer lists a token twice or misses token types", self.path)
        tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        splits = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if self.fields.get("tokenizer.ggml.pre") == "smollm":  # each digit a word of its own
            splits.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
        tokenizer.decoder = decoders.ByteLevel()
        control = [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types)
            if k == CONTROL
        ]
        tokenizer.add_special_tokens(control)
        return tokenizer

    @property
    def chat_template(self) -> str | None:
        template = self.fields.get("tokenizer.chat_template")
        return template if isinstance(template, str) else None
