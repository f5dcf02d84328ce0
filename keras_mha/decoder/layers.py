"""The pieces of a Llama-style decoder block that are not attention.

    RMSNorm(x)   = x / sqrt(mean(x^2) + eps) * g                 (no mean, no bias)
    SwiGLU(x)    = (silu(x W_gate) * (x W_up)) W_down             (the feed-forward)
    RoPE(x, p)   = x * cos(p theta) + rotate_half(x) * sin(p theta)

RoPE (rotary position embedding, Su et al. 2021) turns each pair of a head's
features (j, j + d/2) by the angle p * base^(-2j/d) at position p, so that the
score q_p . k_s of a query at p and a key at s depends on p - s only. It is
applied to each head's query and key after the projection, before the scores
(keras_mha/decoder/attention.py). The pairing is Hugging Face's layout (first
half with second half, "rotate_half"); llama.cpp's GGUF files store Q and K
rows for interleaved pairs, and the GGUF reader puts them back (gguf_import.py).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def rotary_angles(positions, head_dim: int, base: float):
    """cos and sin of position p times each pair's frequency: two `(T, head_dim)`
    float32 tensors (`positions`: `(T,)` integers), each frequency twice (the
    pair j and j + d/2 turn by the same angle)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    inverse = (1.0 / (base**exponents)).astype(np.float32)  # base^(-2j/d)  [d/2]
    angles = ops.cast(positions, "float32")[:, None] * ops.convert_to_tensor(inverse)[None, :]
    angles = ops.concatenate([angles, angles], axis=-1)  # [T, d]
    return ops.cos(angles), ops.sin(angles)


def rotate(x, cos, sin):
    """RoPE on `x` `(..., T, d)` with `rotary_angles`' `(T, d)` cos and sin:
    x cos + rotate_half(x) sin, rotate_half(x) = (-x_2, x_1) for halves x_1, x_2."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = ops.concatenate([-x2, x1], axis=-1)
    return x * ops.cast(cos, x.dtype) + rotated * ops.cast(sin, x.dtype)


@keras.saving.register_keras_serializable(package="keras_mha")
class RMSNorm(keras.layers.Layer):
    """x / sqrt(mean(x^2) + eps) * scale over the last axis, computed in float32
    (as Llama's reference does) and returned in the input's dtype."""

    def __init__(self, epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale", shape=(input_shape[-1],), initializer="ones", trainable=True
        )
        self.built = True

    def call(self, x):
        x32 = ops.cast(x, "float32")
        variance = ops.mean(ops.square(x32), axis=-1, keepdims=True)
        normed = x32 * ops.rsqrt(variance + self.epsilon)
        return ops.cast(normed * ops.cast(self.scale, "float32"), x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="keras_mha")
class SwiGLU(keras.layers.Layer):
    """The gated feed-forward: (silu(x W_gate) * (x W_up)) W_down, no biases."""

    def __init__(self, intermediate_dim: int, **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim = int(intermediate_dim)

    def build(self, input_shape):
        d = int(input_shape[-1])
        self.gate = keras.layers.Dense(self.intermediate_dim, use_bias=False, name="gate")
        self.up = keras.layers.Dense(self.intermediate_dim, use_bias=False, name="up")
        self.down = keras.layers.Dense(d, use_bias=False, name="down")
        self.gate.build(input_shape)
        self.up.build(input_shape)
        self.down.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        self.built = True

    def call(self, x):
        return self.down(ops.silu(self.gate(x)) * self.up(x))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim}
