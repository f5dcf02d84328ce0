"""The swap took effect: every keras-hub attention class under test is ours."""

from __future__ import annotations

import keras
import numpy as np

import keras_mha


def test_keras_hub_builds_keras_mha():
    from keras_hub.src.layers.modeling.cached_multi_head_attention import (
        CachedMultiHeadAttention,
    )
    from keras_hub.src.layers.modeling.transformer_encoder import TransformerEncoder
    from keras_hub.src.models.moonshine.moonshine_multi_head_attention import (
        MoonshineMultiHeadAttention,
    )
    from keras_hub.src.models.whisper.whisper_cached_multi_head_attention import (
        WhisperCachedMultiHeadAttention,
    )
    from keras_hub.src.models.xlnet.relative_attention import TwoStreamRelativeAttention

    for cls in (
        CachedMultiHeadAttention,
        MoonshineMultiHeadAttention,
        WhisperCachedMultiHeadAttention,
        TwoStreamRelativeAttention,
    ):
        assert issubclass(cls, keras_mha.MultiHeadAttention), cls
        assert not issubclass(cls, keras.src.layers.MultiHeadAttention), cls
    encoder = TransformerEncoder(intermediate_dim=8, num_heads=2)
    encoder(np.zeros((1, 3, 4), "float32"))
    assert type(encoder._self_attention_layer) is keras_mha.MultiHeadAttention
