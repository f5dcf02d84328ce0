"""Small classifiers and inputs for the head-analysis tests (no training)."""

from __future__ import annotations

import numpy as np

from keras_mha.model import ModelConfig, attention_layers, build_classifier


def tiny_model(**overrides):
    """(model, config): 2 layers of 4 heads, d_model 16, untrained, non-zero biases."""
    config = ModelConfig(
        d_model=16, num_heads=4, num_layers=2, ff_dim=16, dropout=0.0, seed=3, **overrides
    )
    model = build_classifier(config)
    # Non-zero biases so that a removed head's bias would show if it leaked.
    for layer in attention_layers(model):
        for var in (layer.query_bias, layer.value_bias, layer.output_bias):
            var.assign(np.random.default_rng(1).normal(0, 0.3, var.shape).astype("float32"))
    return model, config


def tiny_token_model():
    return tiny_model(input_kind="tokens", sequence_length=6, feature_dim=12, num_classes=3)


def digits_like(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 8, 8)).astype("float32"), rng.integers(0, 10, n).astype("int32")


def padded_ids(n=300, seed=1):
    """Token ids (n, 6) with lengths 1..6, 0-padded at the end."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 12, (n, 6))
    ids[np.arange(6)[None] >= rng.integers(1, 7, (n, 1))] = 0
    return ids.astype("int32")


def duplicate_head(layer, src: int, dst: int) -> None:
    """Make head `dst` compute exactly what head `src` computes (Keras layout: head axis 1)."""
    for name in ("query", "key", "value"):
        kernel = getattr(layer, f"{name}_kernel")
        w = np.asarray(kernel).copy()
        w[:, dst] = w[:, src]  # (d_in, h, d_k)
        kernel.assign(w)
        bias = getattr(layer, f"{name}_bias")
        b = np.asarray(bias).copy()
        b[dst] = b[src]  # (h, d_k)
        bias.assign(b)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
