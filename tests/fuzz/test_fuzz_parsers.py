"""Property-based fuzzing (hypothesis) of the bundle contract's parsers (issue 21).

Whatever bytes or values a bundle holds, the parsers return or raise a
one-line `UsageError`, never another exception, quickly and within memory:
`parse_json`, `Manifest.from_json` (a valid manifest with hostile values at
any field), `TensorSpec.from_json`, `read_npz` (mutated archives) and
`Vocab.parse`. Bounded for `make test` (`max_examples`); `make fuzz` runs
them longer with HYPOTHESIS_PROFILE=fuzz.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pathlib
import sys

import numpy as np

# A plain import: hypothesis is in setup.cfg's test extra, so its absence is an error.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bundle_contract.arrays import read_npz  # noqa: E402
from bundle_contract.errors import UsageError  # noqa: E402
from bundle_contract.fields import Fields, parse_json  # noqa: E402
from bundle_contract.manifest import Manifest  # noqa: E402
from bundle_contract.tensors import TensorSpec  # noqa: E402
from bundle_contract.vocab import Vocab  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from mutations import HOSTILE_VALUES, json_paths  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from edge_bundle import example_manifest  # noqa: E402

# make test: the same examples on every run (derandomize: a fixed seed per test),
# and no example database, so no failure found elsewhere is replayed here; a
# failure prints the example and hypothesis's reproduce line. make fuzz
# (HYPOTHESIS_PROFILE=fuzz) explores new examples each run and keeps a database.
settings.register_profile(
    "test",
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)
settings.register_profile(
    "fuzz",
    max_examples=20_000,
    deadline=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "test"))

MANIFEST = example_manifest().to_json()
PATHS = json_paths(MANIFEST)
VOCAB = {
    "tokens": ["<pad>", "<unk>", "the", "cat"],
    "pad_id": 0,
    "unk_id": 1,
    "max_length": 4,
    "lowercase": True,
    "token_pattern": "[a-z']+",
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
hostile = st.sampled_from(HOSTILE_VALUES) | json_values


def _one_line(exc: UsageError) -> None:
    text = str(exc)
    assert "\n" not in text and "\x1b" not in text and len(text) < 1400, text


def _set(data, path, value):
    """Set a copy of `value`: hypothesis may hand the same object to two edits, and
    setting an object inside itself would make a structure that contains itself."""
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = copy.deepcopy(value)


@given(st.binary(max_size=400) | st.text(max_size=400))
def test_parse_json_returns_or_refuses_in_one_line(data):
    try:
        parse_json(data, "f.json")
    except UsageError as exc:
        _one_line(exc)


@given(st.lists(st.tuples(st.sampled_from(PATHS), hostile), min_size=1, max_size=3))
def test_manifest_with_hostile_fields(edits):
    data = copy.deepcopy(MANIFEST)
    for path, value in edits:
        try:
            _set(data, path, value)
        except (KeyError, IndexError, TypeError):
            pass
    try:
        Manifest.from_json(json.loads(json.dumps(data)))  # what a file could hold
    except UsageError as exc:
        _one_line(exc)


@given(st.dictionaries(st.sampled_from(["name", "shape", "dtype", "scale", "zero_point"]), hostile))
def test_tensor_spec(entry):
    try:
        spec = TensorSpec.from_json(Fields("manifest.json"), {"input": entry}, "input")
    except UsageError as exc:
        _one_line(exc)
        return
    with np.errstate(all="raise"):  # quantize must not warn, whatever passed
        spec.dequantize(spec.quantize(np.ones(spec.shape, np.float32))) if spec.quantized else None


def _npz_bytes() -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.arange(12, dtype=np.float32).reshape(3, 4), y=np.arange(3))
    return buffer.getvalue()


NPZ = _npz_bytes()


@given(st.lists(st.tuples(st.integers(0, len(NPZ) - 1), st.integers(1, 255)), max_size=6),
       st.integers(0, len(NPZ)))  # fmt: skip
def test_read_npz_on_mutated_archives(flips, cut):
    data = bytearray(NPZ)
    for offset, xor in flips:
        data[offset] ^= xor
    try:
        read_npz(io.BytesIO(bytes(data[: cut or None])), ("x", "y"), "eval.npz", 1 << 16)
    except UsageError as exc:
        _one_line(exc)


@given(st.lists(st.tuples(st.sampled_from(list(VOCAB)), hostile), max_size=3),
       st.text(max_size=60))  # fmt: skip
def test_vocab_with_hostile_fields(edits, text):
    data = dict(VOCAB)
    for key, value in edits:
        data[key] = copy.deepcopy(value)  # as _set: never an object inside itself
    try:
        vocab = Vocab.parse(json.dumps(data), "vocab.json")
    except UsageError as exc:
        _one_line(exc)
        return
    vocab.encode(text)


@given(st.text(alphabet="()[]+*?{}|ab\\^-az0-9'#", max_size=14))
def test_token_patterns_accepted_are_quick(pattern):
    import time

    try:
        vocab = Vocab(("<pad>", "<unk>", "a"), 4, token_pattern=pattern)
    except UsageError as exc:
        _one_line(exc)
        return
    # A hang guard, not a speed limit: an accepted pattern that backtracks
    # catastrophically takes exponential time on 3,000 characters (minutes or
    # more), a linear one a few milliseconds; 5 s sits far from both.
    start = time.perf_counter()
    vocab.tokenize("a" * 3000 + "!")
    assert time.perf_counter() - start < 5.0
