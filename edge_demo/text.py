"""The on-device tokenizer: vocab.json alone, no TensorFlow, no keras_mha.

tokens = re.findall(token_pattern, text.lower())   # lower() if lowercase
ids    = [index.get(t, unk_id) for t in tokens][:max_length]
ids   += [pad_id] * (max_length - len(ids))
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import numpy as np

from .errors import BadInput

VOCAB_FIELDS = ("tokens", "pad_id", "unk_id", "max_length", "lowercase", "token_pattern")


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A sentence as the model takes it, and what the tokenizer saw."""

    ids: np.ndarray  # (max_length,) int32
    words: tuple[str, ...]  # every token found, before truncation
    unknown: tuple[str, ...]  # tokens not in the vocabulary (-> unk_id)
    truncated: bool


@dataclasses.dataclass(frozen=True)
class Vocab:
    """A text bundle's vocabulary (docs/artifacts.md, `vocab.json`)."""

    tokens: tuple[str, ...]
    pad_id: int
    unk_id: int
    max_length: int
    lowercase: bool
    token_pattern: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {t: i for i, t in enumerate(self.tokens)})
        object.__setattr__(self, "_regex", re.compile(self.token_pattern))

    def split(self, text: str) -> list[str]:
        """The words of `text` as the exporter's tokenizer finds them."""
        return self._regex.findall(text.lower() if self.lowercase else text)

    def encode(self, text: str) -> Encoded:
        """Token ids for `text`: unknown words -> unk_id, padded/truncated to max_length."""
        words = self.split(text)
        ids = [self._index.get(w, self.unk_id) for w in words][: self.max_length]
        ids += [self.pad_id] * (self.max_length - len(ids))
        unknown = tuple(w for w in words if w not in self._index)
        return Encoded(
            np.asarray(ids, np.int32), tuple(words), unknown, len(words) > self.max_length
        )

    def decode(self, ids: np.ndarray) -> str:
        """The sentence a row of token ids stands for, padding left out."""
        words = [self.tokens[int(i)] for i in ids if int(i) != self.pad_id]
        return " ".join(words)


def parse_vocab(data: object, where: str | pathlib.Path) -> Vocab:
    """Validate a decoded vocab.json; raise BadInput naming `where` and the problem."""
    if not isinstance(data, dict):
        raise BadInput(where, f"expected a JSON object, got {type(data).__name__}")
    missing = [f for f in VOCAB_FIELDS if f not in data]
    if missing:
        raise BadInput(where, f"missing field(s): {', '.join(missing)}")
    tokens = data["tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise BadInput(where, "field 'tokens' must be a list of strings")
    if len(tokens) < 2:
        raise BadInput(
            where, f"field 'tokens' has {len(tokens)} token(s); need padding, unknown and words"
        )
    seen: set[str] = set()
    for token in tokens:
        if token in seen:
            raise BadInput(where, f"token {token!r} appears twice in 'tokens'")
        seen.add(token)
    ids = {}
    for name in ("pad_id", "unk_id", "max_length"):
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadInput(where, f"field {name!r} must be an integer, got {value!r}")
        ids[name] = value
    for name in ("pad_id", "unk_id"):
        if not 0 <= ids[name] < len(tokens):
            raise BadInput(
                where, f"field {name!r}={ids[name]} is not a token index (0..{len(tokens) - 1})"
            )
    if ids["pad_id"] == ids["unk_id"]:
        raise BadInput(where, "pad_id and unk_id must differ")
    if ids["max_length"] <= 0:
        raise BadInput(where, f"field 'max_length' must be positive, got {ids['max_length']}")
    if not isinstance(data["lowercase"], bool):
        raise BadInput(where, f"field 'lowercase' must be true or false, got {data['lowercase']!r}")
    pattern = data["token_pattern"]
    if not isinstance(pattern, str) or not pattern:
        raise BadInput(where, "field 'token_pattern' must be a non-empty string")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise BadInput(where, f"field 'token_pattern' is not a valid regex: {exc}") from None
    if compiled.groups > 1:
        raise BadInput(where, "field 'token_pattern' may have at most one group")
    return Vocab(
        tuple(tokens),
        ids["pad_id"],
        ids["unk_id"],
        ids["max_length"],
        data["lowercase"],
        pattern,
    )


def load_vocab(path: pathlib.Path) -> Vocab:
    """Read and validate vocab.json."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(path, "not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(path, f"not valid JSON ({exc})") from None
    except OSError as exc:
        raise BadInput(path, f"cannot read it ({exc.strerror})") from None
    return parse_vocab(data, path)
