"""Subword tokenization from a checkpoint's `tokenizer.json`, for export and the device.

Hugging Face's `tokenizers` library reads the file (the tokenizer the
checkpoint was trained with: normaliser, pre-tokeniser, its model, WordPiece
for BERT, byte-level BPE for RoBERTa, Unigram for XLM-R, and the special
tokens around a sentence, `[CLS] ... [SEP]` or `<s> ... </s>`), so the ids
are those transformers would give. Sentences are truncated to `max_length`
ids (the closing special token kept last) and padded with the model's pad id
(`pad_id`: BERT's [PAD] is 0, RoBERTa's <pad> is 1), which the model masks.

    pieces = Subwords.load(path, max_length=128)          # pad_id=0
    text = "The animal didn't cross the street."
    ids, lengths = pieces.encode([text])
    shown, joined = pieces.typed(text, ids[0][: lengths[0]])  # as typed: "The" "didn" "'" "t"
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re

import numpy as np

from .errors import UsageError, one_line

MAX_TOKENIZER_BYTES = 32 * 1024 * 1024
MAX_TEXT_CHARS = 100_000
PAD_NAME = re.compile(r"[\[<]\|?pad\|?[\]>]", re.IGNORECASE)  # [PAD], <pad>, <|pad|>


def _library():
    try:
        import tokenizers
    except ImportError:
        raise UsageError(
            "needs Hugging Face's tokenizers library; pip install tokenizers "
            "(edge_demo/requirements.txt)",
            "tokenizer.json",
        ) from None
    return tokenizers


def parse_tokenizer(data: bytes, where: str | os.PathLike):
    """A `tokenizers.Tokenizer` from tokenizer.json's bytes (bounded); a UsageError
    naming `where` for a file the library cannot read."""
    if len(data) > MAX_TOKENIZER_BYTES:
        raise UsageError(f"is {len(data)} bytes; at most {MAX_TOKENIZER_BYTES}", where)
    tokenizers = _library()
    try:
        return tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # the library raises plain Exception for a bad file
        raise UsageError(f"not a tokenizers JSON file ({one_line(error)})", where) from None


def _check_texts(texts) -> None:
    for text in texts:
        if not isinstance(text, str):
            raise UsageError(f"expected text, got {type(text).__name__}", "--text")
        if len(text) > MAX_TEXT_CHARS:
            raise UsageError(
                f"a sentence of {len(text)} characters; at most {MAX_TEXT_CHARS}", "--text"
            )


@dataclasses.dataclass
class Subwords:
    """A `tokenizers.Tokenizer` with the model's padding id and a length limit."""

    tokenizer: object
    max_length: int
    where: str = "tokenizer.json"
    pad_id: int = 0

    @classmethod
    def from_bytes(
        cls, data: bytes, max_length: int, where: str | os.PathLike, pad_id: int = 0
    ) -> Subwords:
        """Read a tokenizer.json; its token `pad_id` must be a special token (a padding)."""
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise UsageError(f"max_length must be an integer >= 2, got {max_length!r}", where)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
            raise UsageError(f"pad_id must be an integer >= 0, got {pad_id!r}", where)
        tokenizer = parse_tokenizer(data, where)
        # The token the model masks must be a padding: named so ([PAD], <pad>) or
        # the file's own padding token, never a word piece or <s>, which text gives.
        padding = tokenizer.padding
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length)
        found = tokenizer.id_to_token(pad_id)
        own = padding is not None and padding.get("pad_id") == pad_id
        if found is None or not (own or PAD_NAME.fullmatch(found)):
            found = "no token" if found is None else repr(found)
            raise UsageError(
                f"pad id {pad_id} is {found}, not a padding token ([PAD], <pad>); the model "
                f"masks id {pad_id}",
                where,
            )
        return cls(tokenizer, max_length, str(where), pad_id)

    @classmethod
    def load(cls, path: str | os.PathLike, max_length: int, pad_id: int = 0) -> Subwords:
        path = pathlib.Path(path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise UsageError(
                f"cannot read it ({error.strerror or one_line(error)})", path
            ) from None
        return cls.from_bytes(data, max_length, path, pad_id)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, texts: list[str], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids (N, T) int32 padded with `pad_id`, lengths (N,)); T = `length` or the longest."""
        _check_texts(texts)
        encodings = self.tokenizer.encode_batch(list(texts)) if texts else []
        return self._padded(encodings, length)

    def encode_pairs(
        self, pairs: list[tuple[str, str]], length: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """A cross-encoder's input: each (query, passage) as the checkpoint's tokenizer joins
        them (`[CLS] q [SEP] p [SEP]`, `<s> q </s></s> p </s>`), truncated longest first
        to `max_length`; (ids (N, T) padded with `pad_id`, lengths (N,))."""
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise UsageError("expected (query, passage) pairs", "--pair")
            _check_texts(pair)
        encodings = self.tokenizer.encode_batch([tuple(p) for p in pairs]) if pairs else []
        return self._padded(encodings, length, "a pair")

    def _padded(
        self, encodings, length: int | None, what: str = "a sentence"
    ) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.array([len(e.ids) for e in encodings], np.int64)
        width = int(length if length is not None else (lengths.max() if len(lengths) else 1))
        if length is not None and len(lengths) and lengths.max() > length:
            raise UsageError(
                f"{what} has {lengths.max()} word pieces; the array holds {length}", "--text"
            )
        ids = np.full((len(encodings), width), self.pad_id, np.int32)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
        return ids, lengths

    def pieces(self, text: str) -> tuple[list[str], list[tuple[int, int]]]:
        """The word pieces of one sentence and each one's (start, end) in `text`."""
        encoding = self.tokenizer.encode(text)
        return list(encoding.tokens), [tuple(o) for o in encoding.offsets]

    def typed(self, text: str, ids, pair: str | None = None) -> tuple[list[str], list[bool]] | None:
        """The word pieces of `text` as typed: (the text each covers, joined flags).

        For the head view. Special tokens ([CLS], [SEP], [UNK]) keep their
        names; a piece is joined when it starts where the piece before it
        ended (no space between: "didn" "'" "t", "un" "##believ" "##able").
        None when `text` does not tokenize to `ids` (the input the model
        ran): then show the raw pieces.
        """
        encoding = (
            self.tokenizer.encode(text) if pair is None else self.tokenizer.encode(text, pair)
        )
        if [int(i) for i in encoding.ids] != [int(i) for i in ids]:
            return None
        sources = (text, "" if pair is None else pair)
        unknown = getattr(self.tokenizer.model, "unk_token", "[UNK]")
        shown, joined, end = [], [], None
        for token, (start, stop), special, sequence in zip(
            encoding.tokens, encoding.offsets, encoding.special_tokens_mask, encoding.sequence_ids
        ):
            if special or token == unknown or stop <= start or sequence is None:
                shown.append(token)
                joined.append(False)
                end = None
            else:
                shown.append(sources[sequence][start:stop])
                joined.append(end == start)
                end = stop
        return shown, joined
