"""`load(...)`: a checkpoint as an `Encoder` (Keras model + tokenizer), `encode(texts)`."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from bundle_contract.errors import UsageError
from bundle_contract.subwords import Subwords
from keras_mha.pretrained.bert import build_encoder, load_weights
from keras_mha.pretrained.checkpoint import Checkpoint, resolve
from keras_mha.pretrained.config import BertConfig

DEFAULT_MAX_LENGTH = 128


@dataclasses.dataclass
class Encoder:
    """A sentence encoder: `model` maps ids (B, T) to unit vectors (B, d)."""

    model: object  # keras.Model, built by bert.build_encoder
    config: BertConfig
    tokenizer: Subwords
    checkpoint: Checkpoint | None = None

    @property
    def max_length(self) -> int:
        return self.tokenizer.max_length

    def tokenize(self, texts: list[str], length: int | None = None) -> np.ndarray:
        """Token ids (N, T) int32, padded (pad_token_id) to `length` or to the longest sentence."""
        return self.tokenizer.encode(list(texts), length)[0]

    def tokenize_pairs(self, pairs: list[tuple[str, str]], length: int | None = None) -> np.ndarray:
        """A cross-encoder's input: (query, passage) pairs as token ids (N, T) int32."""
        return self.tokenizer.encode_pairs(list(pairs), length)[0]

    def score(self, pairs: list[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
        """A cross-encoder's (N, 1) float32 scores of (query, passage) pairs."""
        pairs = list(pairs)
        out = [
            self.embed_ids(self.tokenize_pairs(pairs[i : i + batch_size]), batch_size)
            for i in range(0, len(pairs), batch_size)
        ]
        return np.concatenate(out) if out else np.zeros((0, 1), np.float32)

    def embed_ids(self, ids: np.ndarray, batch_size: int = 32) -> np.ndarray:
        """The model's outputs for token ids (N, T): (N, d) float32 unit vectors (an
        encoder), (N, C) probabilities (a classifier) or (N, 1) scores (a cross-encoder)."""
        from keras import ops

        ids = np.asarray(ids, np.int32)
        out = [
            ops.convert_to_numpy(self.model(ids[i : i + batch_size], training=False))
            for i in range(0, len(ids), batch_size)
        ]
        return np.concatenate(out) if out else np.zeros((0, self.config.output_width), np.float32)

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """(N, d) float32, L2-normalised as sentence-transformers does.

        Each batch is padded to its own longest sentence (padding is masked,
        so the vectors do not depend on it)."""
        texts = list(texts)
        out = [
            self.embed_ids(self.tokenize(texts[i : i + batch_size]), batch_size)
            for i in range(0, len(texts), batch_size)
        ]
        return np.concatenate(out) if out else np.zeros((0, self.config.hidden_size), np.float32)

    def attention(self, ids: np.ndarray) -> list[np.ndarray]:
        """Every layer's attention weights for ids (B, T): a list of (B, h, T, T)."""
        from keras import ops

        from keras_mha.pretrained.bert import encoder_forward

        weights = encoder_forward(self.model, np.asarray(ids, np.int32), return_attention=True)[1]
        return [ops.convert_to_numpy(a) for a in weights]


def load_model(
    source: str | pathlib.Path = "all-MiniLM-L6-v2", max_length: int = DEFAULT_MAX_LENGTH
):
    """`keras_mha.pretrained.load`: an encoder (`load`) or, for a language model
    (SmolLM2-135M-Instruct, a .gguf file, a folder whose config.json names a
    Llama decoder), a `keras_mha.decoder.LanguageModel`
    (`.generate(prompt, max_new_tokens)`; `max_length` is the encoder's)."""
    from keras_mha.decoder import is_language_model

    if is_language_model(source):
        from keras_mha import decoder

        return decoder.load(source)
    return load(source, max_length)


def load(
    source: str | pathlib.Path = "all-MiniLM-L6-v2", max_length: int = DEFAULT_MAX_LENGTH
) -> Encoder:
    """A pretrained encoder from a known name or a checkpoint directory (never downloaded).

    Raises `bundle_contract.errors.UsageError` (a ValueError), one line, for a
    missing file, a checksum mismatch or a configuration the encoder cannot
    honour.
    """
    checkpoint = resolve(str(source))
    config = checkpoint.config
    if max_length > config.max_length:
        offset = f" less the first position {config.position_offset}"
        raise UsageError(
            f"{max_length} exceeds the checkpoint's max_position_embeddings "
            f"{config.max_positions}" + (offset if config.position_offset else ""),
            "--max-length",
        )
    tokenizer = Subwords.load(checkpoint.tokenizer_file, max_length, config.pad_token_id)
    if tokenizer.vocab_size > checkpoint.config.vocab_size:
        raise UsageError(
            f"{tokenizer.vocab_size} tokens; the model embeds {checkpoint.config.vocab_size}",
            checkpoint.tokenizer_file,
        )
    model = build_encoder(checkpoint.config)
    load_weights(model, checkpoint.config, checkpoint.tensors())
    return Encoder(model, checkpoint.config, tokenizer, checkpoint)
