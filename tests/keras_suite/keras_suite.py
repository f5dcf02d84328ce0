"""keras/src/layers/attention/multi_head_attention_test.py, with our layer.

The file ships inside the installed keras wheel, so the suite stays in step
with the Keras version we claim to replace. `keras.src.layers.MultiHeadAttention`
is replaced by `keras_mha.MultiHeadAttention` before the file is imported;
its tests then build, call, save, quantize and LoRA-tune our layer.
Run by tests/keras_suite/run.py (one backend per process), which fails the
suite unless `test_the_class_under_test_is_keras_mha` passed.
"""

from __future__ import annotations

import keras.src.layers

import keras_mha

keras.src.layers.MultiHeadAttention = keras_mha.MultiHeadAttention

from keras.src.layers.attention import multi_head_attention_test  # noqa: E402
from keras.src.layers.attention.multi_head_attention_test import (  # noqa: E402
    MultiHeadAttentionTest,
)

assert MultiHeadAttentionTest  # collected by pytest from this module


def test_the_class_under_test_is_keras_mha():
    """The swap took effect: Keras's tests (`layers.MultiHeadAttention(...)`) build ours."""
    under_test = multi_head_attention_test.layers.MultiHeadAttention
    assert under_test is keras_mha.MultiHeadAttention
    assert under_test.__module__.startswith("keras_mha."), under_test.__module__
    assert under_test is not keras.layers.MultiHeadAttention  # Keras's own, public name
