"""The one Vocab (bundle_contract.vocab): tokenizer, batches, strict vocab.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bundle_contract.errors import UsageError
from bundle_contract.vocab import FIELDS, Vocab

VALID = {
    "tokens": ["<pad>", "<unk>", "the", "cat", "sat", "don't"],
    "pad_id": 0,
    "unk_id": 1,
    "max_length": 4,
    "lowercase": True,
    "token_pattern": "[a-z']+",
}


def test_tokenizer_lowercases_maps_unknown_and_pads():
    vocab = Vocab.from_json(VALID)
    encoded = vocab.analyze("The CAT, quietly sat!")
    assert encoded.words == ("the", "cat", "quietly", "sat")
    assert encoded.ids.tolist() == [2, 3, 1, 4]
    assert encoded.unknown == ("quietly",) and not encoded.truncated
    assert vocab.analyze("cat").ids.tolist() == [3, 0, 0, 0]
    assert vocab.analyze("don't").ids.tolist() == [5, 0, 0, 0]


def test_encode_is_a_batch_and_agrees_with_analyze():
    vocab = Vocab.from_json(VALID)
    texts = ["the cat sat the cat", "", "sat"]
    batch = vocab.encode(texts)
    assert batch.dtype == np.int32 and batch.shape == (3, 4)
    assert [vocab.analyze(t).ids.tolist() for t in texts] == batch.tolist()
    assert vocab.encode("cat").shape == (1, 4)
    assert vocab.analyze(texts[0]).truncated and batch[0].tolist() == [2, 3, 4, 2]


def test_decode_skips_padding():
    vocab = Vocab.from_json(VALID)
    assert vocab.decode(np.array([3, 4, 0, 0])) == ["cat", "sat"]


def test_case_and_groups_in_the_pattern():
    cased = Vocab.from_json({**VALID, "token_pattern": "[A-Za-z]+", "lowercase": False})
    assert cased.analyze("The cat").ids.tolist() == [1, 3, 0, 0]
    grouped = Vocab.from_json({**VALID, "token_pattern": r"#?([a-z]+)"})
    assert grouped.tokenize("#the cat") == ["the", "cat"]


def test_save_load_round_trip_is_atomic_and_equal(tmp_path):
    vocab = Vocab(tokens=["<pad>", "<unk>", "a"], max_length=3)
    path = tmp_path / "vocab.json"
    vocab.save(path)
    assert set(json.loads(path.read_text())) == set(FIELDS)
    assert Vocab.load(path) == vocab and isinstance(Vocab.load(path).tokens, tuple)
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.json"]


@pytest.mark.parametrize(
    "change,message",
    [
        pytest.param({"tokens": None}, "'tokens' must be a list of strings", id="tokens-null"),
        pytest.param({"tokens": ["<pad>"]}, "has 1 token(s)", id="one-token"),
        pytest.param({"tokens": ["<pad>", "<unk>", "cat", "cat"]}, "appears twice", id="duplicate"),
        pytest.param({"tokens": ["<pad>", 3]}, "list of strings", id="token-not-string"),
        pytest.param({"pad_id": 9}, "'pad_id'=9 is not a token index", id="pad-id-outside"),
        pytest.param({"unk_id": 0}, "pad_id and unk_id must differ", id="unk-is-pad"),
        pytest.param({"max_length": 0}, "'max_length' must be from 1 to", id="max-length-0"),
        pytest.param({"max_length": "4"}, "'max_length' must be an integer", id="max-length-str"),
        pytest.param({"lowercase": "yes"}, "'lowercase' must be true or false", id="lowercase-str"),
        pytest.param({"token_pattern": "[a-z"}, "not a valid regex", id="bad-regex"),
        pytest.param({"token_pattern": "(a)(b)"}, "at most one group", id="two-groups"),
    ],
)
def test_from_json_refuses(change, message):
    with pytest.raises(UsageError) as info:
        Vocab.from_json({**VALID, **change}, "vocab.json")
    assert message in str(info.value) and str(info.value).startswith("vocab.json: ")


@pytest.mark.parametrize("field", FIELDS)
def test_from_json_names_a_missing_field(field):
    data = {k: v for k, v in VALID.items() if k != field}
    with pytest.raises(UsageError, match=f"missing field\\(s\\): {field}"):
        Vocab.from_json(data, "vocab.json")


def test_the_constructor_refuses_too(tmp_path):
    with pytest.raises(ValueError, match="pad_id and unk_id must differ"):
        Vocab(tokens=["a", "b"], max_length=2, pad_id=1, unk_id=1)
    (tmp_path / "vocab.json").write_text("[1,")
    with pytest.raises(UsageError, match="vocab.json: not valid JSON"):
        Vocab.load(tmp_path / "vocab.json")
