"""keras-mha-heads coref: the probe's arithmetic on hand-made attention, and the command
on a tiny imported BERT and an untrained word-level classifier."""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_checks import assert_answered_without_tensorflow

from keras_mha.data import generate_pronouns
from keras_mha.heads import coref
from keras_mha.heads.cli import main

# the word pieces of all-MiniLM-L6-v2's tokenizer for this sentence
PIECES = "the routers slowed down the programs since they were so unplugged"
PIECE_OFFSETS = [(0, 0), (0, 3), (4, 9), (9, 11), (12, 18), (19, 23), (24, 27), (28, 36),
                 (37, 42), (43, 47), (48, 52), (53, 55), (56, 58), (58, 60), (60, 62), (62, 65),
                 (0, 0)]  # fmt: skip


# sentences and spans ----------------------------------------------------------------------


def test_the_generators_sentences_parse_to_their_nouns_pronoun_and_label():
    texts, labels, cues, counts = generate_pronouns(50, seed=3)
    for text, label, cue, count in zip(texts, labels, cues, counts):
        s = coref.parse_sentence(text, int(label), str(cue))
        pronoun, nouns = s.words()
        assert len(nouns) == count and pronoun in ("it", "they")
        assert all(text.split()[text.split().index(n) - 1] == "the" for n in nouns)
        assert s.candidates[-1][1] < s.pronoun[0]  # every noun before the pronoun
    lesson = coref.parse_sentence(coref.LESSON, coref.LESSON_LABEL)
    assert lesson.words() == ("it", ["animal", "street"])
    with pytest.raises(ValueError, match="no pronoun"):
        coref.parse_sentence("the cat sat on the mat", 0)
    with pytest.raises(ValueError, match="label 2 for 2"):
        coref.parse_sentence(coref.LESSON, 2)


def test_a_noun_in_several_word_pieces_spans_them_all():
    s = coref.parse_sentence(PIECES, 0)
    pronoun, nouns = coref.token_spans(s, PIECE_OFFSETS)
    assert nouns == ((2, 4), (7, 8))  # "route" "##rs"; "programs"
    assert pronoun == (9, 10)  # "they", [CLS] counted as position 0
    # a word-level vocabulary: one token per word, no [CLS]
    words = coref.word_offsets(PIECES)
    assert coref.token_spans(s, words) == ((7, 8), ((1, 2), (5, 6)))
    # truncated before the pronoun: refused, not guessed
    with pytest.raises(ValueError, match="no token covers 'they'.*truncated"):
        coref.token_spans(s, coref.word_offsets(PIECES, max_length=6))


# the probe on hand-made attention ------------------------------------------------------


def _sentences(n: int, seed: int = 0):
    """Generated sentences with word-level spans, and attention for three heads:
    head 0 on the referent, head 1 on the nearest noun, head 2 on the first noun."""
    texts, labels, cues, _ = generate_pronouns(n, seed)
    pronouns, candidates, attention = [], [], []
    for text, label in zip(texts, labels):
        s = coref.parse_sentence(text, int(label))
        pronoun, nouns = coref.token_spans(s, coref.word_offsets(text))
        length = len(coref.word_offsets(text))
        a = np.full((3, length, length), 0.01)
        for head, target in enumerate((label, len(nouns) - 1, 0)):
            a[head, pronoun[0], nouns[target][0]] = 0.5
        pronouns.append(pronoun)
        candidates.append(nouns)
        attention.append([a[:2], a[2:]])  # two layers: 2 heads, then 1
    return attention, pronouns, candidates, labels, cues


def test_a_head_on_the_referent_scores_one_and_one_on_the_nearest_noun_the_baseline():
    attention, pronouns, candidates, labels, cues = _sentences(100)
    result = coref.probe(attention, pronouns, candidates, labels, cues, resamples=200)
    by_name = {h.name: h for h in result.heads}
    assert set(by_name) == {"L0-H0", "L0-H1", "L1-H0"}
    assert result.heads[0].name == "L0-H0" and (result.heads[0].layer, result.heads[0].head) == (
        0,
        0,
    )
    assert by_name["L0-H0"].accuracy == 1.0 and by_name["L0-H0"].ci95 == (1.0, 1.0)
    assert by_name["L0-H0"].by_cue == {"number": 1.0, "semantic": 1.0, "both": 1.0}
    nearest, first, chance = result.baselines
    assert [b.name for b in result.baselines] == list(coref.BASELINES)
    assert by_name["L0-H1"].accuracy == nearest.accuracy
    assert by_name["L0-H1"].by_cue == nearest.by_cue
    assert by_name["L0-H1"].ci95 == nearest.ci95  # the same resamples for every column
    assert by_name["L1-H0"].accuracy == first.accuracy
    nouns = np.array([len(c) for c in candidates])
    assert chance.accuracy == pytest.approx(np.mean(1.0 / nouns))
    assert first.accuracy == pytest.approx(np.mean(labels == 0))
    assert result.cues == {c: int((cues == c).sum()) for c in ("number", "semantic", "both")}
    assert result.beating() == (1, 1)  # only the referent head is above the nearest noun
    record = result.to_json()
    assert json.loads(json.dumps(record)) == record
    assert record["heads"][0]["ci95"] == [1.0, 1.0]


def test_word_pieces_are_summed_before_the_pick():
    """One piece of the other noun outweighs every single piece of the referent;
    the referent's two pieces together outweigh it."""
    s = coref.parse_sentence(PIECES, 0)  # the routers (2 pieces) ... they
    pronoun, nouns = coref.token_spans(s, PIECE_OFFSETS)
    a = np.zeros((1, len(PIECE_OFFSETS), len(PIECE_OFFSETS)))
    a[0, pronoun[0], [2, 3, 7]] = [0.25, 0.25, 0.3]
    weights = coref.candidate_weights([a], pronoun, nouns)
    np.testing.assert_allclose(weights, [[0.5, 0.3]])
    result = coref.probe([[a]], [pronoun], [nouns], [0], ["number"], resamples=10)
    assert result.heads[0].accuracy == 1.0
    assert result.baseline("nearest noun").accuracy == 0.0  # programs is nearer
    # a pronoun in several pieces: the mean of its rows
    b = np.zeros_like(a)
    b[0, 1, 2], b[0, 2, 7] = 1.0, 1.0
    np.testing.assert_allclose(coref.candidate_weights([b], (1, 3), nouns), [[0.5, 0.5]])


def test_the_nearest_noun_is_the_one_closest_before_the_pronoun():
    assert coref.nearest_candidate((9, 10), [(1, 2), (4, 5), (7, 8)]) == 2
    assert coref.nearest_candidate((5, 6), [(1, 2), (3, 4), (7, 8)]) == 1
    assert coref.nearest_candidate((0, 1), [(7, 8), (3, 4)]) == 1  # none before: closest after


def test_the_bootstrap_interval_holds_the_estimate_and_repeats_for_a_seed():
    rng = np.random.default_rng(1)
    scores = np.stack([rng.random(300) < 0.7, rng.random(300) < 0.4, np.full(300, 0.5)], axis=1)
    intervals = coref.bootstrap_interval(scores, resamples=500, seed=4)
    assert intervals.shape == (3, 2)
    for (low, high), mean in zip(intervals, scores.mean(axis=0)):
        assert low <= mean <= high
    assert 0.05 < intervals[0, 1] - intervals[0, 0] < 0.15  # ~ 4 standard errors
    assert tuple(intervals[2]) == (0.5, 0.5)  # a constant score has no spread
    np.testing.assert_array_equal(intervals, coref.bootstrap_interval(scores, 500, seed=4))
    assert not np.array_equal(intervals, coref.bootstrap_interval(scores, 500, seed=5))
    with pytest.raises(ValueError, match="needs sentences"):
        coref.bootstrap_interval(np.zeros((0, 2)))


# the command ------------------------------------------------------------------------------


def _fails(capsys, argv, match):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("keras-mha-heads") and "error: " in err and match in err, err


def test_coref_refuses_a_missing_run_in_one_line(tmp_path, capsys):
    _fails(capsys, ["coref", str(tmp_path / "nope")], "does not exist; expected a run directory")
    _fails(capsys, ["coref", str(tmp_path), "--sentences", "0"], "expected a positive integer")
    _fails(capsys, ["coref", str(tmp_path), "--sentences", "999999"], "--sentences must be in")


def test_coref_help_does_not_import_tensorflow():
    out = assert_answered_without_tensorflow("keras_mha.heads", ["coref", "--help"], 0)
    assert "--bootstrap" in out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny random BERT (tests/test_pretrained.py) imported as an embedding run."""
    from keras_mha.pretrained.cli import import_run
    from tests.test_pretrained import SHAPE, oracle, torch_python

    root = tmp_path_factory.mktemp("coref-bert")
    options = [f"--{k}={v}" for k, v in SHAPE.items()]
    oracle(torch_python(), "tiny", root / "model", *options, "--seed", 7)
    import_run(str(root / "model"), root / "run", max_length=64, log=lambda line: None)
    return root / "run", SHAPE


@pytest.mark.slow
def test_coref_on_a_tiny_imported_bert(tiny_run, tmp_path, capsys):
    """The command's table equals the probe on attention computed one sentence at a time
    (no padding); the JSON holds every head, the baselines and the lesson sentence."""
    from keras import ops

    from keras_mha.pretrained.bert import encoder_forward
    from keras_mha.rundir.embedding import read_embedding_run

    run_dir, shape = tiny_run
    out = tmp_path / "coref.json"
    argv = ["coref", str(run_dir), "--sentences", "40", "--bootstrap", "200", "--seed", "2"]
    capsys.readouterr()
    assert main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "nearest noun" in printed and 'weight of "it" on animal / street' in printed
    record = json.loads(out.read_text())
    total = shape["layers"] * shape["heads"]
    assert record["model"] == "embedding" and len(record["heads"]) == total
    assert record["heads_per_layer"] == [shape["heads"]] * shape["layers"]
    assert record["lesson"]["candidates"] == ["animal", "street"]
    assert len(record["lesson"]["heads"]) == total

    run = read_embedding_run(run_dir)
    model = run.load_model()
    texts, labels, cues, _ = generate_pronouns(40, 2)
    attention, pronouns, candidates = [], [], []
    for text, label in zip(texts, labels):
        s = coref.parse_sentence(text, int(label))
        encoding = run.tokenizer.tokenizer.encode(text)
        _, weights = encoder_forward(model, np.array([encoding.ids]), return_attention=True)
        attention.append([ops.convert_to_numpy(w)[0] for w in weights])
        pronoun, nouns = coref.token_spans(s, encoding.offsets)
        pronouns.append(pronoun)
        candidates.append(nouns)
    expected = coref.probe(attention, pronouns, candidates, labels, cues, 200, 2).to_json()
    for ours, theirs in zip(record["heads"], expected["heads"]):
        assert ours["name"] == theirs["name"]
        assert ours["accuracy"] == theirs["accuracy"] and ours["ci95"] == theirs["ci95"]
    assert record["baselines"] == expected["baselines"]


def _word_run(out, max_length: int | None):
    """An untrained classifier on the pronoun vocabulary, as a run directory
    (`max_length` None: on 8 x 8 features, like digits, without a vocabulary)."""
    from keras_mha.data import pronouns_vocab
    from keras_mha.model import ModelConfig, build_classifier
    from keras_mha_edge.contract.vocab import Vocab

    vocab = None if max_length is None else Vocab(pronouns_vocab().tokens, max_length=max_length)
    config = ModelConfig(
        input_kind="features" if vocab is None else "tokens",
        sequence_length=8 if vocab is None else max_length,
        feature_dim=8 if vocab is None else len(vocab),
        num_classes=3, d_model=16, num_heads=2, num_layers=2, ff_dim=16, dropout=0.0, seed=0,
    )  # fmt: skip
    model = build_classifier(config)
    if vocab is None:
        x = np.random.default_rng(0).random((20, 8, 8)).astype("float32")
    else:
        x = vocab.encode(generate_pronouns(20, 9)[0])
    probs = model.predict(x, verbose=0).astype("float32")
    out.mkdir(parents=True)
    model.save(out / "model.keras")
    np.savez(out / "eval.npz", x=x, y=probs.argmax(-1).astype("int32"), probs=probs)
    np.savez(out / "calibration.npz", x=x)
    (out / "labels.json").write_text(json.dumps(["first noun", "second noun", "third noun"]))
    if vocab is not None:
        vocab.save(out / "vocab.json")
    metrics = {
        "dataset": "toy-pronouns",
        "seed": 0,
        "config": config.to_dict(),
        "test_accuracy": 0.0,
    }
    (out / "metrics.json").write_text(json.dumps(metrics))
    return out


@pytest.mark.slow
def test_coref_on_a_word_level_classifier_and_a_truncating_vocabulary(tmp_path, capsys):
    run = _word_run(tmp_path / "run", 16)
    out = tmp_path / "coref.json"
    capsys.readouterr()
    assert (
        main(["coref", str(run), "--sentences", "25", "--bootstrap", "50", "--json", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "the classifier's own accuracy on these sentences" in printed
    assert "unknown to the tokenizer: animal, cross, street, tired" in printed
    record = json.loads(out.read_text())
    assert record["model"] == "classification" and record["heads_per_layer"] == [2, 2]
    assert {h["name"] for h in record["heads"]} == {"L0-H0", "L0-H1", "L1-H0", "L1-H1"}
    assert 0.0 <= record["model_accuracy"] <= 1.0
    # a vocabulary of 6 words cuts every sentence before its pronoun: one line, exit 2
    short = _word_run(tmp_path / "short", 6)
    _fails(capsys, ["coref", str(short), "--sentences", "5"], "truncated?")
    # a run that reads no words
    _fails(capsys, ["coref", str(_word_run(tmp_path / "features", None))], "has no vocab.json")
