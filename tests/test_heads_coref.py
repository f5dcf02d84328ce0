"""keras-mha-heads coref: the probe's arithmetic on hand-made attention, and the command
on a tiny imported BERT and an untrained word-level classifier."""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_checks import assert_answered_without_tensorflow

from bundle_contract.errors import UsageError
from bundle_contract.files import sha256_file
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
    assert not (tmp_path / "nope").exists()  # its default RUN_DIR/heads/coref.json: not made
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
    assert record["model_sha256"] == sha256_file(run_dir / "model.keras")
    assert not (run_dir / coref.COREF_FILE).exists()  # --json instead of RUN_DIR/heads/
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
    from bundle_contract.vocab import Vocab
    from keras_mha.data import pronouns_vocab
    from keras_mha.model import ModelConfig, build_classifier

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


def test_view_refuses_both_a_sample_and_a_text(tmp_path, capsys):
    _fails(capsys, ["view", str(tmp_path), "--sample", "1", "--text", "it"], "not both")


def _coref_table(path, model_sha256: str, heads_per_layer, best: dict, sentences: int = 25):
    path.parent.mkdir(parents=True, exist_ok=True)
    other = {"name": "L0-H0", "layer": 0, "head": 0, "accuracy": 0.1, "ci95": [0.0, 0.2]}
    record = {
        "model_sha256": model_sha256,
        "heads_per_layer": heads_per_layer,
        "sentences": sentences,
        "heads": [best, other],
    }
    path.write_text(json.dumps(record))


def test_the_best_head_is_read_only_for_the_model_it_was_measured_on(tmp_path):
    model = tmp_path / "model.keras"
    model.write_bytes(b"weights")
    table = tmp_path / coref.COREF_FILE
    assert coref.read_best_head(tmp_path, [2, 2], model) == (None, None)  # no table: no head
    best = {"name": "L1-H0", "layer": 1, "head": 0, "accuracy": 0.75, "ci95": [0.6, 0.9]}
    _coref_table(table, sha256_file(model), [2, 2], best)
    head, note = coref.read_best_head(tmp_path, [2, 2], model)
    assert note is None and head.to_json() == {
        "layer": 1,
        "head": 0,
        "accuracy": 0.75,
        "ci95": [0.6, 0.9],
        "sentences": 25,
    }
    head, note = coref.read_best_head(tmp_path, [2, 1], model)  # other heads per layer
    assert head is None and "is for [2, 2] heads per layer, the model has [2, 1]" in note
    model.write_bytes(b"retrained")
    head, note = coref.read_best_head(tmp_path, [2, 2], model)
    assert head is None and "is for another model.keras (sha256 differs)" in note
    assert "rerun keras-mha-heads coref" in note
    for bad, message in (
        ({**best, "layer": 2}, "its best head's layer is 2; the model has 2 layers"),
        ({**best, "accuracy": 7}, "field 'coref_head.accuracy' must be in [0, 1]"),
        ({**best, "ci95": None}, "field 'coref_head.ci95' must be [low, high]"),
    ):
        _coref_table(table, sha256_file(model), [2, 2], bad)
        with pytest.raises(UsageError) as error:
            coref.read_best_head(tmp_path, [2, 2], model)
        assert str(error.value).startswith(f"{table}: ") and message in str(error.value)
    table.write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a keras-mha-heads coref table"):
        coref.read_best_head(tmp_path, [2, 2], model)


@pytest.mark.slow
def test_coref_writes_into_the_run_and_view_text_opens_on_its_best_head(tmp_path, capsys):
    """coref's table goes to RUN_DIR/heads/coref.json; `view --text` on a word-level
    classifier shows the vocabulary's tokens, opens on "it" and on the best head, and names
    none when the table is for another model; a run without vocab.json refuses --text."""
    run = _word_run(tmp_path / "run", 16)
    assert main(["coref", str(run), "--sentences", "25", "--bootstrap", "50"]) == 0
    record = json.loads((run / coref.COREF_FILE).read_text())
    assert record["model_sha256"] == sha256_file(run / "model.keras")
    best = record["heads"][0]
    capsys.readouterr()
    assert main(["view", str(run), "--text", coref.LESSON]) == 0
    page = run / "heads" / "view_text.html"
    assert capsys.readouterr().out.strip() == f"wrote {page}"
    data = _page_data(page)
    assert data["tokens"] == ["the", "<unk>", "didn't", "<unk>", "the", "<unk>", "because", "it",
                              "was", "too", "<unk>"]  # fmt: skip
    assert data["initial_query"] == 7 and data["input"]["text"] == coref.LESSON
    assert data["named_head"]["layer"] == best["layer"] == data["initial_layer"]
    assert data["named_head"]["head"] == best["head"]
    assert data["named_head"]["caption"].endswith(
        "of 25 generated pronoun sentences, keras-mha-heads coref"
    )
    record["model_sha256"] = "0" * 64
    (run / coref.COREF_FILE).write_text(json.dumps(record))
    assert main(["view", str(run), "--text", coref.LESSON]) == 0
    assert "is for another model.keras" in capsys.readouterr().out
    assert _page_data(page)["named_head"] is None
    features = _word_run(tmp_path / "features", None)
    _fails(capsys, ["view", str(features), "--text", "it"], "needs a model that reads words")


def _page_data(path) -> dict:
    text = path.read_text(encoding="utf-8")
    start = text.index('id="attention-data">') + len('id="attention-data">')
    return json.loads(text[start : text.index("</script>", start)])
