"""A Llama-architecture language model built from the package's layers.

    h_0 = E[ids]                                       token embedding
    a_l = h_{l-1} + Attention(RMSNorm(h_{l-1}))        causal, GQA, RoPE (attention.py)
    h_l = a_l + SwiGLU(RMSNorm(a_l))                   layers.py
    logits = RMSNorm(h_L) E^T                          tied embeddings (or an lm_head)

SmolLM2, Llama 2, Llama 3.0 and TinyLlama share this shape; the config says
which sizes. `Decoder(ids)` is a forward pass over whole sequences,
`Decoder.step(ids, caches, index)` one step against the KV caches;
generate.py runs the steps.
"""

from __future__ import annotations

import dataclasses
import json

import keras
from keras import ops

from bundle_contract.errors import UsageError

from .attention import CausalSelfAttention
from .layers import RMSNorm, SwiGLU


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The sizes of a Llama-architecture model (Hugging Face config.json's names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def validate(self) -> None:
        """ValueError naming the first size that cannot build the model."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary positions, got {self.head_dim}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(
                f"rms_norm_eps and rope_theta must be positive, got "
                f"{self.rms_norm_eps!r} and {self.rope_theta!r}"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_llama_config(self) -> dict:
        """transformers' config.json for these sizes (read_llama_config reads it back)."""
        return {
            "architectures": list(LLAMA_ARCHITECTURES),
            "model_type": "llama",
            **self.to_dict(),
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
        }

    @classmethod
    def from_dict(cls, data: dict) -> DecoderConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


LLAMA_ARCHITECTURES = ("LlamaForCausalLM",)


def read_llama_config(path) -> DecoderConfig:
    """A transformers Llama config.json as a DecoderConfig; UsageError (one line,
    naming the file) for another architecture or a setting we do not build."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read it as JSON ({error})", path) from None
    if not isinstance(data, dict):
        raise UsageError("is not a JSON object", path)
    model_type = data.get("model_type")
    if model_type != "llama":
        raise UsageError(f"model_type {model_type!r} is not a Llama decoder ('llama')", path)
    # transformers 5 writes {"rope_theta", "rope_type"} as rope_parameters; 4.x wrote
    # rope_theta and rope_scaling (None: the default rotation)
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise UsageError(f"rope_parameters {rope!r} is not a JSON object", path)
    unsupported = {
        "hidden_act": (data.get("hidden_act", "silu"), "silu"),
        "attention_bias": (data.get("attention_bias", False), False),
        "mlp_bias": (data.get("mlp_bias", False), False),
        "rope_type": (rope.get("rope_type", rope.get("type", "default")), "default"),
    }
    for name, (value, expected) in unsupported.items():
        if value != expected:
            raise UsageError(f"{name} {value!r} is not built here (expected {expected!r})", path)
    heads = data.get("num_attention_heads")
    hidden = data.get("hidden_size")
    head_dim = data.get("head_dim") or (
        hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
    )
    eos = data.get("eos_token_id")
    config = DecoderConfig(
        vocab_size=data.get("vocab_size"),
        hidden_size=hidden,
        intermediate_size=data.get("intermediate_size"),
        num_hidden_layers=data.get("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=data.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=_number(data.get("rms_norm_eps", 1e-6), path),
        rope_theta=_number(rope.get("rope_theta", data.get("rope_theta", 10000.0)), path),
        max_position_embeddings=data.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        bos_token_id=data.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) and eos else eos,
    )
    try:
        config.validate()
    except ValueError as error:
        raise UsageError(str(error), path) from None
    return config


def _number(value, path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{value!r} is not a number where one is expected", path)
    return float(value)


@keras.saving.register_keras_serializable(package="keras_mha")
class DecoderBlock(keras.layers.Layer):
    """a = x + Attention(RMSNorm(x)); out = a + SwiGLU(RMSNorm(a))."""

    def __init__(self, config: dict, implementation: str = "fused", **kwargs):
        super().__init__(**kwargs)
        self.config = dict(config)
        self.implementation = implementation
        c = DecoderConfig.from_dict(config)
        self.attention_norm = RMSNorm(c.rms_norm_eps, name="attention_norm")
        self.attention = CausalSelfAttention(
            num_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            key_dim=c.head_dim,
            use_bias=False,
            rope_base=c.rope_theta,
            implementation=implementation,
            name="attention",
        )
        self.ffn_norm = RMSNorm(c.rms_norm_eps, name="ffn_norm")
        self.ffn = SwiGLU(c.intermediate_size, name="ffn")

    def build(self, input_shape):
        self.attention_norm.build(input_shape)
        self.attention.build(input_shape)
        self.ffn_norm.build(input_shape)
        self.ffn.build(input_shape)
        self.built = True

    def call(self, x, cache=None, cache_index=0, return_attention_scores=False, head_mask=None):
        out = self.attention(
            self.attention_norm(x),
            cache=cache,
            cache_index=cache_index,
            return_attention_scores=return_attention_scores,
            head_mask=head_mask,
        )
        out = out if isinstance(out, tuple) else (out,)
        a = x + out[0]
        return (a + self.ffn(self.ffn_norm(a)),) + tuple(out[1:])

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config,
            "implementation": self.implementation,
        }


@keras.saving.register_keras_serializable(package="keras_mha")
class Decoder(keras.Model):
    """The language model: token ids `(B, T)` to next-token logits `(B, T, vocab)`.

    `model(ids)`: the logits of every position (a prompt's forward pass).
    `model.step(ids, caches, index)`: the tokens at positions index .. index+T-1
    against the caches (`empty_caches`); returns (logits, caches).
    """

    def __init__(self, config: dict, implementation: str = "fused", **kwargs):
        super().__init__(**kwargs)
        self.decoder_config = DecoderConfig.from_dict(config)
        self.decoder_config.validate()
        self.implementation = implementation
        c = self.decoder_config
        self.embedding = keras.layers.Embedding(c.vocab_size, c.hidden_size, name="embedding")
        self.blocks = [
            DecoderBlock(c.to_dict(), implementation, name=f"block_{i}")
            for i in range(c.num_hidden_layers)
        ]
        self.final_norm = RMSNorm(c.rms_norm_eps, name="final_norm")
        self.lm_head = None
        if not c.tie_word_embeddings:
            self.lm_head = keras.layers.Dense(c.vocab_size, use_bias=False, name="lm_head")
        self.build((None, None))

    def build(self, input_shape):
        c = self.decoder_config
        self.embedding.build(input_shape)
        hidden = (None, None, c.hidden_size)
        for block in self.blocks:
            block.build(hidden)
        self.final_norm.build(hidden)
        if self.lm_head is not None:
            self.lm_head.build(hidden)
        self.built = True

    def _logits(self, h):
        h = self.final_norm(h)
        if self.lm_head is not None:
            return self.lm_head(h)
        return ops.matmul(h, ops.transpose(self.embedding.embeddings))  # tied: h E^T

    def call(self, ids, return_attention_scores=False, head_mask=None):
        """`head_mask`: None, or one multiplier per query head of each block
        `(L, h)` (0 silences a head: keras_mha/decoder/heads.py)."""
        h = self.embedding(ids)
        scores = []
        for i, block in enumerate(self.blocks):
            mask = None if head_mask is None else head_mask[i]
            out = block(h, return_attention_scores=return_attention_scores, head_mask=mask)
            h = out[0]
            scores.extend(out[1:])
        logits = self._logits(h)
        return (logits, scores) if return_attention_scores else logits

    def empty_caches(self, batch_size: int, length: int) -> list:
        """One (keys, values) pair of zeros per block, for `length` positions."""
        return [b.attention.empty_cache(batch_size, length) for b in self.blocks]

    def step(self, ids, caches, index):
        """Positions index .. index + T - 1 against the caches: (logits, caches).
        UsageError if they do not fit the caches (a backend would clamp the write)."""
        length, count = int(caches[0][0].shape[1]), int(ids.shape[1])
        if isinstance(index, int) and not 0 <= index <= length - count:  # traced: the caller's
            raise UsageError(
                f"positions {index} to {index + count - 1} do not fit a cache of {length}",
                "cache_index",
            )
        h = self.embedding(ids)
        updated = []
        for block, cache in zip(self.blocks, caches):
            h, cache = block(h, cache=cache, cache_index=index)
            updated.append(cache)
        return self._logits(h), updated

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.decoder_config.to_dict(),
            "implementation": self.implementation,
        }
