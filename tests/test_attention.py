"""keras_mha.MultiHeadAttention: the lesson's numbers, Keras parity, Keras citizenship."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_mha import MultiHeadAttention

RNG = np.random.default_rng(0)


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def lesson_mha(layer: MultiHeadAttention, q, k, v, mask=None):
    """The lesson's equations in plain numpy, from the layer's per-head weights."""
    heads, weights = [], []
    for i in range(layer.num_heads):
        w = layer.head_weights(i)
        qi = q @ w["query_kernel"] + w["query_bias"]  # Q W_i^Q
        ki = k @ w["key_kernel"] + w["key_bias"]  # K W_i^K
        vi = v @ w["value_kernel"] + w["value_bias"]  # V W_i^V
        scores = qi @ ki.transpose(0, 2, 1) / np.sqrt(layer.d_k)
        if mask is not None:
            scores = np.where(mask, scores, -1e30)
        a = softmax(scores)
        if mask is not None:
            a = np.where(mask, a, 0.0)
        heads.append(a @ vi)
        weights.append(a)
    concat = np.concatenate(heads, axis=-1)  # Concat(head_1, ..., head_h)
    w_o = keras.ops.convert_to_numpy(layer.output_kernel)
    b_o = keras.ops.convert_to_numpy(layer.output_bias)
    return concat @ w_o + b_o, np.stack(weights, axis=1)


# --------------------------------------------------------------------- basics
def test_basics_shapes_weights_and_config():
    layer = MultiHeadAttention(num_heads=4, name="mha")
    x = randn(2, 5, 16)
    y, scores = layer(x, return_attention_scores=True)
    assert y.shape == (2, 5, 16)
    assert scores.shape == (2, 4, 5, 5)
    assert (layer.d_model, layer.d_k, layer.d_v) == (16, 4, 4)
    shapes = {w.path.split("/")[-1]: tuple(w.shape) for w in layer.weights}
    assert shapes == {
        "query_kernel": (4, 16, 4),
        "query_bias": (4, 4),
        "key_kernel": (4, 16, 4),
        "key_bias": (4, 4),
        "value_kernel": (4, 16, 4),
        "value_bias": (4, 4),
        "output_kernel": (16, 16),
        "output_bias": (16,),
    }
    # Same parameter count as Keras's layer with the same sizes.
    ref = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4)
    ref(x, x)
    assert layer.count_params() == ref.count_params() == 4 * 16 * 4 * 4 + 3 * 16 + 16
    clone = MultiHeadAttention.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    assert layer.compute_output_shape((None, 7, 16)) == (None, 7, 16)
    np.testing.assert_allclose(np.asarray(scores).sum(-1), 1.0, atol=1e-6)


def test_lesson_default_dims_768_by_12_is_64():
    layer = MultiHeadAttention(num_heads=12)
    layer.build((None, None, 768))
    assert layer.d_k == layer.d_v == 64
    assert tuple(layer.query_kernel.shape) == (12, 768, 64)
    assert tuple(layer.output_kernel.shape) == (12 * 64, 768)


def test_hand_sized_case_matches_numpy_lesson():
    """2 heads, d_model 4, 3 tokens: the layer equals the equations in numpy."""
    layer = MultiHeadAttention(num_heads=2, bias_initializer="random_normal")
    x = randn(1, 3, 4, seed=1)
    for implementation in ("fused", "per_head"):
        layer.implementation = implementation
        y, scores = layer(x, return_attention_scores=True)
        ref_y, ref_scores = lesson_mha(layer, x, x, x)
        np.testing.assert_allclose(np.asarray(y), ref_y, atol=1e-6)
        np.testing.assert_allclose(np.asarray(scores), ref_scores, atol=1e-6)


def test_hand_built_weights_give_known_numbers():
    """W^Q = 0 makes every head attend uniformly: output = mean_s(x_s W_i^V) W^O."""
    layer = MultiHeadAttention(num_heads=2, use_bias=False)
    layer.build((None, None, 4))
    layer.query_kernel.assign(np.zeros((2, 4, 2), "float32"))
    layer.key_kernel.assign(np.ones((2, 4, 2), "float32"))
    eye = np.eye(4, dtype="float32")
    layer.value_kernel.assign(np.stack([eye[:, :2], eye[:, 2:]]))  # head 0: x[:2], head 1: x[2:]
    layer.output_kernel.assign(2 * eye)  # W^O doubles the concatenation
    x = np.array([[[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 0, 3]]], "float32")
    y, scores = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(scores), np.full((1, 2, 3, 3), 1 / 3), atol=1e-7)
    expected = np.tile(2 * x.mean(axis=1, keepdims=True), (1, 3, 1))  # [[4, 5.333, 6.667, 10]]
    np.testing.assert_allclose(np.asarray(y), expected, atol=1e-5)
    assert np.isclose(float(y[0, 0, 3]), 10.0)


# ------------------------------------------------------------ Keras parity
def _padding_mask(batch, length, seed):
    lengths = np.random.default_rng(seed).integers(1, length + 1, size=batch)
    return np.arange(length)[None, :] < lengths[:, None]  # (B, S)


PARITY_GRID = [
    # heads, d_model, T, S, d_kv_in, mask kind, causal
    pytest.param(1, 8, 5, 5, None, None, False, id="1head-self"),
    pytest.param(2, 8, 5, 5, None, "padding", False, id="2heads-self-padding"),
    pytest.param(4, 16, 6, 6, None, None, True, id="4heads-causal"),
    pytest.param(4, 16, 6, 6, None, "padding", True, id="4heads-padding+causal"),
    pytest.param(8, 32, 7, 7, None, "random", False, id="8heads-random-mask"),
    pytest.param(2, 12, 4, 9, 6, None, False, id="cross-T4-S9-dv6"),
    pytest.param(3, 12, 4, 9, 10, "padding", False, id="cross-padding"),
    pytest.param(4, 16, 5, 7, 16, "random", True, id="cross-random+causal"),
]


@pytest.mark.parametrize("heads,d_model,t,s,d_kv,mask_kind,causal", PARITY_GRID)
@pytest.mark.parametrize("implementation", ["fused", "per_head"])
def test_parity_with_keras_multi_head_attention(
    heads, d_model, t, s, d_kv, mask_kind, causal, implementation
):
    batch = 3
    query = randn(batch, t, d_model, seed=2)
    value = query if d_kv is None else randn(batch, s, d_kv, seed=3)
    mask = None
    if mask_kind == "padding":
        key_ok = _padding_mask(batch, s, seed=4)
        mask = np.broadcast_to(key_ok[:, None, :], (batch, t, s))
    elif mask_kind == "random":
        mask = np.random.default_rng(5).random((batch, t, s)) > 0.4
    keras.utils.set_random_seed(7)
    ref = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)
    ref(query, value)
    ours = MultiHeadAttention.from_keras(ref, implementation=implementation)
    want, want_scores = ref(
        query, value, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
    )
    got, got_scores = ours(
        query, value, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_scores), np.asarray(want_scores), atol=1e-5)
    # Keras's fast path (no scores requested) agrees on every query row that
    # may attend somewhere (rows with nothing allowed are undefined there).
    fast = np.asarray(ref(query, value, attention_mask=mask, use_causal_mask=causal))
    allowed = np.ones((batch, t, s), bool) if mask is None else mask.copy()
    if causal:
        allowed &= np.tril(np.ones((t, s), bool))
    rows = allowed.any(-1)
    np.testing.assert_allclose(np.asarray(got)[rows], fast[rows], atol=1e-5)


def test_parity_with_keras_masks_carried_by_inputs():
    """Embedding(mask_zero=True) masks flow in the same way as into Keras's layer."""
    ids = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0], [1, 2, 3, 4, 5]])
    keras.utils.set_random_seed(1)
    embed = keras.layers.Embedding(10, 8, mask_zero=True)
    ref = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    x = embed(ids)
    ref(x, x)
    ours = MultiHeadAttention.from_keras(ref)
    # Keras's layer clears the mask on its inputs, so embed afresh for each call.
    x = embed(ids)
    want = np.asarray(ref(x, x, return_attention_scores=True)[0])
    x = embed(ids)
    got = ours(x)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    # The output carries the query's mask, as Keras's does.
    np.testing.assert_array_equal(np.asarray(got._keras_mask), ids > 0)
    # Padded keys are never attended to: changing padded embeddings changes nothing valid.
    explicit = (ids > 0)[:, None, :] & (ids > 0)[:, :, None]
    x_plain = np.asarray(embed(ids))
    noisy = np.where((ids > 0)[..., None], x_plain, 100.0).astype("float32")
    np.testing.assert_allclose(
        np.asarray(ours(noisy, attention_mask=explicit))[ids > 0],
        np.asarray(got)[ids > 0],
        atol=1e-5,
    )


def test_to_keras_round_trip_reproduces_outputs():
    ours = MultiHeadAttention(num_heads=3, key_dim=5, value_dim=7, output_dim=11)
    q, v = randn(2, 4, 9, seed=8), randn(2, 6, 13, seed=9)
    want = np.asarray(ours(q, v))
    ref = ours.to_keras()
    np.testing.assert_allclose(np.asarray(ref(q, v)), want, atol=1e-5)
    back = MultiHeadAttention.from_keras(ref)
    np.testing.assert_allclose(np.asarray(back(q, v)), want, atol=1e-6)


# ------------------------------------------------------ the two computations
@pytest.mark.parametrize("causal", [False, True], ids=["no-causal", "causal"])
def test_per_head_equals_fused(causal):
    fused = MultiHeadAttention(num_heads=4, implementation="fused", bias_initializer="ones")
    per_head = MultiHeadAttention(num_heads=4, implementation="per_head")
    q, v = randn(3, 6, 16, seed=10), randn(3, 8, 12, seed=11)
    mask = np.random.default_rng(12).random((3, 6, 8)) > 0.3
    fused(q, v)
    per_head(q, v)
    per_head.set_weights(fused.get_weights())
    a, sa = fused(q, v, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True)
    b, sb = per_head(
        q, v, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
    )
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    np.testing.assert_allclose(np.asarray(sa), np.asarray(sb), atol=1e-6)
    assert np.abs(np.asarray(a)).max() > 0.1  # not trivially zero


@pytest.mark.parametrize("implementation", ["fused", "per_head"])
def test_concat_heads_is_what_w_o_multiplies(implementation):
    layer = MultiHeadAttention(
        num_heads=4, implementation=implementation, bias_initializer="random_normal"
    )
    q, v = randn(3, 6, 16, seed=20), randn(3, 8, 12, seed=21)
    mask = np.random.default_rng(22).random((3, 6, 8)) > 0.3
    out = np.asarray(layer(q, v, attention_mask=mask, use_causal_mask=True))
    concat = np.asarray(layer.concat_heads(q, v, attention_mask=mask, use_causal_mask=True))
    assert concat.shape == (3, 6, 4 * layer.d_v)
    w_o, b_o = np.asarray(layer.output_kernel), np.asarray(layer.output_bias)
    np.testing.assert_allclose(concat @ w_o + b_o, out, atol=1e-5)
    # Head i fills columns i*d_v:(i+1)*d_v: the lesson's numpy head 2, and
    # nothing else when only head 2 is on.
    w = layer.head_weights(2)
    allowed = np.tril(np.ones((6, 8), bool))[None] & mask
    scores = (
        (q @ w["query_kernel"] + w["query_bias"])
        @ (v @ w["key_kernel"] + w["key_bias"]).transpose(0, 2, 1)
        / np.sqrt(layer.d_k)
    )
    # A row with nothing allowed gets zero weights, as in Keras.
    weights = softmax(np.where(allowed, scores, -1e9)) * allowed
    head_2 = weights @ (v @ w["value_kernel"] + w["value_bias"])
    d_v = layer.d_v
    np.testing.assert_allclose(concat[..., 2 * d_v : 3 * d_v], head_2, atol=1e-5)
    only_2 = np.asarray(
        layer.concat_heads(
            q, v, attention_mask=mask, use_causal_mask=True, head_mask=np.eye(4, dtype="float32")[2]
        )
    )
    np.testing.assert_allclose(only_2[..., 2 * d_v : 3 * d_v], head_2, atol=1e-5)
    assert np.abs(np.delete(only_2, np.s_[2 * d_v : 3 * d_v], axis=-1)).max() == 0.0
    # Like a call: numpy float64 inputs are cast; an unbuilt layer says so.
    as_f64 = layer.concat_heads(
        q.astype("float64"), v.astype("float64"), attention_mask=mask, use_causal_mask=True
    )
    np.testing.assert_allclose(np.asarray(as_f64), concat, atol=1e-6)
    with pytest.raises(ValueError, match="needs a built layer"):
        MultiHeadAttention(num_heads=2).concat_heads(q)


def test_gradients_reach_every_head_and_w_o():
    import tensorflow as tf

    for implementation in ("fused", "per_head"):
        layer = MultiHeadAttention(num_heads=4, implementation=implementation)
        x = tf.constant(randn(2, 5, 8, seed=13))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) ** 2)
        grads = dict(
            zip(
                [w.path.split("/")[-1] for w in layer.trainable_weights],
                tape.gradient(loss, layer.trainable_weights),
            )
        )
        for name in ("query_kernel", "key_kernel", "value_kernel", "query_bias", "value_bias"):
            per_head = np.abs(grads[name].numpy()).reshape(4, -1).sum(-1)
            assert (per_head > 1e-6).all(), (implementation, name, per_head)
        w_o = np.abs(grads["output_kernel"].numpy()).reshape(4, 2, 8).sum((1, 2))
        assert (w_o > 1e-6).all()
        # Key bias shifts every score of a row equally: softmax ignores it.
        assert np.abs(grads["key_bias"].numpy()).max() < 1e-5


def test_head_mask_silences_a_head_and_pruning_removes_it():
    layer = MultiHeadAttention(num_heads=4, bias_initializer="random_normal")
    x = randn(2, 5, 8, seed=14)
    full = np.asarray(layer(x))
    masked = np.asarray(layer(x, head_mask=np.array([1, 0, 1, 0], "float32")))
    assert np.abs(masked - full).max() > 1e-3
    pruned = layer.pruned([0, 2])
    assert pruned.num_heads == 2 and pruned.d_k == layer.d_k
    assert pruned.count_params() == layer.count_params() - 2 * (3 * 8 * 2 + 3 * 2) - 2 * 2 * 8
    np.testing.assert_allclose(np.asarray(pruned(x)), masked, atol=1e-6)
    w = layer.head_weights(2)
    np.testing.assert_array_equal(pruned.head_weights(1)["value_kernel"], w["value_kernel"])
    np.testing.assert_array_equal(pruned.head_weights(1)["output_kernel"], w["output_kernel"])


def test_dropout_only_in_training_and_deterministic_for_seed():
    x = randn(2, 6, 8, seed=15)
    layer = MultiHeadAttention(num_heads=2, dropout=0.5, seed=3)
    a = np.asarray(layer(x, training=False))
    b = np.asarray(layer(x))
    np.testing.assert_array_equal(a, b)
    c, scores = layer(x, training=True, return_attention_scores=True)
    assert np.abs(np.asarray(c) - a).max() > 1e-3
    # The returned scores are the attention weights before dropout.
    np.testing.assert_allclose(np.asarray(scores).sum(-1), 1.0, atol=1e-6)
    other = MultiHeadAttention(num_heads=2, dropout=0.5, seed=3)
    other(x)
    other.set_weights(layer.get_weights())
    layer2 = MultiHeadAttention(num_heads=2, dropout=0.5, seed=3)
    layer2(x)
    layer2.set_weights(layer.get_weights())
    np.testing.assert_array_equal(
        np.asarray(other(x, training=True)), np.asarray(layer2(x, training=True))
    )


def test_causal_mask_blocks_the_future():
    layer = MultiHeadAttention(num_heads=2)
    x = randn(1, 4, 8, seed=16)
    _, scores = layer(x, use_causal_mask=True, return_attention_scores=True)
    upper = np.triu(np.ones((4, 4), bool), k=1)
    assert np.abs(np.asarray(scores)[0][:, upper]).max() == 0.0
    # Changing a later token does not change earlier outputs.
    x2 = x.copy()
    x2[0, 3] += 5.0
    np.testing.assert_allclose(
        np.asarray(layer(x2, use_causal_mask=True))[0, :3],
        np.asarray(layer(x, use_causal_mask=True))[0, :3],
        atol=1e-6,
    )


# ------------------------------------------------------------ Keras citizen
def test_functional_sequential_and_fit():
    keras.utils.set_random_seed(0)
    x = randn(64, 6, 8, seed=17)
    y = (x[:, :, 0].mean(-1) > 0).astype("int32")
    inputs = keras.Input((6, 8))
    h = MultiHeadAttention(num_heads=2)(inputs)
    out = keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(inputs, out)
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    history = model.fit(x, y, epochs=30, batch_size=16, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] * 0.5
    seq = keras.Sequential(
        [keras.Input((6, 8)), MultiHeadAttention(num_heads=4), keras.layers.Flatten()]
    )
    assert seq(x).shape == (64, 48)


def test_save_load_round_trip_in_a_fresh_process(tmp_path):
    inputs = keras.Input((5, 8))
    h = MultiHeadAttention(num_heads=2, implementation="per_head", dropout=0.1, seed=4)(inputs)
    model = keras.Model(inputs, h)
    x = randn(3, 5, 8, seed=18)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", np.asarray(model(x)))
    model.save(tmp_path / "m.keras")
    script = textwrap.dedent(
        f"""
        import json, numpy as np, keras
        import keras_mha
        m = keras.saving.load_model({str(tmp_path / "m.keras")!r})
        layer = m.layers[1]
        got = np.asarray(m(np.load({str(tmp_path / "x.npy")!r})))
        want = np.load({str(tmp_path / "want.npy")!r})
        print(json.dumps({{"diff": float(np.abs(got - want).max()),
                          "cls": type(layer).__module__ + "." + type(layer).__name__,
                          "config": layer.get_config()}}))
        """
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["diff"] == 0.0
    assert result["cls"] == "keras_mha.attention.MultiHeadAttention"
    assert result["config"]["implementation"] == "per_head"
    assert result["config"]["dropout"] == 0.1


@pytest.mark.slow
def test_trains_under_mirrored_strategy_on_two_logical_cpus(tmp_path):
    script = textwrap.dedent(
        """
        import json, numpy as np, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras
        from keras_mha import MultiHeadAttention
        keras.utils.set_random_seed(0)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        x = np.random.default_rng(0).standard_normal((64, 6, 8)).astype("float32")
        y = (x[:, :, 0].mean(-1) > 0).astype("int32")
        with strategy.scope():
            inputs = keras.Input((6, 8))
            h = MultiHeadAttention(num_heads=2)(inputs)
            h = keras.layers.GlobalAveragePooling1D()(h)
            model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
            model.compile("adam", "sparse_categorical_crossentropy")
        hist = model.fit(x, y, epochs=5, batch_size=16, verbose=0)
        print(json.dumps({"replicas": strategy.num_replicas_in_sync,
                          "loss": hist.history["loss"]}))
        """
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert np.isfinite(result["loss"]).all()
    assert result["loss"][-1] < result["loss"][0]


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_heads": 0}, "argument `num_heads`.*Received: num_heads=0"),
        ({"num_heads": 2.0}, "argument `num_heads`"),
        ({"num_heads": True}, "argument `num_heads`"),
        ({"num_heads": 2, "key_dim": 0}, "argument `key_dim`"),
        ({"num_heads": 2, "value_dim": -3}, "argument `value_dim`"),
        ({"num_heads": 2, "output_dim": 0}, "argument `output_dim`"),
        ({"num_heads": 2, "dropout": 1.0}, r"argument `dropout`.*\[0, 1\)"),
        ({"num_heads": 2, "dropout": -0.1}, "argument `dropout`"),
        ({"num_heads": 2, "implementation": "loop"}, "argument `implementation`.*'loop'"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_bad_call_inputs():
    layer = MultiHeadAttention(num_heads=4)
    with pytest.raises(ValueError, match="d_model=10, num_heads=4"):
        layer(randn(2, 3, 10))
    layer = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match="`query` must be a rank-3"):
        layer(randn(2, 8))
    with pytest.raises(ValueError, match="`query` must be a rank-3"):
        layer(randn(2, 3, 4, 8))
    with pytest.raises(ValueError, match="same sequence length"):
        layer(randn(2, 3, 8), randn(2, 5, 8), randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"broadcastable to \(batch, T, S\)"):
        layer(randn(2, 3, 8), attention_mask=np.ones((2, 4, 3), bool))
    with pytest.raises(ValueError, match=r"broadcastable"):
        layer(randn(2, 3, 8), attention_mask=np.ones((1, 2, 3, 3), bool))
    layer(randn(2, 3, 8))
    with pytest.raises(ValueError, match="`query` has 6 features but the layer was built for 8"):
        layer(randn(2, 3, 6))
    with pytest.raises(ValueError, match="`head_mask`"):
        layer(randn(2, 3, 8), head_mask=np.ones(3, "float32"))
    with pytest.raises(ValueError, match="Head index"):
        layer.head_weights(2)
    with pytest.raises(ValueError, match="at least one head"):
        layer.pruned([])
    with pytest.raises(ValueError, match="keras.layers.MultiHeadAttention"):
        MultiHeadAttention.from_keras(keras.layers.Dense(3))
