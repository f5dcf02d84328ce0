"""Grouped-query attention on our layer: query head i reads key/value head
i // (h / h_kv), the lesson's three steps with the grouping explicit, against
Keras's GroupedQueryAttention with the same weights and against the equations
in numpy, on any backend (run on JAX and PyTorch by tests/keras_suite/run.py).
Keras's own test file for its layer runs against ours: tests/keras_suite/gqa_suite.py."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_mha import GroupedQueryAttention, MultiHeadAttention

npy = keras.ops.convert_to_numpy
IMPLS = pytest.mark.parametrize("implementation", ["fused", "per_head"])
B, T, S, D = 2, 5, 7, 12


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def assert_close(got, want, rtol=1e-5):
    got, want = npy(got), npy(want)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= rtol * scale, float(np.abs(got - want).max())


def keras_and_ours(implementation, h=6, h_kv=2, head_dim=4, **kwargs):
    """Keras's GroupedQueryAttention, built, and ours with its weights (same layout)."""
    keras.utils.set_random_seed(3)
    ref = keras.layers.GroupQueryAttention(
        head_dim=head_dim, num_query_heads=h, num_key_value_heads=h_kv, **kwargs
    )
    ref(randn(B, T, D), randn(B, S, D, seed=1))
    rng = np.random.default_rng(4)
    for w in ref.weights:  # nonzero biases too
        w.assign(rng.normal(0, 0.4, w.shape).astype("float32"))
    ours = GroupedQueryAttention(
        head_dim=head_dim,
        num_query_heads=h,
        num_key_value_heads=h_kv,
        implementation=implementation,
        **kwargs,
    )
    ours(randn(B, T, D), randn(B, S, D, seed=1))
    for name in ("query", "key", "value", "output"):
        for src, dst in zip(
            getattr(ref, f"_{name}_dense").weights,
            getattr(ours, f"_{name}_dense").weights,
            strict=True,
        ):
            dst.assign(src)
    return ref, ours


@IMPLS
@pytest.mark.parametrize("h,h_kv", [(6, 2), (6, 1), (6, 6), (4, 2)], ids=str)
def test_outputs_and_scores_are_keras_s(implementation, h, h_kv):
    ref, ours = keras_and_ours(implementation, h=h, h_kv=h_kv)
    q, v = randn(B, T, D, seed=5), randn(B, S, D, seed=6)
    mask = np.random.default_rng(7).random((B, T, S)) > 0.3
    mask[..., 0] = True
    want, want_scores = ref(q, v, attention_mask=mask, return_attention_scores=True)
    got, scores = ours(q, v, attention_mask=mask, return_attention_scores=True)
    assert_close(got, want)
    assert_close(scores, want_scores)
    assert tuple(scores.shape) == (B, h, T, S)
    assert_close(ours(q, v, use_causal_mask=True), ref(q, v, use_causal_mask=True))


@IMPLS
def test_the_lesson_s_equations_with_the_grouping_explicit(implementation):
    """head_i = softmax(Q W_i^Q (K W_g^K)^T / sqrt(d_k)) V W_g^V, g = i // (h / h_kv);
    output = Concat(head_1..head_h) W^O, from head_weights(i) in numpy."""
    _, layer = keras_and_ours(implementation, h=6, h_kv=2)
    q, v = randn(1, T, D, seed=8)[0], randn(1, S, D, seed=9)[0]
    heads = []
    for i in range(layer.num_heads):
        w = layer.head_weights(i)
        q_i = q @ w["query_kernel"] + w["query_bias"]
        k_g = v @ w["key_kernel"] + w["key_bias"]
        v_g = v @ w["value_kernel"] + w["value_bias"]
        scores = q_i @ k_g.T / np.sqrt(layer.d_k)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append((weights / weights.sum(-1, keepdims=True)) @ v_g)
    w_o = npy(layer.output_kernel).reshape(layer.num_heads * layer.d_v, -1)
    want = np.concatenate(heads, -1) @ w_o + npy(layer.output_bias)
    assert_close(layer(q[None], v[None])[0], want)
    # head i's key and value matrices are its group's: heads 0-2 share group 0
    kernel = npy(layer.key_kernel)
    assert kernel.shape == (D, 2, 4) and layer.group_size == 3
    np.testing.assert_array_equal(layer.head_weights(4)["key_kernel"], kernel[:, 1, :])
    np.testing.assert_array_equal(
        layer.head_weights(0)["value_kernel"], layer.head_weights(2)["value_kernel"]
    )


def test_h_kv_equal_to_h_is_multi_head_attention():
    _, grouped = keras_and_ours("fused", h=4, h_kv=4)
    mha = MultiHeadAttention(num_heads=4, key_dim=4)
    x, v = randn(B, T, D, seed=2), randn(B, S, D, seed=3)
    mha(x, v)
    mha.set_weights(grouped.get_weights())
    assert_close(mha(x, v), grouped(x, v))
    assert "num_key_value_heads" not in mha.get_config()  # plain MHA files as before


@IMPLS
def test_saves_loads_and_keeps_keras_s_config(implementation, tmp_path):
    _, layer = keras_and_ours(implementation, h=6, h_kv=3)
    config = layer.get_config()
    assert {config[k] for k in ("head_dim", "num_query_heads", "num_key_value_heads")} == {4, 6, 3}
    assert "num_heads" not in config and config["implementation"] == implementation
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, layer(inputs, inputs))
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    x = randn(B, T, D, seed=11)
    assert_close(again(x), model(x), rtol=0)
    assert type(again.layers[1]) is GroupedQueryAttention and again.layers[1].group_size == 2


def test_bad_group_counts_are_one_clear_error():
    with pytest.raises(ValueError, match="divisible by `num_key_value_heads`"):
        GroupedQueryAttention(head_dim=4, num_query_heads=6, num_key_value_heads=4)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        MultiHeadAttention(num_heads=4, num_key_value_heads=0)
    layer = GroupedQueryAttention(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    layer(randn(B, T, D))
    with pytest.raises(ValueError, match="groups its"):
        layer.pruned([0, 1])
