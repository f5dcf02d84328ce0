"""What every task whose inputs are sentences shares: texts.json and tokenizer.json.

A model that reads text through a checkpoint's tokenizer (an imported encoder,
a text classifier, a cross-encoder) runs each input at its own length, and
its bundle holds the eval inputs (texts.json, one sentence per row of eval.npz's
x; a cross-encoder's pairs.json instead, tasks/pair_scoring.py)
and the checkpoint's tokenizer.json (Hugging Face `tokenizers`) with the
longest input (`tokenizer.max_length`) and the id that pads x and that the
model masks (`tokenizer.pad_id`, written only when not 0). The tasks call
these functions from their own `read_files`, `files_json` and `load_files`.
"""

from __future__ import annotations

import pathlib

from ..entries import EvalSpec, FileRef
from ..errors import UsageError
from ..fields import Fields
from ..files import read_inside
from ..lists import MAX_LABELS_BYTES, parse_texts, texts_json
from ..subwords import MAX_TOKENIZER_BYTES, Subwords

MAX_TOKENIZER_LENGTH = 4096
# A text model's eval sentences are long and padded to the longest: 8 of them
# (about 16 MB of attention weights for MiniLM) show its heads on the device.
TEXT_ATTENTION_SAMPLES = 8


def read_tokenizer(fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
    """The manifest's `tokenizer` entry, as `Manifest` fields."""
    entry = fields.obj(data, "tokenizer")
    max_length = fields.integer(
        entry, "max_length", "tokenizer.", minimum=2, maximum=MAX_TOKENIZER_LENGTH
    )
    # the id that pads x and that the model masks: 0 when absent (BERT's [PAD])
    pad_id = 0 if entry.get("pad_id") is None else fields.integer(entry, "pad_id", "tokenizer.")
    x_shape = evaluation.x_shape
    if len(x_shape) != 2 or x_shape[1] > max_length:
        raise fields.fail(
            "eval.x_shape", f"must be [samples, T] with T <= tokenizer.max_length {max_length}"
        )
    return {
        "files": {"tokenizer": FileRef.from_json(fields, data, "tokenizer")},
        "max_length": max_length,
        "pad_id": pad_id,
    }


def read_text_files(fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
    """The manifest's `texts` and `tokenizer` entries, as `Manifest` fields."""
    return with_files(
        read_tokenizer(fields, data, evaluation), texts=FileRef.from_json(fields, data, "texts")
    )


def with_files(read: dict, **files: FileRef) -> dict:
    """`read_files`' answer `read` with more files."""
    return {**read, "files": {**read.get("files", {}), **files}}


def tokenizer_json(manifest) -> dict:
    """The manifest's `tokenizer` entry of a `Manifest`."""
    return {
        "tokenizer": {
            **manifest.file("tokenizer").to_json(),
            "max_length": manifest.max_length,
            **({"pad_id": manifest.pad_id} if manifest.pad_id else {}),
        },
    }


def text_files_json(manifest) -> dict:
    """The manifest's `texts` and `tokenizer` entries of a `Manifest`."""
    return {"texts": manifest.file("texts").to_json(), **tokenizer_json(manifest)}


def load_tokenizer(root: pathlib.Path, manifest, x) -> dict:
    """tokenizer.json of an opened bundle, checked against eval.npz's `x`."""
    ref = manifest.file("tokenizer")
    where = root / ref.file
    data = read_inside(root, ref.file, ref.sha256, max_bytes=MAX_TOKENIZER_BYTES)
    tokenizer = Subwords.from_bytes(data, manifest.max_length, where, manifest.pad_id)
    top = int(x.max())
    if top >= tokenizer.vocab_size:
        raise UsageError(
            f"eval.npz uses token id {top} but the tokenizer has {tokenizer.vocab_size} tokens",
            where,
        )
    return {"tokenizer": tokenizer}


def load_text_files(root: pathlib.Path, manifest, x) -> dict:
    """texts.json and tokenizer.json of an opened bundle, checked against eval.npz's `x`."""
    ref = manifest.file("texts")
    texts = parse_texts(
        read_inside(root, ref.file, ref.sha256, max_bytes=MAX_LABELS_BYTES),
        manifest.eval.samples,
        root / ref.file,
    )
    return {"texts": texts, **load_tokenizer(root, manifest, x)}


class TextInputs:
    """A mixin of the tasks whose eval inputs are sentences: texts.json."""

    inputs_file = "texts.json"

    def inputs_json(self, inputs) -> bytes:
        return texts_json(inputs)

    def parse_inputs(self, data: bytes, samples: int, where) -> tuple:
        return parse_texts(data, samples, where)
