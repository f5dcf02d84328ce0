"""keras_mha.MultiHeadAttention as keras.layers.MultiHeadAttention: its whole
API (masks, output_shape, attention_axes, use_gate, sliding_window,
flash_attention, the override point, quantization, LoRA, dtype policy maps)
against Keras's own layer with the same weights, on any backend."""

from __future__ import annotations

import importlib.util
import pathlib

import keras
import numpy as np
import pytest

from keras_mha import MultiHeadAttention

npy = keras.ops.convert_to_numpy
IMPLS = pytest.mark.parametrize("implementation", ["fused", "per_head"])
DATA = pathlib.Path(__file__).parent / "data"


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def assert_close(got, want, rtol=1e-5):
    """Equal to float32 rounding, relative to the outputs' size (rounding
    grows with magnitude): max |got - want| <= rtol * max(1, max |want|)."""
    got, want = npy(got), npy(want)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= rtol * scale, float(np.abs(got - want).max())


def keras_and_ours(implementation="fused", seed=7, call_args=None, **kwargs):
    """A built Keras layer and ours with its weights."""
    keras.utils.set_random_seed(seed)
    ref = keras.layers.MultiHeadAttention(**kwargs)
    # With scores: Keras 3.15's JAX fast path fails when value_dim != key_dim.
    ref(*call_args, return_attention_scores=True)
    return ref, MultiHeadAttention.from_keras(ref, implementation=implementation)


# ---------------------------------------------------------------------- masks
B, T, S, H = 3, 4, 6, 4  # T == num_heads: where a misplaced head axis hides


def _mask(shape, seed=1):
    m = np.random.default_rng(seed).random(shape) > 0.4
    m[..., 0] = True  # every row may attend somewhere (Keras's fast path is undefined there)
    return m


@IMPLS
@pytest.mark.parametrize(
    "mask_shape",
    [(T, S), (1, T, S), (B, T, S), (B, 1, S), (B, T, 1), (1, 1, T, S), (B, 1, T, S), (B, H, T, S)],
    ids=str,
)
def test_every_mask_shape_keras_accepts_is_broadcast_as_keras_does(mask_shape, implementation):
    q, v = randn(B, T, 8, seed=2), randn(B, S, 8, seed=3)
    ref, ours = keras_and_ours(implementation, num_heads=H, key_dim=2, call_args=(q, v))
    mask = _mask(mask_shape)
    want, want_scores = ref(q, v, attention_mask=mask, return_attention_scores=True)
    got, got_scores = ours(q, v, attention_mask=mask, return_attention_scores=True)
    assert_close(got, want)
    assert_close(got_scores, want_scores)
    assert_close(ours(q, v, attention_mask=mask), ref(q, v, attention_mask=mask))  # fast paths
    # The 2-D mask means the same as the (B, T, S) one it broadcasts to.
    full = mask
    while full.ndim < 4:  # Keras adds the missing axes before T (the head axis first)
        full = np.expand_dims(full, -3)
    full = np.broadcast_to(full, (B, H, T, S))
    assert_close(got, ours(q, v, attention_mask=full))


@pytest.mark.parametrize(
    "mask_shape", [(S,), (T + 1, S), (B, 3, T, S), (1, B, 1, T, S), (2, T, S)], ids=str
)
def test_mask_shapes_keras_refuses_are_a_clear_value_error(mask_shape):
    layer = MultiHeadAttention(num_heads=H)
    with pytest.raises(ValueError, match=r"`attention_mask` must be broadcastable .*Received"):
        layer(randn(B, T, 8), randn(B, S, 8), attention_mask=np.ones(mask_shape, bool))


@IMPLS
def test_rows_with_nothing_to_attend_get_zero_weights_and_output(implementation):
    layer = MultiHeadAttention(num_heads=2, implementation=implementation, use_bias=False)
    mask = np.ones((2, 3, 5), bool)
    mask[1, 2] = False
    x, v = randn(2, 3, 8), randn(2, 5, 8, seed=1)
    y, scores = layer(x, v, attention_mask=mask, return_attention_scores=True)
    assert np.abs(npy(scores)[1, :, 2]).max() == 0.0
    assert np.abs(npy(y)[1, 2]).max() == 0.0  # no bias: W^O of a zero concat
    assert_close(layer(x, v, attention_mask=mask), y)  # the no-scores path agrees


# ------------------------------------------------------------- input masks
# Position flags (B, T) / (B, S), True: a real position. Each pair differs
# in every row both ways (VM & KM drops positions each of VM and KM keeps),
# so using one mask in place of another, or dropping one, changes the numbers.
QM = np.array([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0]], bool)
VM = np.array([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0]], bool)
KM = np.array([[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 1]], bool)
XM = np.array([[1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 0, 1]], bool)
ALL_T, ALL_S = np.ones((B, T), bool), np.ones((B, S), bool)


class _Inputs:
    """Self-attention x (B, S, 8); cross-attention q (B, T, 8), v (B, S, 6),
    k (B, S, 5); xz: x zeroed where XM drops a position. "X", "Q", "V", "K":
    fresh tensors carrying XM, QM, VM, KM (a Masking layer's outputs, zeros
    where masked), fresh for each call since Keras's layer takes the mask off
    the tensors it is given."""

    def __init__(self):
        self.x, self.q = randn(B, S, 8, seed=20), randn(B, T, 8, seed=21)
        self.v, self.k = randn(B, S, 6, seed=22), randn(B, S, 5, seed=23)
        self.xz = np.where(XM[..., None], self.x, 0.0).astype("float32")

    def tensors(self, names: str) -> list:
        """Tensors by name; "X X" is one fresh tensor passed twice, as in `mha(x, x)`."""
        made = {}
        for name in names.split():
            if name not in made and name.isupper():
                mask = {"X": XM, "Q": QM, "V": VM, "K": KM}[name]
                plain = getattr(self, name.lower())
                made[name] = keras.layers.Masking(0.0)(np.where(mask[..., None], plain, 0.0))
            made.setdefault(name, getattr(self, name, None))
        return [made[name] for name in names.split()]


MASK_FORMS = [
    # id: our call's tensors and masks; Keras's tensors (None: ours, and the
    # query as `value` where ours omits it, as Keras needs one); the query
    # rows (B, T_q) and key columns (B, S) the masks keep.
    ("x,x,key_mask", "x x", {"key_mask": KM}, None, ALL_S, KM),
    ("x,key_mask", "x", {"key_mask": KM}, None, ALL_S, KM),
    ("x,value_mask", "x", {"value_mask": VM}, None, ALL_S, VM),
    ("x,x,value_mask", "x x", {"value_mask": VM}, None, ALL_S, VM),
    ("x,value_mask,key_mask", "x", {"value_mask": VM, "key_mask": KM}, None, ALL_S, VM & KM),
    # Keras 3.15 drops an explicit query_mask: its equal is a query carrying it.
    ("x,query_mask", "xz", {"query_mask": XM}, "X xz", XM, ALL_S),
    # Masks the inputs carry, alone and with explicit ones (which replace them).
    ("carried-x", "X", {}, None, XM, XM),
    ("carried-x,x", "X X", {}, None, XM, XM),
    ("carried-x,value_mask", "X", {"value_mask": VM}, None, XM, VM),
    ("carried-x,key_mask", "X", {"key_mask": KM}, None, XM, XM & KM),
    # Cross-attention.
    ("q,v,key_mask", "q v", {"key_mask": KM}, None, ALL_T, KM),
    ("q,v,k,both-masks", "q v k", {"value_mask": VM, "key_mask": KM}, None, ALL_T, VM & KM),
    ("carried-q,v", "Q v", {}, None, QM, ALL_S),
    ("q,carried-v", "q V", {}, None, ALL_T, VM),
    ("q,v,carried-k", "q v K", {}, None, ALL_T, KM),
    ("q,carried-v,key_mask", "q V", {"key_mask": KM}, None, ALL_T, VM & KM),
]


@IMPLS
@pytest.mark.parametrize(
    "ours_args,masks,keras_args,rows,cols",
    [pytest.param(*form[1:], id=form[0]) for form in MASK_FORMS],
)
def test_every_input_mask_is_used_as_keras_uses_it(
    ours_args, masks, keras_args, rows, cols, implementation
):
    """Each call form: no weight on a masked key (or from a masked query
    row), and the numbers of Keras's layer with the same weights and call."""
    t = _Inputs()
    if keras_args is None:
        keras_args = ours_args if " " in ours_args else f"{ours_args} {ours_args}"
    plain = [npy(a) for a in t.tensors(keras_args)]  # carrying no masks
    ref, ours = keras_and_ours(implementation, num_heads=2, key_dim=4, call_args=plain)
    want, want_scores = ref(*t.tensors(keras_args), return_attention_scores=True, **masks)
    got, scores = ours(*t.tensors(ours_args), return_attention_scores=True, **masks)
    scores = npy(scores)
    allowed = rows[:, None, :, None] & cols[:, None, None, :]  # (B, 1, T_q, S)
    assert np.abs(scores[~np.broadcast_to(allowed, scores.shape)]).max() == 0.0
    assert_close(scores, want_scores)
    assert_close(got, want)
    assert_close(ours(*t.tensors(ours_args), **masks), want)  # no scores: the fast paths
    # The masks matter: unmasked, the same inputs put clear weight where the
    # masks allow none (up to 0.88 on a masked key before issue 19's fix).
    _, free = ours(*[npy(a) for a in t.tensors(ours_args)], return_attention_scores=True)
    assert np.abs(npy(free) - scores).max() > 0.05


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda m, x: m(x, value_mask=np.ones((B, S + 1), bool)), r"`value_mask`.*\(3, 7\)"),
        (lambda m, x: m(x, x, key_mask=np.ones((B, S, 1), bool)), r"`key_mask`.*\(3, 6, 1\)"),
        (lambda m, x: m(x, query_mask=np.ones((B + 1, S), bool)), r"`query_mask`.*\(4, 6\)"),
    ],
    ids=["value_mask-too-long", "key_mask-rank-3", "query_mask-batch"],
)
def test_input_masks_of_the_wrong_shape_are_a_clear_value_error(call, match):
    layer = MultiHeadAttention(num_heads=2)
    with pytest.raises(ValueError, match=r"shape without its features, \(3, 6\)") as caught:
        call(layer, randn(B, S, 8))
    assert caught.match(match)


def test_input_masks_over_several_attention_axes_are_refused_as_keras_cannot_apply_them():
    """Keras's [B, T, 1] & [B, 1, S] input masks line up with the scores only
    when attention runs over the last axis before the features; elsewhere its
    layer fails or mixes up axes. attention_mask says the same thing."""
    q = randn(2, 3, 4, 8)
    mask = np.ones((2, 3, 4), bool)
    mask[:, :, -1] = False
    layer = MultiHeadAttention(num_heads=2, attention_axes=(1, 2))
    with pytest.raises(ValueError, match=r"`value_mask`.*needs attention over the last axis"):
        layer(q, value_mask=mask)
    # With the last axis alone, (B, 3, 4) flags apply as in Keras: the same
    # numbers as the attention_mask they stand for.
    layer = MultiHeadAttention(num_heads=2, attention_axes=(2,))
    _, scores = layer(q, value_mask=mask, return_attention_scores=True)  # (B, 3, h, 4, 4)
    assert np.abs(npy(scores)[..., -1]).max() == 0.0
    explicit = np.broadcast_to(mask[:, :, None, :], (2, 3, 4, 4))
    assert_close(layer(q, value_mask=mask), layer(q, attention_mask=explicit))


# -------------------------------------------------------- value_dim != key_dim
@IMPLS
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize(
    "call_kwargs",
    [{}, {"use_causal_mask": True}, {"attention_mask": _mask((B, T, T))}],
    ids=["plain", "causal", "mask"],
)
def test_value_dim_other_than_key_dim_matches_keras(cross, call_kwargs, implementation):
    """d_v != d_k: JAX's dot_product_attention cannot take it (issue 19); the
    fused path must still give Keras's numbers, with and without scores."""
    q = randn(B, T, 8)
    args = (q, randn(B, T, 6, seed=1)) if cross else (q,)
    ref, ours = keras_and_ours(
        implementation, num_heads=3, key_dim=4, value_dim=6, call_args=(q, args[-1])
    )
    assert (ours.d_k, ours.d_v) == (4, 6)
    # Keras's own layer runs d_v != d_k on JAX only with scores (its fast path fails).
    want, want_scores = ref(q, args[-1], return_attention_scores=True, **call_kwargs)
    got, scores = ours(*args, return_attention_scores=True, **call_kwargs)
    assert_close(got, want)
    assert_close(scores, want_scores)
    assert_close(ours(*args, **call_kwargs), want)  # no scores: the fused fast path
    assert float(np.abs(npy(want)).max()) > 0.1  # real outputs, not zeros


# ------------------------------------------------------------ output_shape
@IMPLS
@pytest.mark.parametrize("output_shape", [6, (6,), (2, 5)], ids=str)
def test_output_shape_int_or_tuple_matches_keras(output_shape, implementation):
    q, v = randn(2, 4, 8), randn(2, 5, 6, seed=1)
    ref, ours = keras_and_ours(
        implementation, num_heads=2, key_dim=3, output_shape=output_shape, call_args=(q, v)
    )
    want = ref(q, v, return_attention_scores=True)[0]
    assert_close(ours(q, v), want)
    expected = (2, 4) + ((output_shape,) if isinstance(output_shape, int) else output_shape)
    assert ours.compute_output_shape(q.shape, v.shape) == expected == tuple(want.shape)
    concat = npy(ours.concat_heads(q, v))  # (B, T, h * d_v) whatever output_shape is
    assert concat.shape == (2, 4, 6)


@pytest.fixture(scope="module")
def legacy_files(tmp_path_factory) -> pathlib.Path:
    """Files as keras_mha 0.1.0 wrote them, made from the description of its
    format in tests/data/make_legacy_fixtures.py (no git history needed)."""
    spec = importlib.util.spec_from_file_location(
        "make_legacy_fixtures", DATA / "make_legacy_fixtures.py"
    )
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    return maker.make(tmp_path_factory.mktemp("legacy"))


def test_old_output_dim_config_and_files_still_load(legacy_files):
    layer = MultiHeadAttention.from_config({"num_heads": 2, "output_dim": 6})
    assert layer.get_config()["output_shape"] == (6,)
    assert "output_dim" not in layer.get_config()
    want = np.load(legacy_files / "legacy_0.1.0.npz")
    # keras_mha 0.1.0's format: weights on the layer, heads first, `output_dim`
    # in the config; the outputs are 0.1.0's equations in numpy, from the same
    # (random, nonzero) weights, biases and norms included.
    model = keras.saving.load_model(legacy_files / "legacy_0.1.0_mha.keras")
    got_mha, got_nobias = model([want["x"], want["m"]])
    assert_close(got_mha, want["mha"])
    assert_close(got_nobias, want["nobias"])
    assert model.get_layer("mha").output_kernel.shape == (2, 4, 6)
    assert model.get_layer("nobias").implementation == "per_head"
    block = keras.saving.load_model(legacy_files / "legacy_0.1.0_block.keras")
    assert_close(block(want["x"]), want["block"])
    assert float(np.abs(want["block"]).max()) > 0.5  # real outputs, not zeros


# ---------------------------------------------------------- attention_axes
@IMPLS
@pytest.mark.parametrize(
    "q_shape,v_shape,axes,mask_shape",
    [
        ((2, 3, 4, 8), (2, 3, 5, 8), (2,), (4, 5)),
        ((2, 3, 4, 8), (2, 3, 5, 8), -2, (2, 3, 4, 5)),
        ((2, 3, 4, 8), (2, 2, 5, 8), (1, 2), (2, 3, 4, 2, 5)),
        ((2, 5, 3, 4, 8), (2, 5, 3, 2, 8), (2, 3), (3, 4, 3, 2)),
        ((2, 6, 3, 8), (2, 6, 3, 8), (1,), None),
    ],
    ids=["4d-axis2", "4d-negative", "4d-two-axes", "5d-two-axes", "4d-axis1"],
)
def test_attention_axes_match_keras(q_shape, v_shape, axes, mask_shape, implementation):
    q, v = randn(*q_shape), randn(*v_shape, seed=1)
    ref, ours = keras_and_ours(
        implementation, num_heads=2, key_dim=3, attention_axes=axes, call_args=(q, v)
    )
    mask = None if mask_shape is None else _mask(mask_shape)
    want, want_scores = ref(q, v, attention_mask=mask, return_attention_scores=True)
    got, got_scores = ours(q, v, attention_mask=mask, return_attention_scores=True)
    assert tuple(got_scores.shape) == tuple(want_scores.shape)
    assert_close(got, want)
    assert_close(got_scores, want_scores)
    assert_close(ours(q, v, attention_mask=mask), want)
    spec = ours.compute_output_spec(
        keras.KerasTensor(q.shape), keras.KerasTensor(v.shape), return_attention_scores=True
    )
    assert tuple(spec[1].shape) == tuple(want_scores.shape)
    # head_mask and pruning work on every axis layout.
    pruned = ours.pruned([1])
    assert_close(
        pruned(q, v, attention_mask=mask), ours(q, v, attention_mask=mask, head_mask=[0, 1])
    )


# -------------------------------------------------- use_gate, sliding window
@IMPLS
def test_use_gate_matches_keras_and_is_stored_per_head(implementation):
    q, v = randn(2, 5, 8), randn(2, 7, 8, seed=1)
    ref, ours = keras_and_ours(
        implementation, num_heads=2, key_dim=4, use_gate=True, call_args=(q, v)
    )
    assert_close(ours(q, v), ref(q, v, return_attention_scores=True)[0])
    assert tuple(ours.gate_kernel.shape) == (8, 2, 4)  # gate of head i: [:, i, :]
    w = ours.head_weights(1)
    np.testing.assert_array_equal(w["gate_kernel"], npy(ours.gate_kernel)[:, 1, :])
    assert_close(ours.pruned([1])(q, v), ours(q, v, head_mask=np.array([0.0, 1.0])))


@IMPLS
@pytest.mark.parametrize("use_gate", [False, True], ids=["plain", "gated"])
def test_activity_regularizer_adds_the_losses_keras_adds(use_gate, implementation):
    """Keras hands `activity_regularizer` to every projection: one loss per
    EinsumDense, divided by the batch size. The per-head path reads the
    kernels instead of calling the sublayers and must add the same losses."""
    q, v = randn(3, 5, 8), randn(3, 7, 8, seed=1)
    kwargs = dict(num_heads=2, key_dim=4, use_gate=use_gate, activity_regularizer="l2")
    ref, ours = keras_and_ours(implementation, call_args=(q, v), **kwargs)
    ref(q, v)
    ours(q, v)
    ours(q, v)  # a second call replaces the losses, as Keras's does
    names = ["_query_dense", "_key_dense", "_value_dense", "_output_dense"]
    names += ["_gate_dense"] if use_gate else []
    for name in names:
        want = [float(npy(x)) for x in getattr(ref, name).losses]
        got = [float(npy(x)) for x in getattr(ours, name).losses]
        assert len(got) == len(want) == 1, name
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
        assert want[0] > 1e-3  # a real loss, not a zero that any path would match
    assert len(ours.losses) == len(names)
    for _ in range(3):  # a plain method outside a layer call: no losses pile up
        ours.concat_heads(q, v)
    assert len(ours.losses) == len(names)
    ours.quantize("int8")  # quantized projections are called: each adds its own, once
    ours(q, v)
    assert len(ours.losses) == len(names)


@IMPLS
@pytest.mark.parametrize("causal", [False, True], ids=["band", "causal-band"])
def test_sliding_window_matches_keras_with_causal_and_explicit_masks(causal, implementation):
    x = randn(2, 7, 8)
    ref, ours = keras_and_ours(
        implementation, num_heads=2, key_dim=4, sliding_window=3, call_args=(x, x)
    )
    mask = _mask((2, 7, 7))
    want, want_scores = ref(
        x, x, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
    )
    got, scores = ours(
        x, x, attention_mask=mask, use_causal_mask=causal, return_attention_scores=True
    )
    assert_close(got, want)
    assert_close(scores, want_scores)
    i, j = np.indices((7, 7))
    outside = (np.abs(i - j) >= 3) | ((j > i) if causal else False) | ~mask[:, None]
    assert np.abs(npy(scores)[np.broadcast_to(outside, scores.shape)]).max() == 0.0


# ------------------------------------------------------------ flash, spec
def test_dot_product_attention_path_gives_the_same_numbers(monkeypatch):
    """Without scores or dropout the fused path may call
    keras.ops.dot_product_attention (JAX, PyTorch; TensorFlow only with
    flash_attention=True); its numbers equal the explicit softmax's,
    rows with nothing to attend to included."""
    calls = []
    real = keras.ops.dot_product_attention
    monkeypatch.setattr(
        keras.ops, "dot_product_attention", lambda *a, **k: calls.append(k) or real(*a, **k)
    )
    layer = MultiHeadAttention(num_heads=4)
    x, v = randn(2, 5, 16), randn(2, 6, 16, seed=1)
    mask = _mask((2, 5, 6))
    mask[0, 3] = False
    for kwargs in ({}, {"attention_mask": mask}, {"use_causal_mask": True}):
        explicit, _ = layer(x, v, return_attention_scores=True, **kwargs)
        assert_close(layer(x, v, **kwargs), explicit)
    expected = 0 if keras.backend.backend() == "tensorflow" else 3
    assert len(calls) == expected
    assert all(k["is_causal"] is (i == 2) for i, k in enumerate(calls))


def test_flash_attention_rules_follow_keras():
    with pytest.raises(ValueError, match="Dropout is not supported"):
        MultiHeadAttention(num_heads=2, dropout=0.1, flash_attention=True)
    layer = MultiHeadAttention(num_heads=2, flash_attention=True)
    with pytest.raises(ValueError, match="Returning attention scores is not supported"):
        layer(randn(2, 4, 8), return_attention_scores=True)
    keras.config.disable_flash_attention()
    try:
        assert MultiHeadAttention(num_heads=2)._flash_attention is False
    finally:
        keras.config.enable_flash_attention()


def test_compute_output_spec_for_cross_attention_and_functional_models():
    layer = MultiHeadAttention(num_heads=2, output_shape=(3, 2))
    q, v = keras.Input((5, 8)), keras.Input((7, 6))
    y, scores = layer(q, v, return_attention_scores=True)
    assert tuple(y.shape) == (None, 5, 3, 2)
    assert tuple(scores.shape) == (None, 2, 5, 7)  # (B, h, T, S), S from the value
    model = keras.Model([q, v], [y, scores])
    out = model([randn(2, 5, 8), randn(2, 7, 6)])
    assert tuple(out[0].shape) == (2, 5, 3, 2) and tuple(out[1].shape) == (2, 2, 5, 7)


# -------------------------------------------------------- the override point
def test_compute_attention_is_the_override_point():
    seen = []

    class Cached(MultiHeadAttention):  # keras-hub's signature
        def _compute_attention(self, query, key, value, attention_mask=None, training=None):
            seen.append((tuple(query.shape), attention_mask is None))
            out, scores = super()._compute_attention(query, key, value, attention_mask, training)
            return out * 2.0, scores

    x = randn(2, 5, 8)
    plain = MultiHeadAttention(num_heads=2, use_bias=False)
    sub = Cached(num_heads=2, use_bias=False)
    plain(x)
    sub(x)
    sub.set_weights(plain.get_weights())
    assert_close(sub(x, use_causal_mask=True), 2.0 * npy(plain(x, use_causal_mask=True)))
    assert seen[-1] == ((2, 5, 2, 4), False)  # projected heads, the causal mask built
    # per_head computes heads itself only without an override: a subclass's
    # attention is still called (the fused path), by keyword.
    sub.implementation = "per_head"
    calls = len(seen)
    assert_close(sub(x), 2.0 * npy(plain(x)))
    assert len(seen) == calls + 1


def test_compute_attention_override_with_keras_signature_gets_the_scores_flag():
    flags = []

    class Full(MultiHeadAttention):  # Keras's signature, by keyword
        def _compute_attention(
            self,
            query,
            key,
            value,
            attention_mask=None,
            training=None,
            return_attention_scores=False,
        ):
            flags.append(return_attention_scores)
            return super()._compute_attention(
                query,
                key,
                value,
                attention_mask=attention_mask,
                training=training,
                return_attention_scores=return_attention_scores,
            )

    x = randn(2, 5, 8)
    layer = Full(num_heads=2, implementation="per_head")
    _, scores = layer(x, return_attention_scores=True)
    layer(x, use_causal_mask=True)  # a subclass gets the mask, never use_causal_mask
    assert flags == [True, False] and tuple(scores.shape) == (2, 2, 5, 5)


# ------------------------------------------- subclasses written for Keras's layer
@pytest.mark.parametrize(
    "shape, axes",
    [((2, 5, 8), None), ((2, 3, 4, 8), None), ((2, 3, 4, 8), (2,)), ((2, 3, 4, 8), (1,))],
)
def test_keras_private_names_mean_what_they_mean_in_keras(shape, axes):
    """keras-hub's subclasses read Keras's privates: the same values as
    Keras's own layer has, after build (tests/keras_hub_suite runs them)."""
    kwargs = dict(num_heads=2, key_dim=3, value_dim=5, dropout=0.25, use_bias=False)
    kwargs["attention_axes"] = axes
    ref, ours = keras.layers.MultiHeadAttention(**kwargs), MultiHeadAttention(**kwargs)
    x = randn(*shape)
    ref(x, x)
    ours(x, x)
    names = ["_num_heads", "_key_dim", "_value_dim", "_dropout", "_use_bias"]
    names += ["_dot_product_equation", "_combine_equation", "_inverse_sqrt_key_dim"]
    for name in names:
        assert getattr(ours, name) == getattr(ref, name), name
    assert tuple(ours._attention_axes) == tuple(ref._attention_axes)
    for name in ("_kernel_initializer", "_bias_initializer"):
        assert getattr(ours, name).get_config() == getattr(ref, name).get_config()
    common = ours._get_common_kwargs_for_sublayer()
    assert common["kernel_initializer"] is not ours.kernel_initializer  # fresh, as Keras's
    ours._use_bias = True  # XLNet's build sets it
    assert ours.use_bias is True


def test_a_subclass_that_replaces_build_computes_keras_attention():
    """A subclass written for Keras (its own build, then `_build_attention`;
    Keras's equations and `_masked_softmax` with a (B, T, S) mask) gives
    Keras's numbers on our layer."""

    class OwnBuild(MultiHeadAttention):
        def build(self, query_shape, value_shape):
            common = self._get_common_kwargs_for_sublayer()
            heads = [self._num_heads, self._key_dim]
            for name in ("query", "key", "value"):
                dense = keras.layers.EinsumDense(
                    "abc,cde->abde", output_shape=[None, *heads], name=name, **common
                )
                dense.build(query_shape)
                setattr(self, f"_{name}_dense", dense)
            self._build_attention(len(query_shape) + 1)
            self._output_dense = keras.layers.EinsumDense(
                "abcd,cde->abe", output_shape=[None, query_shape[-1]], name="attention_output"
            )
            self._output_dense.build((*query_shape[:-1], self._num_heads, self._value_dim))
            self.built = True

        def call(self, query, value, attention_mask=None):
            q = self._query_dense(query) * self._inverse_sqrt_key_dim
            k, v = self._key_dense(value), self._value_dense(value)
            scores = keras.ops.einsum(self._dot_product_equation, k, q)
            weights = self._masked_softmax(scores, attention_mask)
            return self._output_dense(keras.ops.einsum(self._combine_equation, weights, v))

    x = randn(2, 5, 8)
    mask = np.random.default_rng(1).random((2, 5, 5)) > 0.3
    mask[:, :, 0] = True  # every row attends somewhere (Keras's empty rows are uniform)
    ref = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, use_bias=False)
    ref(x, x)
    sub = OwnBuild(num_heads=2, key_dim=4, use_bias=False)
    sub(x, x)
    sub.set_weights(ref.get_weights())
    assert_close(sub(x, x, attention_mask=mask), ref(x, x, attention_mask=mask))
    as_float = mask.astype("float32")  # Keras's Softmax reads a float mask as > 0.5
    assert_close(sub(x, x, attention_mask=as_float), ref(x, x, attention_mask=mask))


# ------------------------------------------- quantization, LoRA, dtype maps
@IMPLS
@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_quantized_layer_stays_close_to_float(mode, implementation):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 16))
    layer = MultiHeadAttention(num_heads=4, implementation=implementation, name="mha")
    model = keras.Model(inputs, layer(inputs))
    x = randn(4, 6, 16)
    want = npy(model(x))
    if mode == "int8":
        layer.quantize(mode)  # the layer itself, or model.quantize below
    else:
        model.quantize(mode)
    assert layer.query_dense.quantization_mode == mode
    if mode == "int8":
        assert keras.backend.standardize_dtype(layer.query_kernel.dtype) == "int8"
        with pytest.raises(ValueError, match="needs float weights"):
            layer.head_weights(0)
    got = npy(model(x))
    # Keras's own quantization tests check mse < 1e-2 on a weaker layer; the
    # output here has std ~0.6: int8/float8 error ~1%, int4 ~10% of it.
    rel = np.sqrt(np.mean((got - want) ** 2)) / np.std(want)
    assert rel < {"int8": 0.05, "float8": 0.1, "int4": 0.3}[mode], rel


def test_lora_and_dtype_policy_map_reach_the_projections():
    layer = MultiHeadAttention(num_heads=2, name="mha")
    x = randn(2, 4, 8)
    want = npy(layer(x))
    layer.enable_lora(2)
    assert layer.query_dense.lora_enabled and layer.value_dense.lora_enabled
    # LoRA A, B for query/key/value, their biases, W^O and its bias; the
    # frozen q/k/v kernels are no longer trainable.
    assert len(layer.trainable_weights) == 2 * 3 + 3 + 2
    assert_close(layer(x), want)  # LoRA starts at zero
    assert layer.head_weights(0)["query_kernel"].shape == (8, 4)
    policy_map = keras.dtype_policies.DTypePolicyMap()
    policy_map["mha/query"] = keras.dtype_policies.QuantizedDTypePolicy("int8", "float32")
    quantized = MultiHeadAttention(num_heads=2, dtype=policy_map, name="mha")
    quantized.build((None, 4, 8))
    assert keras.backend.standardize_dtype(quantized.query_kernel.dtype) == "int8"
    assert keras.backend.standardize_dtype(quantized.key_kernel.dtype) == "float32"


# ------------------------------------------------------ from_keras, to_keras
CONFIGS = [
    {"num_heads": 2, "key_dim": 3},
    {"num_heads": 3, "key_dim": 4, "value_dim": 5, "use_bias": False},
    {"num_heads": 2, "key_dim": 4, "output_shape": (3, 2)},
    {"num_heads": 2, "key_dim": 4, "use_gate": True},
    {"num_heads": 2, "key_dim": 4, "sliding_window": 2},
    {"num_heads": 2, "key_dim": 4, "attention_axes": (2,)},
    {"num_heads": 2, "key_dim": 4, "use_gate": True, "sliding_window": 3, "output_shape": 5},
]


@pytest.mark.parametrize(
    "config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
)
def test_from_keras_and_to_keras_for_every_configuration(config):
    rank4 = "attention_axes" in config
    q = randn(2, 3, 4, 8) if rank4 else randn(2, 4, 8)
    v = randn(2, 3, 6, 8, seed=1) if rank4 else randn(2, 6, 8, seed=1)
    for implementation in ("fused", "per_head"):
        ref, ours = keras_and_ours(implementation, call_args=(q, v), **config)
        want = ref(q, v, return_attention_scores=True)
        got = ours(q, v, return_attention_scores=True)
        assert_close(got[0], want[0])
        assert_close(got[1], want[1])
        back = ours.to_keras()
        assert_close(back(q, v, return_attention_scores=True)[0], want[0])
        assert back.get_config()["use_gate"] == config.get("use_gate", False)


def test_a_file_saved_before_the_layer_became_a_package_still_loads(tmp_path):
    """tests/data/saved_layer_0.2.0.json: a `.keras` file keras_mha 0.2.0 saved
    (module `keras_mha.attention`, then one file) as text; written back and
    loaded with today's package, it gives the numbers it gave then."""
    import json
    import zipfile

    h5py = pytest.importorskip("h5py")
    record = json.loads((DATA / "saved_layer_0.2.0.json").read_text())
    weights = tmp_path / "model.weights.h5"
    with h5py.File(weights, "w") as h5:
        for group in record["groups"]:
            h5.require_group(group)
        for name, data in record["datasets"].items():
            h5.create_dataset(name, data=np.asarray(data["values"], data["dtype"]))
    path = tmp_path / "saved.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", record["config.json"])
        archive.writestr("metadata.json", record["metadata.json"])
        archive.write(weights, "model.weights.h5")
    model = keras.saving.load_model(path)
    assert [type(layer) for layer in model.layers[2:]] == [MultiHeadAttention] * 2
    assert model.get_layer("per_head").implementation == "per_head"
    x, m = np.asarray(record["x"], "float32"), np.asarray(record["m"], bool)
    for got, want in zip(model([x, m]), record["outputs"], strict=True):
        want = np.asarray(want, "float32")
        assert float(np.abs(want).max()) > 0.1  # real outputs, not zeros
        assert_close(got, want)
