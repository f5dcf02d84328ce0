"""Datasets: seeded stratified splits, the pronoun grammar's cues, the vocabulary."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from keras_mha import data


# ------------------------------------------------------------------ splits
def test_split_indices_disjoint_complete_stratified_and_seeded():
    strata = np.repeat(np.arange(5), [100, 200, 300, 150, 250])
    train, val, test = data.split_indices(strata, seed=3)
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert sorted(np.concatenate([train, val, test])) == list(range(len(strata)))
    assert len(test) == pytest.approx(data.TEST_FRACTION * len(strata), abs=1)
    assert len(val) == pytest.approx(data.VALIDATION_FRACTION * (len(strata) - len(test)), abs=1)
    overall = np.bincount(strata) / len(strata)
    for part in (train, val, test):
        np.testing.assert_allclose(
            np.bincount(strata[part], minlength=5) / len(part), overall, atol=0.01
        )
    again = data.split_indices(strata, seed=3)
    for a, b in zip((train, val, test), again):
        np.testing.assert_array_equal(a, b)
    other = data.split_indices(strata, seed=4)
    assert not np.array_equal(np.sort(test), np.sort(other[2]))


def test_digits_rows_as_tokens():
    ds = data.load_digits(seed=0)
    assert ds.name == "digits" and ds.input_kind == "features"
    assert ds.labels == [str(i) for i in range(10)]
    assert len(ds.y_train) + len(ds.y_val) + len(ds.y_test) == 1797
    assert len(ds.y_test) == 360
    for x, y in ((ds.x_train, ds.y_train), (ds.x_val, ds.y_val), (ds.x_test, ds.y_test)):
        assert x.dtype == np.float32 and x.shape[1:] == (8, 8)
        assert y.dtype == np.int32 and len(x) == len(y)
        assert x.min() == 0.0 and x.max() == 1.0
        assert set(np.unique(y)) == set(range(10))  # every class in every split
    assert (ds.sequence_length, ds.feature_dim, ds.num_classes) == (8, 8, 10)
    assert ds.token_labels(ds.x_test[0]) == [f"row {i}" for i in range(8)]


def test_digits_split_follows_the_seed():
    a, b, c = data.load_digits(0), data.load_digits(0), data.load_digits(1)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.x_test, c.x_test)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="Unknown dataset 'mnist'"):
        data.load_dataset("mnist")


# ----------------------------------------------------------------- grammar
def _solve(text: str) -> dict:
    """Resolve a sentence from the lexicon alone, one cue at a time."""
    kind_of, number_of = {}, {}
    for kind, pairs in data.NOUNS.items():
        for singular, plural in pairs:
            kind_of[singular] = kind_of[plural] = kind
            number_of[singular], number_of[plural] = "singular", "plural"
    adjective_kind = {a: k for k, adjectives in data.ADJECTIVES.items() for a in adjectives}
    words = text.split()
    nouns = [w for w in words if w in kind_of]
    pronoun = next(w for w in words if w in ("it", "they"))
    number = "singular" if pronoun == "it" else "plural"
    kind = adjective_kind[words[-1]]
    types = [(kind_of[n], number_of[n]) for n in nouns]
    # The pivot shares its kind with one other noun and its number with another.
    pivots = [
        i
        for i, (k, n) in enumerate(types)
        if any(t == (k, m) for t in types for m in data.NUMBERS if m != n)
        and any(t == (o, n) for t in types for o in data.KINDS if o != k)
    ]
    return {
        "nouns": nouns,
        "by_number": {i for i, t in enumerate(types) if t[1] == number},
        "by_kind": {i for i, t in enumerate(types) if t[0] == kind},
        "pivots": pivots,
    }


def test_pronoun_sentences_are_decided_by_their_cue():
    texts, labels, cues, counts = data.generate_pronouns(1000, seed=5)
    assert len(set(texts)) == 1000
    shares = {s: 0 for s in data.STRUCTURES}
    seen = set()
    for text, label, cue, count in zip(texts, labels, cues, counts):
        s = _solve(text)
        assert len(s["nouns"]) == count, text
        assert s["by_number"] & s["by_kind"] == {label}, text
        if cue == "number":
            assert s["by_number"] == {label} and len(s["by_kind"]) == 2, text
        elif cue == "semantic":
            assert s["by_kind"] == {label} and len(s["by_number"]) == 2, text
        else:  # neither cue alone decides
            assert len(s["by_number"]) == 2 and len(s["by_kind"]) == 2, text
        if count == 3:  # the nouns alone do not tell: the pivot is the referent only for "both"
            assert len(s["pivots"]) == 1, text
            assert (s["pivots"][0] == label) == (cue == "both"), text
        shares[cue, int(count)] += 1
        seen.add((str(cue), int(count), int(label)))
    assert shares == dict.fromkeys(data.STRUCTURES, 200)
    # The referent takes every position the sentence has, for every structure.
    assert seen == {(c, k, p) for c, k in data.STRUCTURES for p in range(k)}


def test_impossible_structure():
    with pytest.raises(ValueError, match="No sentence with 2 nouns is decided by cue 'both'"):
        data.generate_sentence(np.random.default_rng(0), "both", 2)


def test_pronoun_generation_is_seeded():
    a = data.generate_pronouns(60, seed=1)
    b = data.generate_pronouns(60, seed=1)
    c = data.generate_pronouns(60, seed=2)
    assert a[0] == b[0] and all(np.array_equal(u, v) for u, v in zip(a[1:], b[1:]))
    assert a[0] != c[0]


def test_pronouns_dataset():
    ds = data.load_pronouns(seed=0, n=600)
    assert ds.input_kind == "tokens" and ds.labels == data.PRONOUNS_LABELS
    assert ds.x_train.dtype == np.int32 and ds.x_train.shape[1] == data.PRONOUNS_MAX_LENGTH
    assert len(ds.y_train) + len(ds.y_val) + len(ds.y_test) == 600
    assert ds.feature_dim == len(ds.vocab.tokens)
    for x in (ds.x_train, ds.x_val, ds.x_test):
        assert (x != ds.vocab.unk_id).all()  # the grammar's words are all known
        assert (x[:, 0] != 0).all() and (x[:, -1] == 0).all()  # padded at the end
    # Stratified by structure: each is a fifth of the test split.
    counts = {(c, int(k)) for c, k in zip(ds.cue_test, ds.nouns_test)}
    assert counts == set(data.STRUCTURES)
    for c, k in data.STRUCTURES:
        share = ((ds.cue_test == c) & (ds.nouns_test == k)).mean()
        assert share == pytest.approx(1 / len(data.STRUCTURES), abs=0.01)
    np.testing.assert_array_equal(ds.vocab.encode(list(ds.text_test)), ds.x_test)
    assert " ".join(ds.token_labels(ds.x_test[0])) == ds.text_test[0]


# -------------------------------------------------------------------- vocab
def _tokenize_from_json(vocab_json: dict, text: str) -> list[int]:
    """What the edge demo does, from vocab.json and `re` only."""
    if vocab_json["lowercase"]:
        text = text.lower()
    index = {t: i for i, t in enumerate(vocab_json["tokens"])}
    ids = [
        index.get(w, vocab_json["unk_id"]) for w in re.findall(vocab_json["token_pattern"], text)
    ]
    ids = ids[: vocab_json["max_length"]]
    return ids + [vocab_json["pad_id"]] * (vocab_json["max_length"] - len(ids))


def test_vocab_json_is_enough_to_tokenize(tmp_path):
    vocab = data.pronouns_vocab()
    vocab.save(tmp_path / "vocab.json")
    saved = json.loads((tmp_path / "vocab.json").read_text())
    assert set(saved) == {"tokens", "pad_id", "unk_id", "max_length", "lowercase", "token_pattern"}
    assert saved["tokens"][:2] == ["<pad>", "<unk>"] and (saved["pad_id"], saved["unk_id"]) == (
        0,
        1,
    )
    assert len(set(saved["tokens"])) == len(saved["tokens"])
    texts = [
        "The model didn't work because it was too complex.",
        "the LAPTOP crashed the Models, since they were so buggy!",
        "the zebra replaced the model because it was too sleepy",
        " ".join(["the model"] * 20),
        "",
    ]
    for text in texts:
        assert vocab.encode(text)[0].tolist() == _tokenize_from_json(saved, text), text
    ids = vocab.encode(texts[2])[0]
    assert ids[1] == saved["unk_id"] and ids[-1] == saved["pad_id"]  # zebra unknown
    assert vocab.encode(texts[0])[0].tolist().count(saved["unk_id"]) == 0
    # One class for training, export and the device: what training writes, the device reads.
    from bundle_contract.vocab import Vocab

    assert type(vocab) is Vocab and Vocab.load(tmp_path / "vocab.json") == vocab
