"""Head analysis: gradient importance, pruning that equals masking, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_mha import heads
from keras_mha.model import (
    ModelConfig,
    attention_layers,
    build_classifier,
    encoder_blocks,
    forward,
)


def tiny_model(**overrides):
    config = ModelConfig(
        d_model=16, num_heads=4, num_layers=2, ff_dim=16, dropout=0.0, seed=3, **overrides
    )
    model = build_classifier(config)
    # Non-zero biases so that a removed head's bias would show if it leaked.
    for layer in attention_layers(model):
        for var in (layer.query_bias, layer.value_bias, layer.output_bias):
            var.assign(np.random.default_rng(1).normal(0, 0.3, var.shape).astype("float32"))
    return model


def digits_like(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 8, 8)).astype("float32"), rng.integers(0, 10, n).astype("int32")


def test_pruning_equals_masking_and_really_removes_weights(tmp_path):
    model = tiny_model()
    x, _ = digits_like()
    remove = {0: [1, 3], 1: [0]}
    gates = [np.array([1, 0, 1, 0], "float32"), np.array([0, 1, 1, 1], "float32")]
    masked = np.asarray(forward(model, x, head_masks=gates))
    full = np.asarray(model(x))
    assert np.abs(masked - full).max() > 1e-4  # the masked heads did matter
    pruned = heads.prune_model(model, remove)
    assert heads.heads_per_layer(pruned) == [2, 3]
    np.testing.assert_allclose(np.asarray(pruned(x)), masked, atol=1e-5)
    # Each removed head takes 3 * (16*4 + 4) projection weights and 4*16 rows of W^O.
    per_head = 3 * (16 * 4 + 4) + 4 * 16
    assert pruned.count_params() == model.count_params() - 3 * per_head
    assert tuple(attention_layers(pruned)[0].output_kernel.shape) == (2 * 4, 16)
    # The pruned model saves and loads with its new head counts.
    pruned.save(tmp_path / "pruned.keras")
    reloaded = keras.saving.load_model(tmp_path / "pruned.keras")
    assert heads.heads_per_layer(reloaded) == [2, 3]
    np.testing.assert_allclose(np.asarray(reloaded(x)), masked, atol=1e-5)


def test_token_model_prunes_with_padding():
    model = tiny_model(input_kind="tokens", sequence_length=6, feature_dim=12, num_classes=3)
    ids = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9], [2, 2, 0, 0, 0, 0]], "int32")
    gates = [np.array([0, 1, 1, 1], "float32"), np.array([1, 1, 0, 1], "float32")]
    pruned = heads.prune_model(model, {0: [0], 1: [2]})
    np.testing.assert_allclose(
        np.asarray(pruned(ids)), np.asarray(forward(model, ids, head_masks=gates)), atol=1e-5
    )


def test_importance_is_the_mean_absolute_gate_gradient():
    model = tiny_model()
    x, y = digits_like(n=6, seed=1)
    scores = heads.head_importance(model, x, y, batch_size=4)
    # Finite differences of each example's loss with respect to each gate.
    eps = 2e-3
    for layer in range(2):
        raw = np.zeros(4)
        for head in range(4):
            for i in range(len(x)):
                losses = []
                for delta in (eps, -eps):
                    gates = [np.ones(4, "float32"), np.ones(4, "float32")]
                    gates[layer][head] += delta
                    p = np.asarray(forward(model, x[i : i + 1], head_masks=gates))[0, y[i]]
                    losses.append(-np.log(p))
                raw[head] += abs((losses[0] - losses[1]) / (2 * eps))
        expected = raw / np.linalg.norm(raw)
        np.testing.assert_allclose(scores[layer], expected, atol=2e-3)
        assert abs(np.linalg.norm(scores[layer]) - 1.0) < 1e-5


def test_a_planted_dead_head_ranks_last():
    model = tiny_model()
    layer = attention_layers(model)[1]
    value_kernel = np.asarray(layer.value_kernel).copy()
    value_kernel[2] = 0.0
    layer.value_kernel.assign(value_kernel)
    value_bias = np.asarray(layer.value_bias).copy()
    value_bias[2] = 0.0
    layer.value_bias.assign(value_bias)
    x, y = digits_like(n=32, seed=2)
    scores = heads.head_importance(model, x, y)
    assert scores[1][2] == 0.0
    assert (scores[1][[0, 1, 3]] > 0.01).all()
    assert heads.rank_heads(scores)[0] == (1, 2)


def duplicate_head(layer, src: int, dst: int) -> None:
    """Make head `dst` compute exactly what head `src` computes."""
    for name in ("query", "key", "value"):
        for kind in ("kernel", "bias"):
            var = getattr(layer, f"{name}_{kind}")
            w = np.asarray(var).copy()
            w[dst] = w[src]
            var.assign(w)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("kind", ["features", "tokens"])
def test_trace_follows_the_model(kind):
    if kind == "features":
        model, (x, _) = tiny_model(), digits_like(n=7)
    else:
        model = tiny_model(input_kind="tokens", sequence_length=6, feature_dim=12, num_classes=3)
        x = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9], [2, 0, 0, 0, 0, 0]], "int32")
    t = heads.trace(model, x, batch_size=2)
    np.testing.assert_allclose(softmax(t["logits"]), np.asarray(model(x)), atol=1e-6)
    assert t["mask"].sum() == (x.shape[0] * x.shape[1] if kind == "features" else 10)
    mask = None if kind == "features" else x != 0
    blocks = encoder_blocks(model)
    for i, block in enumerate(blocks):
        b = t["blocks"][i]
        # Each piece against the layers' own calls, not against trace's sums.
        attended = block.attention(b["x"], query_mask=mask, value_mask=mask)
        np.testing.assert_allclose(b["attended"], np.asarray(attended), atol=1e-6)
        w_o = np.asarray(block.attention.output_kernel)
        d_v = block.attention.d_v
        for h in range(block.attention.num_heads):  # head h's columns of Concat
            gate = np.eye(block.attention.num_heads, dtype="float32")[h]
            only_h = block.attention(b["x"], query_mask=mask, value_mask=mask, head_mask=gate)
            np.testing.assert_allclose(
                b["heads"][..., h * d_v : (h + 1) * d_v] @ w_o[h * d_v : (h + 1) * d_v],
                np.asarray(only_h) - np.asarray(block.attention.output_bias),
                atol=1e-5,
            )
        out = np.asarray(block(b["x"], mask=mask))
        if i + 1 < len(blocks):
            np.testing.assert_allclose(t["blocks"][i + 1]["x"], out, atol=1e-6)
    np.testing.assert_allclose(t["blocks"][0]["hidden"].min(), 0.0)  # after the ReLU


def test_refit_is_least_squares_over_the_given_rows():
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(60, 5))
    targets = inputs @ rng.normal(size=(5, 3)) + 0.3 * rng.normal(size=(60, 3))
    rows = rng.random(60) < 0.6
    kernel = keras.Variable(np.ones((5, 3), "float32"))
    bias = keras.Variable(np.ones((3,), "float32"))
    heads._refit(kernel, bias, inputs, targets, rows, ridge=0.0)
    a = np.concatenate([inputs[rows], np.ones((rows.sum(), 1))], axis=1)
    expected, *_ = np.linalg.lstsq(a, targets[rows], rcond=None)
    np.testing.assert_allclose(np.asarray(kernel), expected[:5], atol=1e-5)
    np.testing.assert_allclose(np.asarray(bias), expected[5], atol=1e-5)
    # The ridge is relative to the inputs' scale: 100x the inputs, 1/100 the kernel.
    for scale in (1.0, 100.0):
        kernel.assign(np.zeros((5, 3), "float32"))
        bias.assign(np.zeros((3,), "float32"))
        heads._refit(kernel, bias, scale * inputs, targets, None, ridge=0.5)
        fitted = scale * inputs @ np.asarray(kernel) + np.asarray(bias)
        if scale == 1.0:
            reference = fitted
        else:
            np.testing.assert_allclose(fitted, reference, atol=1e-4)
    # ... and it does pull: the fit is worse than the unpenalised one on the same rows.
    a_all = np.concatenate([inputs, np.ones((60, 1))], axis=1)
    free, *_ = np.linalg.lstsq(a_all, targets, rcond=None)
    assert np.sum((reference - targets) ** 2) > 1.05 * np.sum((a_all @ free - targets) ** 2)
    # A huge ridge keeps the current weights.
    kernel.assign(np.full((5, 3), 0.25, "float32"))
    heads._refit(kernel, None, inputs, targets, None, ridge=1e9)
    np.testing.assert_allclose(np.asarray(kernel), 0.25, atol=1e-6)


def test_refit_does_not_fit_an_input_that_fires_once():
    """A ReLU unit active on one row of 60 gets the median input's pull, not its own."""
    rng = np.random.default_rng(1)
    inputs, targets = rng.normal(size=(60, 5)), rng.normal(size=(60, 3))
    inputs[:, 4] = 0.0
    inputs[7, 4] = 0.01  # fires once, weakly
    inputs = np.concatenate([inputs, np.zeros((60, 1))], axis=1)  # and one that never fires
    kernel = keras.Variable(np.full((6, 3), 0.5, "float32"))
    heads._refit(kernel, None, inputs, targets, None, ridge=1e-4)
    w = np.asarray(kernel)
    np.testing.assert_allclose(w[5], 0.5, atol=1e-6)  # never fired: unchanged
    # Unpenalised, it would fit row 7's residual with a weight ~100x the residual.
    free, *_ = np.linalg.lstsq(inputs[:, :5], targets, rcond=None)
    assert np.abs(free[4] - 0.5).max() > 50
    assert np.abs(w[4] - 0.5).max() < np.abs(free[4] - 0.5).max() / 20
    np.testing.assert_allclose(w[:4], free[:4], atol=0.1)  # the others are fit normally


def test_reconstruct_recovers_a_duplicated_head():
    """Head 3 is a copy of head 2: W^O_2 + W^O_3 on head 2 alone is exact."""
    model = tiny_model()
    duplicate_head(attention_layers(model)[0], src=2, dst=3)
    x_fit, _ = digits_like(n=200, seed=5)
    x, _ = digits_like(n=50, seed=6)  # held out from the fit
    full = np.asarray(model(x))
    plain = heads.prune_model(model, {0: [3]})
    assert np.abs(np.asarray(plain(x)) - full).max() > 1e-2  # head 3 mattered
    exact = heads.reconstruct(model, heads.prune_model(model, {0: [3]}), x_fit, ridge=1e-8)
    np.testing.assert_allclose(np.asarray(exact(x)), full, atol=1e-5)
    kept = attention_layers(model)[0].head_weights(2)["output_kernel"]
    dropped = attention_layers(model)[0].head_weights(3)["output_kernel"]
    np.testing.assert_allclose(
        attention_layers(exact)[0].head_weights(2)["output_kernel"], kept + dropped, atol=1e-3
    )
    # The default ridge pulls towards the old weights: close, not exact.
    default = heads.reconstruct(model, heads.prune_model(model, {0: [3]}), x_fit)
    assert np.abs(np.asarray(default(x)) - full).max() < 1e-3


def test_every_refit_is_the_least_squares_optimum_of_its_drift_target():
    """After `reconstruct`, each refit map solves its own least-squares problem.

    Block l's W^O maps the pruned model's Concat to x_l + A_l - x'_l (the
    original's LayerNorm input minus the pruned model's residual), its FFN
    output Dense maps the hidden layer to m_l + F_l - m'_l, the classifier
    maps the pooled features to the original's logits; real tokens only.
    """
    model = tiny_model(input_kind="tokens", sequence_length=6, feature_dim=12, num_classes=3)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 12, (300, 6))
    ids[np.arange(6)[None] >= rng.integers(1, 7, (300, 1))] = 0
    ids = ids.astype("int32")
    pruned = heads.reconstruct(model, heads.prune_model(model, {0: [0, 2]}), ids, ridge=1e-9)
    t, s = heads.trace(model, ids), heads.trace(pruned, ids)
    rows = t["mask"].reshape(-1)

    def assert_optimal(layer_kernel, layer_bias, inputs, target, rows):
        a = inputs.reshape(-1, inputs.shape[-1]).astype("float64")
        y = target.reshape(-1, target.shape[-1]).astype("float64")
        if rows is not None:
            a, y = a[rows], y[rows]
        a = np.concatenate([a, np.ones((len(a), 1))], axis=1)
        best, *_ = np.linalg.lstsq(a, y, rcond=None)
        w = np.concatenate([np.asarray(layer_kernel), np.asarray(layer_bias)[None]])
        optimum, reached = np.sum((a @ best - y) ** 2), np.sum((a @ w - y) ** 2)
        assert reached - optimum <= 1e-4 * optimum + 1e-7 * np.sum(y**2), (reached, optimum)

    for i, block in enumerate(encoder_blocks(pruned)):
        tb, sb = t["blocks"][i], s["blocks"][i]
        attention = block.attention
        target = tb["x"] + tb["attended"] - sb["x"]
        assert_optimal(attention.output_kernel, attention.output_bias, sb["heads"], target, rows)
        target = tb["mid"] + tb["ffn"] - sb["mid"]
        assert_optimal(block._ffn_out.kernel, block._ffn_out.bias, sb["hidden"], target, rows)
    classifier = pruned.get_layer("classifier")
    assert_optimal(classifier.kernel, classifier.bias, s["pooled"], t["logits"], None)
    # Block 1 lost no head, yet its maps moved to absorb block 0's drift.
    before = encoder_blocks(model)[1].attention.output_kernel
    assert (
        np.abs(np.asarray(encoder_blocks(pruned)[1].attention.output_kernel) - before).max() > 1e-3
    )


def test_reconstruct_leaves_padding_out_and_fits_token_models():
    model = tiny_model(input_kind="tokens", sequence_length=6, feature_dim=12, num_classes=3)
    duplicate_head(attention_layers(model)[1], src=1, dst=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 12, (300, 6))
    ids[np.arange(6)[None] >= rng.integers(1, 7, (300, 1))] = 0  # lengths 1..6
    ids = ids.astype("int32")
    full = np.asarray(model(ids[:40]))
    pruned = heads.reconstruct(model, heads.prune_model(model, {1: [0]}), ids[40:], ridge=1e-8)
    np.testing.assert_allclose(np.asarray(pruned(ids[:40])), full, atol=1e-5)


def test_reconstruct_keeps_a_model_with_nothing_removed():
    model = tiny_model()
    copy = heads.prune_model(model, {})
    x, _ = digits_like(n=100, seed=7)
    heads.reconstruct(model, copy, x)
    for new, old in zip(copy.weights, model.weights):
        np.testing.assert_allclose(np.asarray(new), np.asarray(old), atol=1e-5)


def test_reconstruct_shrinks_the_logit_error_on_held_out_examples():
    model = tiny_model()
    pruned = heads.prune_model(model, {0: [0, 1], 1: [2]})
    x_fit, _ = digits_like(n=200, seed=8)
    x, _ = digits_like(n=50, seed=9)
    target = heads.trace(model, x)["logits"]
    before = np.mean((heads.trace(pruned, x)["logits"] - target) ** 2)
    heads.reconstruct(model, pruned, x_fit)
    after = np.mean((heads.trace(pruned, x)["logits"] - target) ** 2)
    assert before > 1e-2 and after < before / 100  # measured 0.11 -> 1.8e-5
    with pytest.raises(ValueError, match="same blocks"):
        heads.reconstruct(build_classifier(ModelConfig(d_model=16, ff_dim=16)), pruned, x_fit)


# ----------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_cli_importance_curve_prune_plot(digits_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(digits_run, run)
    assert heads.main(["importance", str(run)]) == 0
    result = json.loads((run / "heads" / "importance.json").read_text())
    n_heads = sum(heads.heads_per_layer(keras.saving.load_model(run / "model.keras")))
    assert len(result["heads"]) == n_heads
    for row in result["heads"]:
        assert 0.0 <= row["accuracy_without"] <= 1.0
        assert row["importance"] >= 0.0
    assert (run / "heads" / "importance.png").stat().st_size > 1000

    assert heads.main(["curve", str(run), "--step", "0.5"]) == 0
    curve = json.loads((run / "heads" / "curve.json").read_text())["points"]
    assert curve[0]["fraction"] == 0.0
    assert curve[0]["accuracy"] == pytest.approx(result["test_accuracy"])
    fractions = [p["fraction"] for p in curve]
    assert fractions == sorted(set(fractions)) and fractions[-1] < 1.0
    # Reconstructing a model with nothing removed changes nothing.
    assert curve[0]["accuracy_reconstructed"] == pytest.approx(curve[0]["accuracy"])
    assert all(0.0 <= p["accuracy_reconstructed"] <= 1.0 for p in curve)

    out = tmp_path / "pruned"
    assert heads.main(["prune", str(run), "--fraction", "0.5", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pruning"]["heads_after"] == [n_heads - 1]
    assert metrics["pruning"]["params_after"] < metrics["pruning"]["params_before"]
    assert metrics["test_accuracy"] == pytest.approx(
        metrics["pruning"]["test_accuracy_reconstructed"]
    )
    sizes = metrics["samples"]
    assert metrics["pruning"]["reconstruction"] == {
        "split": "train",
        "examples": sizes["train"],
        "ridge": heads.RIDGE,
    }
    with np.load(out / "eval.npz") as ev, np.load(run / "eval.npz") as src:
        np.testing.assert_array_equal(ev["x"], src["x"])
        pruned_model = keras.saving.load_model(out / "model.keras")
        np.testing.assert_allclose(np.asarray(pruned_model(ev["x"])), ev["probs"], atol=1e-6)
        assert metrics["test_accuracy"] == pytest.approx(
            float((ev["probs"].argmax(-1) == ev["y"]).mean())
        )
    for name in ("calibration.npz", "labels.json"):
        assert (out / name).is_file()

    # Without reconstruction the pruned model is the original with the head masked.
    plain = tmp_path / "plain"
    argv = ["prune", str(run), "--fraction", "0.5", "--no-reconstruct", "--out", str(plain)]
    assert heads.main(argv) == 0
    pruning = json.loads((plain / "metrics.json").read_text())["pruning"]
    assert pruning["reconstruction"] is None and pruning["test_accuracy_reconstructed"] is None
    assert pruning["removed"] == metrics["pruning"]["removed"]
    (layer, head) = pruning["removed"][0]
    gates = [np.ones(n_heads, "float32")]
    gates[layer][head] = 0.0
    original = keras.saving.load_model(run / "model.keras")
    with np.load(plain / "eval.npz") as ev:
        masked = np.asarray(forward(original, ev["x"], head_masks=gates))
        np.testing.assert_allclose(ev["probs"], masked, atol=1e-5)
        with np.load(out / "eval.npz") as reconstructed:
            assert np.abs(reconstructed["probs"] - ev["probs"]).max() > 1e-3

    assert heads.main(["plot", str(run), "--sample", "2"]) == 0
    assert (run / "heads" / "heads_sample2.png").stat().st_size > 1000


@pytest.fixture(scope="module")
def augmented_run(tmp_path_factory):
    """A short digits run with dropout and the shifted copies, for the fine-tune paths."""
    from keras_mha.train import train

    out = tmp_path_factory.mktemp("augmented") / "run"
    options = dict(d_model=16, num_heads=2, num_layers=1, ff_dim=32, pooling="mean")
    train("digits", out, epochs=3, shift_augment=True, dropout=0.1, verbose=0, **options)
    return out


@pytest.mark.slow
def test_importance_and_curve_on_either_split(augmented_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(augmented_run, run)
    assert heads.main(["importance", str(run)]) == 0  # the training split by default
    on_train = json.loads((run / "heads" / "importance.json").read_text())
    assert heads.main(["importance", str(run), "--split", "validation"]) == 0
    on_val = json.loads((run / "heads" / "importance.json").read_text())
    sizes = json.loads((run / "metrics.json").read_text())["samples"]
    assert (on_train["split"], on_val["split"]) == ("train", "validation")
    # The training split as drawn, not the 5x larger augmented set.
    assert sizes["train_augmented"] == 5 * sizes["train"]
    assert (on_train["split_size"], on_val["split_size"]) == (sizes["train"], sizes["validation"])
    train_scores = [r["importance"] for r in on_train["heads"]]
    val_scores = [r["importance"] for r in on_val["heads"]]
    assert not np.allclose(train_scores, val_scores, atol=1e-4)
    # Files a user can share: a normal file's mode, not a temp file's 0600.
    umask = os.umask(0)
    os.umask(umask)
    assert (run / "heads" / "importance.json").stat().st_mode & 0o777 == 0o666 & ~umask

    argv = ["curve", str(run), "--split", "validation", "--step", "0.5", "--no-reconstruct"]
    assert heads.main(argv) == 0
    curve = json.loads((run / "heads" / "curve.json").read_text())
    assert curve["split"] == "validation" and curve["reconstruction"] is None
    assert all("accuracy_reconstructed" not in p for p in curve["points"])
    assert curve["points"][0]["accuracy"] == pytest.approx(on_train["test_accuracy"])


@pytest.mark.slow
def test_finetuned_pruning_is_deterministic_across_processes(augmented_run, tmp_path):
    argv = ["prune", str(augmented_run), "--fraction", "0.5", "--split", "validation"]
    finetune = ["--finetune-epochs", "2"]
    assert heads.main([*argv, *finetune, "--out", str(tmp_path / "a")]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha.heads", *argv, *finetune, "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert heads.main([*argv, "--out", str(tmp_path / "c")]) == 0  # no fine-tune
    pruning = [json.loads((tmp_path / n / "metrics.json").read_text())["pruning"] for n in "abc"]
    assert pruning[0]["removed"] == pruning[1]["removed"] == pruning[2]["removed"]
    with np.load(tmp_path / "a" / "eval.npz") as a, np.load(tmp_path / "b" / "eval.npz") as b:
        np.testing.assert_array_equal(a["probs"], b["probs"])
        with np.load(tmp_path / "c" / "eval.npz") as c:  # the fine-tune changed the model
            assert np.abs(a["probs"] - c["probs"]).max() > 1e-3
    assert pruning[0]["importance_split"] == "validation"
    assert pruning[0]["finetune_epochs"] == 2 and pruning[0]["finetune_learning_rate"] == 5e-4
    assert pruning[0]["finetune"] == pruning[1]["finetune"] and pruning[0]["finetune"]["improved"]
    assert pruning[2]["finetune"] is None
    assert pruning[0]["test_accuracy_finetuned"] == pruning[1]["test_accuracy_finetuned"]
    assert pruning[2]["test_accuracy_finetuned"] is None
    drop = pruning[0]["test_drop"]  # of the fine-tuned model against the source run
    expected = 100 * (pruning[0]["test_accuracy_before"] - pruning[0]["test_accuracy_finetuned"])
    assert drop["points"] == pytest.approx(expected, abs=1e-9)
    assert drop["lost"] - drop["gained"] == round(expected * drop["examples"] / 100)
    assert drop["ci95_points"][0] <= drop["points"] <= drop["ci95_points"][1]
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o777 & ~umask


def test_paired_drop_counts_and_bootstraps():
    before = np.array([True] * 90 + [False] * 10)
    after = before.copy()
    after[:4] = False  # 4 lost
    after[95] = True  # 1 gained
    drop = heads.paired_drop(before, after)
    assert drop["points"] == pytest.approx(3.0)
    assert (drop["lost"], drop["gained"], drop["examples"]) == (4, 1, 100)
    low, high = drop["ci95_points"]
    # Normal approximation: sd of the mean difference = sqrt((0.05 - 0.03**2) / 100).
    half = 1.96 * 100 * np.sqrt((0.05 - 0.03**2) / 100)  # 4.3 points
    assert low == pytest.approx(3.0 - half, abs=1.0) and high == pytest.approx(3.0 + half, abs=1.0)
    assert low < 0.0  # 4 lost against 1 gained of 100 is not enough to call it a drop
    assert heads.paired_drop(before, after) == drop  # seeded
    same = heads.paired_drop(before, before)
    assert (same["points"], same["ci95_points"]) == (0.0, [0.0, 0.0])
    with pytest.raises(ValueError, match="same, non-zero length"):
        heads.paired_drop(before, after[:-1])


@pytest.mark.slow
def test_finetune_keeps_the_start_when_no_epoch_beats_it(augmented_run):
    model, metrics, _ = heads.load_run(augmented_run)
    data = heads.run_dataset(metrics)
    start = [w.copy() for w in model.get_weights()]
    # A learning rate of 5 wrecks every epoch: the starting weights stay.
    result = heads.finetune(model, data, metrics, epochs=1, learning_rate=5.0)
    assert result["improved"] is False and result["best_epoch"] == 0
    assert result["best_val_loss"] == result["start_val_loss"]
    for now, before in zip(model.get_weights(), start):
        np.testing.assert_array_equal(now, before)
    # The 3-epoch run is far from converged: a gentle fine-tune improves it.
    result = heads.finetune(model, data, metrics, epochs=2, learning_rate=1e-3)
    assert result["improved"] is True and result["best_epoch"] in (1, 2)
    assert result["best_val_loss"] < result["start_val_loss"]
    loss = model.evaluate(data.x_val, data.y_val, verbose=0)[0]
    assert loss == pytest.approx(result["best_val_loss"], rel=1e-4)


def test_finetune_refuses_no_epochs():
    with pytest.raises(ValueError, match="epochs >= 1"):
        heads.finetune(None, None, {}, epochs=0)


@pytest.mark.slow
def test_cli_bad_input(digits_run, tmp_path, capsys):
    def fails(argv, match):
        capsys.readouterr()
        assert heads.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert match in err, err

    fails(["importance", str(tmp_path / "nope")], "not a run directory")
    with pytest.raises(SystemExit) as usage:  # argparse: one line too
        heads.main(["prune", str(digits_run)])
    assert usage.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "required: --fraction, --out" in err, err
    with pytest.raises(SystemExit) as usage:
        heads.main(["importance", str(digits_run), "--split", "test"])
    assert usage.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "invalid choice: 'test'" in err, err
    fails(
        ["prune", str(digits_run), "--fraction", "0.5", "--finetune-lr", "0", "--out", "o"],
        "--finetune-lr must be > 0",
    )
    fails(["prune", str(digits_run), "--fraction", "1.0", "--out", str(tmp_path / "o")], "[0, 1)")
    fails(["prune", str(digits_run), "--fraction", "-0.1", "--out", str(tmp_path / "o")], "[0, 1)")
    fails(
        ["prune", str(digits_run), "--fraction", "0.9", "--out", str(tmp_path / "o")],
        "removes 2 of 2 heads, which would leave a layer with no head",
    )
    assert not (tmp_path / "o").exists()
    assert not list(tmp_path.glob(".o.*"))  # no half-written temp dir left
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    fails(
        ["prune", str(digits_run), "--fraction", "0.5", "--out", str(tmp_path / "full")],
        "pass --overwrite",
    )
    assert (tmp_path / "full" / "x").read_text() == "keep"
    fails(["plot", str(digits_run), "--sample", "100000"], "--sample must be in")

    # A run whose model has no keras_mha attention.
    plain = tmp_path / "plain"
    shutil.copytree(digits_run, plain)
    inputs = keras.Input((8, 8))
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))
    model.save(plain / "model.keras")
    fails(["importance", str(plain)], "no TransformerEncoderBlock")
    (plain / "model.keras").write_bytes(b"not a zip")
    fails(["importance", str(plain)], "cannot load the model")


def test_keras_anchor_classifier_equals_ours_with_the_same_weights():
    """implementation="keras" swaps in keras.layers.MultiHeadAttention (benchmarks)."""
    from keras_mha import MultiHeadAttention

    anchor = build_classifier(
        ModelConfig(d_model=16, num_heads=4, num_layers=2, ff_dim=16, implementation="keras")
    )
    ours = build_classifier(ModelConfig(d_model=16, num_heads=4, num_layers=2, ff_dim=16))
    for layer in anchor.layers:
        if not layer.weights:
            continue
        target = ours.get_layer(layer.name)
        if hasattr(layer, "attention"):
            assert isinstance(layer.attention, keras.layers.MultiHeadAttention)
            target.attention.set_weights(
                MultiHeadAttention.from_keras(layer.attention).get_weights()
            )
            for name in ("attention_norm", "ffn_norm", "_ffn_in", "_ffn_out"):
                getattr(target, name).set_weights(getattr(layer, name).get_weights())
        else:
            target.set_weights(layer.get_weights())
    x, _ = digits_like(n=5, seed=4)
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(anchor(x)), atol=1e-5)
    assert anchor.count_params() == ours.count_params()
