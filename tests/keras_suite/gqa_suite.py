"""keras/src/layers/attention/grouped_query_attention_test.py, with our layer.

As keras_suite.py does for MultiHeadAttention: `keras.src.layers.GroupedQueryAttention`
is replaced by `keras_mha.GroupedQueryAttention` before Keras's test file is
imported, so its tests build, call, mask, save and check ours. Run by
tests/keras_suite/run.py, which fails the suite unless
`test_the_grouped_class_under_test_is_keras_mha` passed.
"""

from __future__ import annotations

import keras.src.layers

import keras_mha

keras.src.layers.GroupedQueryAttention = keras_mha.GroupedQueryAttention

from keras.src.layers.attention import grouped_query_attention_test  # noqa: E402
from keras.src.layers.attention.grouped_query_attention_test import (  # noqa: E402
    GroupedQueryAttentionTest,
)

assert GroupedQueryAttentionTest  # collected by pytest from this module


def test_the_grouped_class_under_test_is_keras_mha():
    """The swap took effect: Keras's tests (`layers.GroupedQueryAttention(...)`) build ours."""
    under_test = grouped_query_attention_test.layers.GroupedQueryAttention
    assert under_test is keras_mha.GroupedQueryAttention
    assert under_test.__module__.startswith("keras_mha."), under_test.__module__
    assert under_test is not keras.layers.GroupQueryAttention  # Keras's public name
