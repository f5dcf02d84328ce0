"""keras/src/layers/attention/multi_head_attention_test.py, with our layer.

The file ships inside the installed keras wheel, so the suite stays in step
with the Keras version we claim to replace. `keras.src.layers.MultiHeadAttention`
is replaced by `keras_mha.MultiHeadAttention` before the file is imported;
its tests then build, call, save, quantize and LoRA-tune our layer.
Run by tests/keras_suite/run.py (one backend per process).
"""

from __future__ import annotations

import keras.src.layers

import keras_mha

keras.src.layers.MultiHeadAttention = keras_mha.MultiHeadAttention

from keras.src.layers.attention.multi_head_attention_test import (  # noqa: E402
    MultiHeadAttentionTest,
)

assert MultiHeadAttentionTest  # collected by pytest from this module
