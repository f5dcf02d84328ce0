"""Cross-encoder rerankers (issue 33): a one-label sequence classifier imports as pair scoring.

Tiny random `BertForSequenceClassification`, `DistilBertForSequenceClassification`
and `RobertaForSequenceClassification` with one label (tests/oracle/bert_oracle.py
`tiny --head cross-encoder`) score (query, passage) pairs tokenized by the
oracle as transformers does (`reference --pairs`: BERT's token types 1 on the
passage). sentence-transformers' CrossEncoder reports sigmoid(logit) for a
one-label model whose config declares no activation, so ours must give that
within 1e-5, with every layer's attention, on TensorFlow (here), JAX and
PyTorch (slow). Our model takes only the ids: it derives the token types from
the first [SEP], which the test checks against the tokenizer's type ids.
Then the run goes through export and the TF-free device: parity by ranking,
`--pair`, `--rerank`, `--sample` and `--view`.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from keras_mha.pretrained import corpus
from tests.test_pretrained import TOLERANCE, _compare, _edge, backend_diffs
from tests.test_pretrained_oracle import oracle, torch_python

SHAPE = dict(layers=2, heads=4, hidden=32, intermediate=64)
KINDS = {"bert": 31, "distilbert": 32, "roberta": 33}  # family: seed
MAX_LENGTH = 64


def _pairs() -> list[tuple[str, str]]:
    """Queries with passages of their topic and of others; accents, capitals and digits."""
    s = corpus.sentences()
    pairs = [(s[i], s[j]) for i, j in ((0, 1), (0, 2), (0, 60), (30, 31), (30, 200), (100, 101))]
    return pairs + [
        ("Where is Zürich's café?", "The café near Zürich's station opens at 7:45 on Mondays."),
        ("What did the animal do?", "The animal didn't cross the street because it was too tired."),
    ]


def _sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


@pytest.fixture(scope="module", params=sorted(KINDS))
def reranker(request, tmp_path_factory):
    family, seed = request.param, KINDS[request.param]
    python = torch_python()
    root = tmp_path_factory.mktemp(f"ce-{family}")
    pairs = _pairs()
    (root / "pairs.txt").write_text("".join(f"{q}\t{p}\n" for q, p in pairs), encoding="utf-8")
    options = [f"--{k}={v}" for k, v in SHAPE.items()]
    oracle(python, "tiny", root / "model", *options, "--seed", seed, "--family", family,
           "--head", "cross-encoder")  # fmt: skip
    oracle(python, "reference", root / "model", root / "pairs.txt", root / "ref.npz",
           "--max-length", MAX_LENGTH, "--pairs")  # fmt: skip
    with np.load(root / "ref.npz") as z:
        ref = {k: z[k] for k in z.files}
    ref["embeddings"] = _sigmoid(ref["logits"]).astype(np.float32)  # CrossEncoder's score
    return {"dir": root / "model", "root": root, "pairs": pairs, "ref": ref, "family": family}


def test_the_cross_encoder_gives_sentence_transformers_scores(reranker):
    from keras_mha.pretrained import load

    encoder = load(reranker["dir"], max_length=MAX_LENGTH)
    config, ref = encoder.config, reranker["ref"]
    assert config.score_activation == "sigmoid" and not config.labels
    ids = encoder.tokenize_pairs(reranker["pairs"], ref["input_ids"].shape[1])
    np.testing.assert_array_equal(ids, ref["input_ids"])  # the tokenizers' pair ids
    scores = encoder.embed_ids(ids)
    assert scores.shape == (len(reranker["pairs"]), 1)
    diffs = _compare(scores, encoder.attention(ids), ref)
    assert len(diffs) == 1 + SHAPE["layers"] and max(diffs.values()) <= TOLERANCE, diffs
    # the test can tell: the scores spread, and the passage's token types matter
    assert np.ptp(ref["embeddings"]) > 100 * TOLERANCE
    if reranker["family"] == "bert":
        assert config.pair_sep_id == encoder.tokenizer.tokenizer.token_to_id("[SEP]")
        real = ref["attention_mask"].astype(bool)
        types = encoder.model.get_layer("embedding").token_types(ids)
        np.testing.assert_array_equal(np.where(real, types, 0), ref["token_type_ids"])
        assert ref["token_type_ids"].any()
        single = load(reranker["dir"], max_length=MAX_LENGTH)
        single.model.get_layer("embedding").pair_sep_id = None  # every token type 0
        assert np.abs(single.embed_ids(ids) - scores).max() > 100 * TOLERANCE
    else:
        assert config.pair_sep_id is None  # one token type: nothing to derive


@pytest.mark.slow  # children in the JAX and torch venvs
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_give_the_same_scores(reranker, backend, tmp_path):
    ref_path = tmp_path / "ref.npz"
    np.savez(ref_path, **reranker["ref"])
    diffs = backend_diffs(
        backend, reranker["dir"], ref_path, tmp_path / "out.npz", SHAPE["layers"], MAX_LENGTH
    )
    assert len(diffs) == 1 + SHAPE["layers"] and max(diffs.values()) <= TOLERANCE, diffs


def test_the_eval_pairs_are_groups_of_one_query():
    from bundle_contract.tasks.pair_scoring import PASSAGES
    from keras_mha.pretrained.pairs import QUERIES, eval_pairs

    _, texts = corpus.split(0, 100)
    pairs = eval_pairs(texts, seed=0)
    assert pairs == eval_pairs(texts, seed=0) and pairs != eval_pairs(texts, seed=1)
    assert len(pairs) == QUERIES * PASSAGES
    topic = corpus.topics()
    for g in range(QUERIES):
        group = pairs[g * PASSAGES : (g + 1) * PASSAGES]
        assert len({q for q, _ in group}) == 1 and len({p for _, p in group}) == PASSAGES
        query = group[0][0]
        assert query not in {p for _, p in group}
        same = sum(topic[p] == topic[query] for _, p in group)
        assert 1 <= same <= 5  # candidates of its topic among others


@pytest.mark.slow  # an export of three modes and the device in its venv
def test_import_export_and_the_device_rerank(reranker, tmp_path):
    from keras_mha.pretrained import load
    from keras_mha.pretrained.cli import import_run
    from keras_mha_export.bundle import export_bundle

    out = tmp_path / "run"
    run = import_run(str(reranker["dir"]), out, max_length=MAX_LENGTH, log=lambda _: None)
    assert run.task.name == "pair-scoring"
    assert json.loads((out / "metrics.json").read_text())["task"] == "pair-scoring"
    manifest = export_bundle(out, tmp_path / "bundle", "float32,dynamic,float16")
    assert manifest.verified == ["float32", "dynamic", "float16"]
    parity = manifest.models["float32"].parity
    assert parity.max_abs_diff <= 1e-5 and parity.top1 == 1.0 and parity.top5 == 1.0
    done = _edge(tmp_path / "bundle")
    assert done.returncode == 0 and "PASS: 3 of 3 modes" in done.stdout, done.stdout + done.stderr
    # --pair: the float32 score is CrossEncoder's for the pair
    (query, passage), expected = reranker["pairs"][-1], reranker["ref"]["embeddings"][-1, 0]
    done = _edge(tmp_path / "bundle", "--quant", "float32", "--pair", query, passage,
                 "--view", tmp_path / "view.html")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("float32"))
    assert abs(float(row.split()[1]) - expected) <= 1e-5, (row, expected)
    # the page's tokens (JSON with < and > escaped) hold the family's separator
    separator = "\\u003c/s\\u003e" if reranker["family"] == "roberta" else "[SEP]"
    assert separator in (tmp_path / "view.html").read_text(encoding="utf-8")
    # --rerank: the file's lines best first, in the order of the float Keras scores
    passages = [p for _, p in reranker["pairs"][:3]] + [p for _, p in reranker["pairs"][6:]]
    lines = tmp_path / "passages.txt"
    # a blank line after the second: the printed line numbers are the file's
    lines.write_text("\n".join(passages[:2]) + "\n\n" + "\n".join(passages[2:]) + "\n")
    done = _edge(tmp_path / "bundle", "--quant", "float32", "--rerank", query, lines)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [r for r in done.stdout.splitlines() if re.match(r"\s*\d+\s+\d\.\d{4}\s+\d+\s", r)]
    assert len(rows) == len(passages)
    keras_scores = load(reranker["dir"], max_length=MAX_LENGTH).score(
        [(query, p) for p in passages]
    )[:, 0]
    shown = [int(r.split()[2]) - (1 if int(r.split()[2]) <= 2 else 2) for r in rows]
    assert shown == list(np.argsort(-keras_scores, kind="stable")), (shown, keras_scores)
    printed = np.array([float(r.split()[1]) for r in rows])
    assert np.abs(printed - keras_scores[shown]).max() <= 1e-4 + TOLERANCE
    # --sample N: the eval pair, the float reference and each mode's score
    done = _edge(tmp_path / "bundle", "--sample", "3")
    assert done.returncode == 0 and "keras (float reference)" in done.stdout, done.stderr
    ref_row = next(r for r in done.stdout.splitlines() if r.startswith("keras"))
    f32_row = next(r for r in done.stdout.splitlines() if r.startswith("float32"))
    assert abs(float(ref_row.split()[-1]) - float(f32_row.split()[-1])) <= 1e-5
    done = _edge(tmp_path / "bundle", "--pair", " ", passage)  # an empty query: one line
    assert done.returncode == 2 and "--pair: the query is empty" in done.stderr, done.stderr
    # a cross-encoder scores pairs: --text is refused in one line
    done = _edge(tmp_path / "bundle", "--text", "a sentence")
    assert done.returncode == 2 and "--pair" in done.stderr and len(done.stderr.splitlines()) == 1


def test_the_declared_activation_is_honoured_or_refused(reranker, tmp_path):
    """config.json's sentence_transformers.activation_fn: Identity gives the logit itself;
    anything else CrossEncoder would apply that we do not build is refused in one line."""
    import shutil

    from keras_mha.pretrained import load

    base = json.loads((reranker["dir"] / "config.json").read_text())
    ref = reranker["ref"]
    for activation, expected in (
        ("torch.nn.modules.linear.Identity", ref["logits"]),
        ("torch.nn.modules.activation.Tanh", "activation_fn .* is not supported"),
    ):
        directory = tmp_path / "checkpoint"
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(reranker["dir"], directory)
        edit = {**base, "sentence_transformers": {"activation_fn": activation}}
        (directory / "config.json").write_text(json.dumps(edit))
        if isinstance(expected, str):
            with pytest.raises(ValueError, match=expected) as info:
                load(directory, max_length=MAX_LENGTH)
            assert "\n" not in str(info.value)
            continue
        encoder = load(directory, max_length=MAX_LENGTH)
        assert encoder.config.score_activation == "identity"
        scores = encoder.embed_ids(ref["input_ids"])
        assert np.abs(scores - expected).max() <= TOLERANCE


@pytest.mark.slow  # importance, pruning and the head view on the imported reranker
def test_head_tools_take_the_cross_encoder(reranker, tmp_path):
    if reranker["family"] != "bert":
        pytest.skip("one family is enough: the head tools do not depend on the family")
    from keras_mha.heads.encoder import (
        jacobian_importance,
        prune_encoder,
        removal_masks,
        select_heads,
    )
    from keras_mha.pretrained.cli import import_run
    from keras_mha.pretrained.encoding import embed

    run = import_run(str(reranker["dir"]), tmp_path / "run", max_length=MAX_LENGTH,
                     log=lambda _: None)  # fmt: skip
    model = run.load_model()
    scores = jacobian_importance(model, run.calibration[:40])
    assert [len(s) for s in scores] == [SHAPE["heads"]] * SHAPE["layers"]
    assert all(np.isfinite(s).all() and (s > 0).all() for s in scores)
    removed = select_heads(scores, 0.25)
    pruned, _ = prune_encoder(model, removed, run.config)
    out = embed(pruned, run.eval.x[:40])
    # removing the heads is masking them: the same scores (the checkpoint's head kept)
    np.testing.assert_allclose(
        out, embed(model, run.eval.x[:40], removal_masks(model, removed)), atol=TOLERANCE
    )
    assert out.shape == (40, 1) and np.abs(out - run.eval.probs[:40]).max() > 100 * TOLERANCE
    for name in ("pre_classifier", "classifier"):
        np.testing.assert_array_equal(
            pruned.get_layer(name).get_weights()[0], model.get_layer(name).get_weights()[0]
        )


def test_ranking_parity_counts_ties_and_judges_each_query():
    """measure_ranking: a passage tied with the first is a hit (int8 scores come in steps);
    the float model's best falling to sixth of 20 is a top-5 miss; scores on their scale."""
    from bundle_contract.tasks.pair_scoring import PASSAGES, measure_ranking, ranking_thresholds

    rng = np.random.default_rng(0)
    reference = rng.uniform(0, 0.5, (3 * PASSAGES, 1)).astype(np.float32)
    reference[[0, PASSAGES, 2 * PASSAGES]] = 0.9  # each query's best passage: row 0 of it
    scores = reference.copy()
    scores[1] = 0.9  # query 0: another passage ties with the best
    scores[PASSAGES + 1 : PASSAGES + 6] = 0.95  # query 1: five passages above the best
    scores[2 * PASSAGES + 3] = 0.95  # query 2: one above it
    parity = measure_ranking(scores, reference)
    assert parity.top1 == pytest.approx(1 / 3) and parity.top5 == pytest.approx(2 / 3)
    assert parity.max_abs_diff == pytest.approx(0.95 - float(reference[PASSAGES + 1, 0]))
    logits = reference * 20  # a reranker declaring Identity: |Δ| on the largest score's scale
    assert measure_ranking(logits + 0.18, logits).max_abs_diff == pytest.approx(0.01, rel=1e-5)
    # 30 queries: the float model's best may leave the top five of at most 2
    assert ranking_thresholds("int8", 30 * PASSAGES).min_top5 == pytest.approx(28 / 30)
    assert ranking_thresholds("float32", 600).max_abs_diff == 1e-5
