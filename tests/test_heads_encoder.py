"""Heads of a sentence encoder (keras_mha.heads.encoder and its commands), on a tiny
random encoder.

Importance without labels (the Jacobian norm, single-head ablation), removal
for real with per-layer head counts, the least-squares refit on real tokens,
and a pruned embedding run that a new process loads.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from heads_models import tiny_token_model
from test_edge_embedding import tokenizer_json

from bundle_contract.errors import UsageError
from keras_mha.heads import encoder as E
from keras_mha.heads.encoder_commands import cmd_importance_embedding, cmd_prune_embedding
from keras_mha.heads.importance import head_importance, rank_heads
from keras_mha.heads.masks import all_heads_on, heads_per_layer
from keras_mha.heads.statistics import spearman
from keras_mha.model import count_params, encoder_blocks
from keras_mha.pretrained.bert import build_encoder, encoder_forward
from keras_mha.pretrained.config import BertConfig
from keras_mha.pretrained.encoding import batches, embed

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = BertConfig(
    vocab_size=50, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32, max_positions=16
)
REMOVED = [(0, 1), (1, 0), (1, 3)]


def random_encoder(seed: int = 0):
    """`build_encoder(CONFIG)` with random weights (LayerNorm gains near 1)."""
    model = build_encoder(CONFIG)
    rng = np.random.default_rng(seed)
    for var in model.weights:
        value = rng.normal(0, 0.3, var.shape)
        if var.path.endswith("gamma"):
            value = 1 + 0.1 * value
        var.assign(value.astype("float32"))
    return model


def sentences(n: int = 20, seed: int = 1) -> np.ndarray:
    """Token ids (n, 12): [CLS]-like first token, lengths 2..12, 0-padded at the end."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, CONFIG.vocab_size, (n, 12))
    ids[np.arange(12)[None] >= rng.integers(2, 13, (n, 1))] = 0
    return ids.astype("int32")


def write_tiny_run(model, out: pathlib.Path):
    """`model` as an embedding run at `out`: 16 eval sentences, 30 calibration."""
    from keras_mha.rundir.embedding import write_embedding_run

    ids, calibration = sentences(16, seed=5), sentences(30, seed=6)
    return write_embedding_run(
        out,
        model,
        {"dataset": "corpus", "seed": 0, "config": CONFIG.to_dict(), "max_length": 16},
        ids,
        embed(model, ids),
        calibration,
        [f"sentence {i}" for i in range(len(ids))],
        tokenizer_json(),
    )


@pytest.fixture(scope="module")
def model():
    return random_encoder()


def test_batches_trim_padding_without_changing_vectors(model):
    ids = sentences()
    wide = np.concatenate([ids, np.zeros((len(ids), 4), "int32")], axis=1)
    parts = batches(wide, batch_size=6)
    assert sorted(np.concatenate([rows for rows, _ in parts]).tolist()) == list(range(len(ids)))
    for _, xb in parts:
        assert (xb[:, -1] != 0).any() and xb.shape[1] <= 12
    np.testing.assert_allclose(embed(model, wide, batch_size=6), np.asarray(model(ids)), atol=1e-6)


def test_pruned_encoder_equals_the_masked_one(model):
    ids = sentences()
    pruned, keep = E.prune_encoder(model, REMOVED, CONFIG)
    assert keep == [[0, 2, 3], [1, 2]] and heads_per_layer(pruned) == [3, 2]
    assert all(b.attention.d_k == 4 for b in encoder_blocks(pruned))
    masked = embed(model, ids, E.removal_masks(model, REMOVED))
    np.testing.assert_allclose(embed(pruned, ids), masked, atol=1e-5)
    np.testing.assert_allclose(np.asarray(pruned(ids)), masked, atol=1e-5)
    assert count_params(pruned) < count_params(model)
    with pytest.raises(UsageError, match="no head"):
        E.prune_encoder(model, [(0, h) for h in range(4)], CONFIG)


def test_block_pieces_follow_the_model(model):
    """The refit's own forward pass (`_pieces`) is the model's, block by block."""
    ids = sentences()
    blocks = encoder_blocks(model)
    stems = [E._stem(model, xb) for _, xb in batches(ids, 7)]
    xs, masks = [x for x, _ in stems], [m for _, m in stems]
    for block in blocks:
        pieces, outs = E._pieces(block, xs, masks)
        for x, mask, out in zip(xs, masks, outs):
            np.testing.assert_allclose(np.asarray(block(x, mask=mask)), np.asarray(out), atol=1e-5)
        assert len(pieces["heads"]) == (ids != 0).sum()  # real tokens only
        xs = outs
    pooled = [
        np.asarray(model.get_layer("normalize")(model.get_layer("pooling")(x, mask=m)))
        for x, m in zip(xs, masks)
    ]
    rows = np.concatenate([r for r, _ in batches(ids, 7)])
    np.testing.assert_allclose(
        np.concatenate(pooled), np.asarray(encoder_forward(model, ids))[rows], atol=1e-5
    )


def test_refit_never_makes_its_rows_worse_and_uses_real_tokens_only(model):
    ids, held_out = sentences(40, seed=2), sentences(40, seed=3)
    pruned, _ = E.prune_encoder(model, REMOVED, CONFIG)
    reference = embed(model, ids)
    before = (embed(pruned, ids) * reference).sum(1).mean()
    report = E.reconstruct_encoder(model, pruned, ids, batch_size=16)
    assert [r["heads"] for r in report] == [3, 2]
    for entry in report:
        assert entry["rows"] == (ids != 0).sum()
        for name in ("attention", "ffn"):
            fit = entry[name]
            assert fit["after"] <= fit["before"] * (1 + 1e-9) + 1e-9, (entry["layer"], name)
    after = (embed(pruned, ids) * reference).sum(1).mean()
    assert after > before
    # Padding is not in the rows: more padding columns give the same refit.
    again, _ = E.prune_encoder(model, REMOVED, CONFIG)
    wide = np.concatenate([ids, np.zeros((len(ids), 3), "int32")], axis=1)
    E.reconstruct_encoder(model, again, wide, batch_size=16)
    np.testing.assert_allclose(embed(again, held_out), embed(pruned, held_out), atol=1e-5)


def test_jacobian_importance_is_the_finite_difference_norm(model):
    ids = sentences(12)
    effects = E.head_effects(model, ids, "jacobian", batch_size=16, compiled=False)
    eps = 1e-2
    for layer, h in enumerate(heads_per_layer(model)):
        for head in range(h):
            up, down = all_heads_on(model), all_heads_on(model)
            up[layer][head] += eps
            down[layer][head] -= eps
            diff = embed(model, ids, up).astype("float64") - embed(model, ids, down)
            fd = np.linalg.norm(diff / (2 * eps), axis=1)
            assert fd.min() > 1e-3  # not zero at xi = 1, unlike |d(1 - cos)/d xi|
            np.testing.assert_allclose(effects[layer][head], fd, rtol=2e-3, atol=1e-5)
    compiled = E.jacobian_importance(model, ids, batch_size=16)  # one batch: one trace a block
    for a, b in zip(compiled, effects):
        np.testing.assert_allclose(a, b.mean(axis=1), rtol=1e-4)


def test_ablation_is_one_minus_the_cosine_without_the_head(model):
    ids = sentences(12)
    scores = E.ablation_importance(model, ids, compiled=False)
    reference = embed(model, ids).astype("float64")
    for layer, head in [(0, 2), (1, 1)]:
        masks = all_heads_on(model)
        masks[layer][head] = 0.0
        cosine = (embed(model, ids, masks) * reference).sum(1)
        np.testing.assert_allclose(scores[layer][head], 1 - cosine.mean(), atol=1e-6)
    # The criteria agree on this model's ordering more than by chance.
    assert spearman(scores, E.jacobian_importance(model, ids, compiled=False)) > 0.5


def test_a_head_with_a_zero_output_block_ranks_least_important():
    model = random_encoder(seed=4)
    kernel = model.get_layer("transformer_layer_1").attention.output_kernel  # (h, d_v, d)
    w = np.asarray(kernel).copy()
    w[2] = 0.0
    kernel.assign(w)
    ids = sentences(10)
    ablation = E.ablation_importance(model, ids, compiled=False)
    jacobian = E.jacobian_importance(model, ids, compiled=False)
    assert rank_heads(ablation)[0] == (1, 2) and rank_heads(jacobian)[0] == (1, 2)
    assert abs(ablation[1][2]) < 1e-6 and jacobian[1][2] < 1e-6
    # Already masked heads score 0 and are never selected again.
    masks = all_heads_on(model)
    masks[0][0] = 0.0
    assert E.jacobian_importance(model, ids, masks, compiled=False)[0][0] == 0.0


def test_one_interface_for_classifiers_and_encoders(model):
    classifier, _ = tiny_token_model()
    x = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9]], "int32")
    y = np.array([0, 2], "int32")
    for a, b in zip(E.importance(classifier, x, y), head_importance(classifier, x, y)):
        np.testing.assert_allclose(a, b)
    for kind in ("classifier", "auto"):  # no labels: a classifier has no label-free score
        with pytest.raises(UsageError, match="needs the labels"):
            E.importance(classifier, x, kind=kind)
    ids = sentences(6)
    scores = E.importance(model, ids)  # an encoder: no labels, the Jacobian norm
    assert [len(s) for s in scores] == [4, 4] and min(float(s.min()) for s in scores) > 0
    with pytest.raises(UsageError, match="method"):
        E.importance(model, ids, method="gradient")


def test_selection_keeps_a_head_in_every_layer():
    scores = [np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.9, 0.8, 0.7, 0.6])]
    assert E.select_heads(scores, 0.25) == [(0, 0), (0, 1)]
    assert E.select_heads(scores, 0.5) == [(0, 0), (0, 1), (0, 2), (1, 3)]  # layer 0 keeps one
    with pytest.raises(UsageError, match="no head"):
        E.select_heads(scores, 0.9)
    assert spearman([np.array([1, 2, 3])], [np.array([10, 20, 30])]) == pytest.approx(1.0)


def test_a_pruned_config_records_its_heads_per_layer():
    import dataclasses

    assert "heads_per_layer" not in CONFIG.to_dict() and CONFIG.heads == [4, 4]
    pruned = dataclasses.replace(CONFIG, heads_per_layer=(3, 1))
    data = json.loads(json.dumps(pruned.to_dict()))
    assert data["heads_per_layer"] == [3, 1]
    assert BertConfig.from_dict(data) == pruned and pruned.heads == [3, 1]
    model = build_encoder(pruned)  # each head keeps the unpruned size, d_model / num_heads
    blocks = [layer for layer in model.layers if hasattr(layer, "attention")]
    assert [(b.attention.num_heads, b.attention.d_k) for b in blocks] == [(3, 4), (1, 4)]
    for heads, problem in (
        ([3], "heads_per_layer must be 2 integers from 1 to num_heads 4 (one per layer), got (3,)"),
        ([0, 1], "got (0, 1)"),
        ([5, 1], "got (5, 1)"),
        ([True, 1], "got (True, 1)"),
        (["3", 1], "got ('3', 1)"),
        ("3,1", "got '3,1'"),
    ):
        with pytest.raises(UsageError) as error:
            BertConfig.from_dict({**CONFIG.to_dict(), "heads_per_layer": heads}, "metrics.json")
        assert str(error.value).startswith("metrics.json: ") and problem in str(error.value)


@pytest.mark.slow  # a Python child importing a framework
def test_the_commands_prune_a_run_that_reloads_in_a_new_process(model, tmp_path, capsys):
    """`keras-mha-heads importance|prune RUN` for an embedding run (cmd_*_embedding)."""
    from keras_mha.rundir.embedding import read_embedding_run

    source = write_tiny_run(model, tmp_path / "source")
    assert cmd_importance_embedding(argparse.Namespace(run_dir=str(source.path))) == 0
    result = json.loads((source.path / "heads" / "importance.json").read_text())
    assert len(result["heads"]) == 8 and -1 <= result["spearman_importance_ablation"] <= 1
    assert (source.path / "heads" / "importance.png").stat().st_size > 1000
    args = argparse.Namespace(
        run_dir=str(source.path),
        fraction=0.25,
        out=str(tmp_path / "pruned"),
        reconstruct=True,
        finetune_epochs=0,
        overwrite=False,
    )
    assert cmd_prune_embedding(args) == 0
    assert "removed 2/8 heads" in capsys.readouterr().out
    run = read_embedding_run(args.out)
    pruning = run.metrics["pruning"]
    assert sum(pruning["heads_after"]) == 6 and len(pruning["removed"]) == 2
    # metrics.json's config records the heads left (the source's has no such key)
    config = json.loads((pathlib.Path(args.out) / "metrics.json").read_text())["config"]
    assert config["heads_per_layer"] == pruning["heads_after"] and config["num_heads"] == 4
    assert "heads_per_layer" not in json.loads((source.path / "metrics.json").read_text())["config"]
    assert run.config.heads == pruning["heads_after"] == run.heads_per_layer
    rebuilt = [b for b in build_encoder(run.config).layers if hasattr(b, "attention")]
    assert [b.attention.num_heads for b in rebuilt] == config["heads_per_layer"]
    metrics_path = pathlib.Path(args.out) / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics["config"]["heads_per_layer"] = [4, 4]  # a config that is not the model's
    metrics_path.write_text(json.dumps(metrics))
    with pytest.raises(UsageError, match=r"model.keras: has \[\d, \d\] heads per layer; metrics"):
        read_embedding_run(args.out).load_model()
    del metrics["config"]["heads_per_layer"]  # pruned before the key: pruning.heads_after
    metrics_path.write_text(json.dumps(metrics))
    assert read_embedding_run(args.out).heads_per_layer == pruning["heads_after"]
    read_embedding_run(args.out).load_model()
    metrics["config"]["heads_per_layer"] = pruning["heads_after"]
    metrics_path.write_text(json.dumps(metrics))
    assert pruning["params_after"] < pruning["params_before"]
    assert set(pruning["eval_reconstructed"]) == {"mean_cosine", "min_cosine", "top1", "top5"}
    with pytest.raises(UsageError, match="no labels"):
        cmd_prune_embedding(argparse.Namespace(**{**vars(args), "finetune_epochs": 1}))
    script = (
        "import json, sys, numpy as np\n"
        "from keras_mha.rundir.embedding import read_embedding_run\n"
        "run = read_embedding_run(sys.argv[1]); model = run.load_model()\n"
        "heads = [l.attention.num_heads for l in model.layers if hasattr(l, 'attention')]\n"
        "diff = float(np.abs(np.asarray(model(run.eval.x)) - run.eval.probs).max())\n"
        "print(json.dumps({'heads': heads, 'diff': diff}))\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", script, args.out],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reloaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert reloaded["heads"] == pruning["heads_after"] and reloaded["diff"] < 1e-5
