"""Encoder pieces that must also quantize cleanly."""

from __future__ import annotations

import keras
import numpy as np

from keras_mha import MaskedMeanPooling


def test_masked_mean_pooling_equals_keras_masked_average():
    x = np.random.default_rng(0).standard_normal((3, 5, 4)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    got = np.asarray(MaskedMeanPooling()(x, mask=mask))
    want = np.asarray(keras.layers.GlobalAveragePooling1D()(x, mask=mask))
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got[1], x[1, 0], atol=1e-6)  # only the first token kept
    np.testing.assert_allclose(np.asarray(MaskedMeanPooling()(x)), x.mean(1), atol=1e-6)
    empty = np.asarray(MaskedMeanPooling()(x, mask=np.zeros((3, 5), bool)))
    assert np.array_equal(empty, np.zeros((3, 4), "float32"))  # zeros, not NaN
