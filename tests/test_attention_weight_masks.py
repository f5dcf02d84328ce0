"""0/1 float masks (keras_mha.layers.TokenEmbedding): the numbers of Keras's
boolean masks, with arithmetic only, on every backend (run on JAX and PyTorch
by tests/keras_suite/run.py).

A boolean mask puts NOT_EQUAL, LOGICAL_AND and SELECT into an exported graph,
which an integer-only NPU (Ethos-U55) runs on its CPU; a float mask needs MUL
and SUB (tests/test_export_npu.py shows the graph). Here: equal outputs.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_mha import MultiHeadAttention
from keras_mha.layers import MaskedMaxPooling, MaskedMeanPooling, TokenEmbedding

npy = keras.ops.convert_to_numpy
VOCAB, WIDTH, LENGTH = 20, 16, 7


def ids() -> np.ndarray:
    """Sentences of 1..7 tokens padded with 0, and one with no token at all."""
    x = np.random.default_rng(0).integers(1, VOCAB, (6, LENGTH)).astype("int32")
    for row, length in enumerate((7, 5, 3, 1, 0, 6)):
        x[row, length:] = 0
    return x


def masks(x):
    kept = x != 0
    return kept, keras.ops.convert_to_tensor(kept.astype("float32"))


def test_token_embedding_mask_is_the_padding_as_floats_and_the_weights_are_keras():
    x = ids()
    ours = TokenEmbedding(VOCAB, WIDTH)
    theirs = keras.layers.Embedding(VOCAB, WIDTH, mask_zero=True)
    ours.build((None, LENGTH))
    theirs.build((None, LENGTH))
    theirs.set_weights(ours.get_weights())
    mask = ours.compute_mask(keras.ops.convert_to_tensor(x))
    assert keras.backend.standardize_dtype(mask.dtype) == "float32"
    np.testing.assert_array_equal(npy(mask), (x != 0).astype("float32"))
    np.testing.assert_array_equal(npy(ours(x)), npy(theirs(x)))
    assert TokenEmbedding.from_config(ours.get_config()).mask_zero
    half = TokenEmbedding(VOCAB, WIDTH, dtype="mixed_bfloat16")
    half_mask = half.compute_mask(keras.ops.convert_to_tensor(x))
    assert keras.backend.standardize_dtype(half_mask.dtype) == "bfloat16"
    np.testing.assert_array_equal(npy(keras.ops.cast(half_mask, "float32")), npy(mask))
    assert TokenEmbedding(VOCAB, WIDTH, mask_zero=False).compute_mask(x) is None


@pytest.mark.parametrize("implementation", ["fused", "per_head"])
def test_float_masks_give_the_boolean_masks_numbers(implementation):
    x = ids()
    kept, weights = masks(x)
    h = np.random.default_rng(1).standard_normal((len(x), LENGTH, WIDTH)).astype("float32")
    layer = MultiHeadAttention(num_heads=4, key_dim=4, implementation=implementation)
    out_b, scores_b = layer(h, h, query_mask=kept, value_mask=kept, return_attention_scores=True)
    out_f, scores_f = layer(
        h, h, query_mask=weights, value_mask=weights, return_attention_scores=True
    )
    np.testing.assert_allclose(npy(out_f), npy(out_b), rtol=0, atol=1e-6)
    np.testing.assert_allclose(npy(scores_f), npy(scores_b), rtol=0, atol=1e-7)
    scores = npy(scores_f)
    pair = kept[:, None, :, None] & kept[:, None, None, :]  # (B, 1, T, S)
    assert np.all(scores[~np.broadcast_to(pair, scores.shape)] == 0.0)  # masked: exactly 0
    rows = scores.sum(-1)  # each query row of a token sums to 1; padding rows to 0
    np.testing.assert_allclose(rows, np.broadcast_to(kept[:, None, :], rows.shape), atol=1e-6)


def test_keras_layer_reads_our_float_mask_as_its_own():
    """Drop-in both ways: Keras's layer given the float mask gives what ours does."""
    x = ids()
    kept, weights = masks(x)
    h = np.random.default_rng(2).standard_normal((len(x), LENGTH, WIDTH)).astype("float32")
    theirs = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4)
    ours = MultiHeadAttention(num_heads=4, key_dim=4)
    theirs(h, h)
    ours(h, h)
    ours.set_weights(theirs.get_weights())
    got = ours(h, h, query_mask=weights, value_mask=weights)
    want = theirs(h, h, query_mask=weights, value_mask=weights)
    real = kept  # Keras's padded query rows differ by path (docs/layer.md): compare tokens
    np.testing.assert_allclose(npy(got)[real], npy(want)[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("pooling", [MaskedMeanPooling, MaskedMaxPooling])
def test_poolings_read_float_masks_as_boolean_ones(pooling):
    x = ids()
    kept, weights = masks(x)
    h = np.random.default_rng(3).standard_normal((len(x), LENGTH, WIDTH)).astype("float32")
    layer = pooling()
    got, want = npy(layer(h, mask=weights)), npy(layer(h, mask=kept))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    if pooling is MaskedMeanPooling:  # against numpy: the mean of the kept tokens
        for row in range(len(x)):
            n = kept[row].sum()
            expect = h[row, kept[row]].mean(0) if n else np.zeros(WIDTH)
            np.testing.assert_allclose(got[row], expect, rtol=0, atol=1e-6)


def test_classifier_of_token_embedding_equals_one_of_keras_embedding(tmp_path):
    """A model (embedding, attention, pooling) with either embedding: the same outputs,
    the float mask carried by Keras from layer to layer; saved and loaded."""

    def model(embedding):
        keras.utils.set_random_seed(4)
        tokens = keras.Input((LENGTH,), dtype="int32")
        e = embedding(tokens)
        h = MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(e, e)
        return keras.Model(tokens, MaskedMeanPooling()(keras.layers.Add()([e, h])))

    ours = model(TokenEmbedding(VOCAB, WIDTH))
    theirs = model(keras.layers.Embedding(VOCAB, WIDTH, mask_zero=True))
    theirs.set_weights(ours.get_weights())
    x = ids()
    got = npy(ours(x))
    np.testing.assert_allclose(got, npy(theirs(x)), rtol=0, atol=1e-6)
    assert np.all(got[4] == 0.0)  # the sentence with no token
    ours.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.layers[1], TokenEmbedding)
    np.testing.assert_array_equal(npy(loaded(x)), got)
