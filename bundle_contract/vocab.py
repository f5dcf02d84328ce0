"""The vocabulary, `vocab.json`: one class for training, export and the device.

Standard library and numpy only. Tokenization needs nothing but the file:

    words = re.findall(token_pattern, text.lower())    # lower() if lowercase
    ids   = [index.get(w, unk_id) for w in words][:max_length]
    ids  += [pad_id] * (max_length - len(ids))

`Vocab(...)` refuses an inconsistent vocabulary (ValueError); `from_json` and
`load` refuse a malformed file with a `UsageError` naming it, so training
cannot write, and export cannot bundle, a vocabulary the device refuses.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import warnings

import numpy as np

from .errors import UsageError, safe
from .fields import parse_json
from .files import write_json_atomic

FIELDS = ("tokens", "pad_id", "unk_id", "max_length", "lowercase", "token_pattern")
# Words, digits and apostrophes ("didn't" is one token); punctuation is dropped.
TOKEN_PATTERN = r"[a-z0-9']+"
MAX_VOCAB_BYTES = 16 * 1024 * 1024
MAX_TOKENS = 1_000_000
MAX_TOKEN_CHARS = 200
MAX_LENGTH = 4096  # ids per sentence
MAX_TEXT_CHARS = 100_000  # of one sentence given to `tokenize`
# The token patterns the device runs. A bundle's regex runs on the device, so
# an arbitrary one could backtrack for ever (`(a+)+b`). Accepted: one
# character class repeated, `[...]+`, optionally in one group and after one
# optional literal character: `[a-z0-9']+`, `[A-Za-z]+`, `#?([a-z]+)`. Such a
# pattern matches in linear time (nothing to backtrack into).
_CLASS = r"\[\^?(?:\\[\\\]\-\^dwsDWS'.]|[^\\\[\]])+\]\+"
SAFE_PATTERN = re.compile(
    rf"^(?:(?:\\[^\sA-Za-z0-9]|[^\\\[\]()?*+{{}}|.^$])\?)?(?:{_CLASS}|\({_CLASS}\))$"
)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One sentence as the model takes it, and what the tokenizer saw."""

    ids: np.ndarray  # (max_length,) int32
    words: tuple[str, ...]  # every token found, before truncation
    unknown: tuple[str, ...]  # tokens not in the vocabulary (-> unk_id)
    truncated: bool


@dataclasses.dataclass(frozen=True)
class Vocab:
    """A word-level vocabulary (docs/artifacts.md, `vocab.json`).

    Args:
        tokens: every token, index = id; distinct strings, at least two
            (padding and unknown).
        max_length: ids per sentence (the model's sequence length), >= 1.
        pad_id: the padding id, a token index.
        unk_id: the id of words not in `tokens`; a token index other than `pad_id`.
        lowercase: lowercase the text before matching.
        token_pattern: a Python regex with at most one group; `re.findall`
            of it gives the words.

    Raises:
        UsageError (a ValueError): an argument is inconsistent.
    """

    tokens: tuple[str, ...]
    max_length: int
    pad_id: int = 0
    unk_id: int = 1
    lowercase: bool = True
    token_pattern: str = TOKEN_PATTERN

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, (list, tuple)) or not all(
            isinstance(t, str) for t in self.tokens
        ):
            raise UsageError("field 'tokens' must be a list of strings")
        object.__setattr__(self, "tokens", tuple(self.tokens))
        if len(self.tokens) > MAX_TOKENS:
            raise UsageError(f"field 'tokens' has {len(self.tokens)} tokens (at most {MAX_TOKENS})")
        for i, token in enumerate(self.tokens):
            if len(token) > MAX_TOKEN_CHARS or safe(token) != token:
                raise UsageError(
                    f"field 'tokens' item {i} ({safe(token, 40)!r}) must be at most "
                    f"{MAX_TOKEN_CHARS} printable characters"
                )
        if len(self.tokens) < 2:
            raise UsageError(
                f"field 'tokens' has {len(self.tokens)} token(s); need padding, unknown and words"
            )
        index: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            if token in index:
                raise UsageError(f"token {safe(token, 60)!r} appears twice in 'tokens'")
            index[token] = i
        for name in ("pad_id", "unk_id", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise UsageError(f"field {name!r} must be an integer, got {safe(repr(value), 60)}")
            object.__setattr__(self, name, int(value))
        for name in ("pad_id", "unk_id"):
            value = getattr(self, name)
            if not 0 <= value < len(self.tokens):
                raise UsageError(
                    f"field {name!r}={value} is not a token index (0..{len(self.tokens) - 1})"
                )
        if self.pad_id == self.unk_id:
            raise UsageError("pad_id and unk_id must differ")
        if not 0 < self.max_length <= MAX_LENGTH:
            raise UsageError(
                f"field 'max_length' must be from 1 to {MAX_LENGTH}, got {self.max_length}"
            )
        if not isinstance(self.lowercase, bool):
            raise UsageError(
                f"field 'lowercase' must be true or false, got {safe(repr(self.lowercase), 60)}"
            )
        if not isinstance(self.token_pattern, str) or not self.token_pattern:
            raise UsageError("field 'token_pattern' must be a non-empty string")
        if len(self.token_pattern) > 200:
            raise UsageError(
                f"field 'token_pattern' is {len(self.token_pattern)} characters (at most 200)"
            )
        try:
            with warnings.catch_warnings():  # "possible nested set": not printed, refused
                warnings.simplefilter("error")
                regex = re.compile(self.token_pattern)
        except (re.error, RecursionError, OverflowError, Warning) as exc:
            raise UsageError(
                f"field 'token_pattern' is not a valid regex: {safe(exc, 100)}"
            ) from None
        if regex.groups > 1:
            raise UsageError("field 'token_pattern' may have at most one group")
        if not SAFE_PATTERN.match(self.token_pattern):
            raise UsageError(
                f"field 'token_pattern' {safe(self.token_pattern, 60)!r} is not a pattern "
                "this app runs: expected one character class repeated, e.g. "
                f"{TOKEN_PATTERN!r} or '#?([a-z]+)' (a bundle's regex could run for ever)"
            )
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_regex", regex)

    def __len__(self) -> int:
        return len(self.tokens)

    def tokenize(self, text: str) -> list[str]:
        """The words of `text`, as `re.findall(token_pattern, text)` finds them.

        Raises UsageError for a text longer than `MAX_TEXT_CHARS`.
        """
        if len(text) > MAX_TEXT_CHARS:
            raise UsageError(f"text of {len(text)} characters (at most {MAX_TEXT_CHARS})")
        return self._regex.findall(text.lower() if self.lowercase else text)

    def _ids(self, words: list[str]) -> list[int]:
        ids = [self._index.get(w, self.unk_id) for w in words][: self.max_length]
        return ids + [self.pad_id] * (self.max_length - len(ids))

    def encode(self, texts: str | list[str] | tuple[str, ...]) -> np.ndarray:
        """Token ids, int32 `(N, max_length)`, for a string (N = 1) or a list of them."""
        if isinstance(texts, str):
            texts = [texts]
        rows = [self._ids(self.tokenize(text)) for text in texts]
        return np.asarray(rows, np.int32).reshape(len(rows), self.max_length)

    def analyze(self, text: str) -> Encoded:
        """One sentence's ids `(max_length,)` and what the tokenizer saw (unknown, truncated)."""
        words = self.tokenize(text)
        unknown = tuple(w for w in words if w not in self._index)
        return Encoded(
            np.asarray(self._ids(words), np.int32),
            tuple(words),
            unknown,
            len(words) > self.max_length,
        )

    def decode(self, ids) -> list[str]:
        """The tokens of one row of ids, padding left out."""
        return [self.tokens[int(i)] for i in ids if int(i) != self.pad_id]

    def to_json(self) -> dict:
        """The `vocab.json` object."""
        return {
            "tokens": list(self.tokens),
            "pad_id": self.pad_id,
            "unk_id": self.unk_id,
            "max_length": self.max_length,
            "lowercase": self.lowercase,
            "token_pattern": self.token_pattern,
        }

    @classmethod
    def from_json(cls, data: object, where: str | os.PathLike = "vocab.json") -> Vocab:
        """A decoded `vocab.json`; every field is required. Raises UsageError naming `where`."""
        if not isinstance(data, dict):
            raise UsageError(f"expected a JSON object, got {type(data).__name__}", where)
        missing = [f for f in FIELDS if f not in data]
        if missing:
            raise UsageError(f"missing field(s): {', '.join(missing)}", where)
        try:
            return cls(**{f: data[f] for f in FIELDS})
        except UsageError as exc:
            raise UsageError(exc.problem, where) from None

    def save(self, path: str | os.PathLike) -> None:
        """Write `vocab.json` atomically (a temporary file, then a rename)."""
        write_json_atomic(path, self.to_json(), indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        """Read and validate a `vocab.json` file."""
        path = pathlib.Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError("not found", path) from None
        except UnicodeDecodeError:
            raise UsageError("not valid JSON (not UTF-8 text)", path) from None
        except OSError as exc:
            raise UsageError(f"cannot read it ({exc.strerror})", path) from None
        return cls.parse(text, path)

    @classmethod
    def parse(cls, text: str | bytes, where: str | os.PathLike = "vocab.json") -> Vocab:
        """A `vocab.json` file's text."""
        return cls.from_json(parse_json(text, where), where)
