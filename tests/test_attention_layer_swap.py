"""keras_mha.convert: a model built with keras.layers.MultiHeadAttention (or
keras-hub's layers that hold one) on our layer, weights carried, outputs
equal, on any backend (run on JAX and PyTorch by tests/keras_suite/run.py)."""

from __future__ import annotations

import importlib.util

import keras
import numpy as np
import pytest

import keras_mha
from keras_mha import MultiHeadAttention
from keras_mha.attention import attention_sink

npy = keras.ops.convert_to_numpy
HUB = importlib.util.find_spec("keras_hub") is not None
needs_hub = pytest.mark.skipif(not HUB, reason="keras-hub is not installed (make install)")


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def assert_close(got, want, rtol=1e-5):
    """Equal to float32 rounding: max |got - want| <= rtol * max(1, max |want|)."""
    got, want = npy(got), npy(want)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= rtol * scale, float(np.abs(got - want).max())


def keras_classifier(seed=3):
    """A functional model of Keras's layers: attention with a padding mask."""
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 16, mask_zero=True)(tokens)
    h = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4, name="mha")(x, x)
    # Add (not +) carries the mask on to the pooling: padded rows, where
    # Keras's two paths differ (docs/layer.md), are not read.
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, x]))
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(tokens, out)


TOKENS = np.array([[3, 5, 7, 2, 0, 0], [1, 4, 9, 9, 8, 6]], "int32")  # padded


@pytest.mark.parametrize("implementation", ["fused", "per_head"])
def test_a_functional_model_gets_our_layer_and_the_same_outputs(implementation):
    model = keras_classifier()
    converted = keras_mha.convert(model, implementation=implementation)
    layer = converted.get_layer("mha")
    assert type(layer) is MultiHeadAttention and layer.implementation == implementation
    assert type(model.get_layer("mha")) is keras.layers.MultiHeadAttention  # not changed
    assert_close(converted(TOKENS), model(TOKENS))
    assert [w.path for w in converted.weights] == [w.path for w in model.weights]
    # the per-head tools on it: head i's matrices are Keras's kernel slices
    kernel = npy(model.get_layer("mha").query_dense.kernel)
    np.testing.assert_array_equal(layer.head_weights(1)["query_kernel"], kernel[:, 1, :])


class Block(keras.layers.Layer):
    """A user's layer that creates its attention in build (as keras-hub's do)."""

    def build(self, shape):
        self.norm = keras.layers.LayerNormalization()
        self.norm.build(shape)
        self.attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
        self.attention.build(shape, shape)
        self.dense = keras.layers.Dense(shape[-1])
        self.dense.build(shape)

    def call(self, x):
        return self.dense(x + self.attention(self.norm(x), self.norm(x)))


def test_attention_created_in_build_is_replaced_where_it_sits():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, Block(name="block")(inputs))
    x = randn(2, 5, 8)
    converted = keras_mha.convert(model)
    block = converted.get_layer("block")
    assert type(block.attention) is MultiHeadAttention
    # the parent's sublayers keep their order, so its weights do (and their paths)
    assert [type(s).__name__ for s in block._layers] == [
        "LayerNormalization",
        "MultiHeadAttention",
        "Dense",
    ]
    # (the copy's unnamed sublayers get new names, as in any Keras copy)
    for ours, theirs in zip(converted.weights, model.weights, strict=True):
        np.testing.assert_array_equal(npy(ours), npy(theirs))
    assert_close(converted(x), model(x))
    # silencing a head of the converted layer changes the block's output
    full = npy(block.attention(x, x))
    silenced = npy(block.attention(x, x, head_mask=np.array([1.0, 0.0], "float32")))
    assert float(np.abs(full - silenced).max()) > 1e-3


def test_a_subclass_becomes_the_same_class_on_our_base():
    class Doubled(keras.layers.MultiHeadAttention):  # Keras's override point
        def _compute_attention(self, query, key, value, attention_mask=None, *args, **kwargs):
            out, scores = super()._compute_attention(
                query, key, value, attention_mask, *args, **kwargs
            )
            return out * 2.0, scores

    class Holder(keras.layers.Layer):
        def build(self, shape):
            self.attention = Doubled(num_heads=2, key_dim=4)
            self.attention.build(shape, shape)

        def call(self, x):
            return self.attention(x, x)

    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, Holder(name="holder")(inputs))
    x = randn(2, 5, 8, seed=2)
    converted = keras_mha.convert(model)
    new = converted.get_layer("holder").attention
    assert isinstance(new, MultiHeadAttention) and type(new).__name__ == "Doubled"
    assert not isinstance(new, keras.layers.MultiHeadAttention)
    assert_close(converted(x), model(x))


def test_what_cannot_be_converted_is_one_line_naming_the_layer():
    class ReadsKerasSoftmax(keras.layers.MultiHeadAttention):  # an internal ours lacks
        def _compute_attention(self, query, key, value, attention_mask=None, *args, **kwargs):
            scores = keras.ops.einsum(self._dot_product_equation, key, query)
            weights = self._softmax(scores * self._inverse_sqrt_key_dim)
            return keras.ops.einsum(self._combine_equation, weights, value), weights

    class Holder(keras.layers.Layer):
        def build(self, shape):
            self.attention = ReadsKerasSoftmax(num_heads=2, key_dim=4, name="odd_attention")
            self.attention.build(shape, shape)

        def call(self, x):
            return self.attention(x, x)

    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, Holder()(inputs))
    with pytest.raises(ValueError) as info:
        keras_mha.convert(model)
    message = str(info.value)
    assert "\n" not in message and "'odd_attention' (" in message and "_softmax" in message


def test_attention_held_in_a_list_is_refused_not_left_behind():
    class Stack(keras.layers.Layer):
        def build(self, shape):
            self.heads = [keras.layers.MultiHeadAttention(num_heads=2, key_dim=2, name="in_list")]
            self.heads[0].build(shape, shape)

        def call(self, x):
            return self.heads[0](x, x)

    inputs = keras.Input((None, 4))
    model = keras.Model(inputs, Stack()(inputs))
    with pytest.raises(ValueError, match="cannot reach 'in_list' .*in a list or dict"):
        keras_mha.convert(model)


def test_bad_inputs_are_one_line():
    with pytest.raises(ValueError, match="expects a Keras model or layer"):
        keras_mha.convert("model.keras")
    unbuilt = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)
    with pytest.raises(ValueError, match="needs a built model"):
        keras_mha.convert(unbuilt)
    inputs = keras.Input((4,))
    plain = keras.Model(inputs, keras.layers.Dense(2)(inputs), name="plain")
    with pytest.raises(ValueError, match="found no keras.layers.MultiHeadAttention in 'plain'"):
        keras_mha.convert(plain)


def test_a_single_layer_converts_too():
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
    x = randn(2, 4, 6)
    want = layer(x, x)
    assert_close(keras_mha.convert(layer)(x, x), want)


# ------------------------------------------------------------------ keras-hub
def hub_models():
    import keras_hub

    small = dict(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16)
    ids = np.random.default_rng(0).integers(1, 50, (2, 10)).astype("int32")
    padding = np.ones((2, 10), "int32")
    padding[0, 7:] = 0
    bert = keras_hub.models.BertBackbone(max_sequence_length=10, **small)
    gpt2 = keras_hub.models.GPT2Backbone(max_sequence_length=10, **small)
    bert_in = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": padding}
    return {
        "bert": (bert, bert_in, "TransformerEncoder", "MultiHeadAttention"),
        "gpt2": (
            gpt2,
            {"token_ids": ids, "padding_mask": padding},
            "TransformerDecoder",
            "CachedMultiHeadAttention",
        ),
    }


@needs_hub
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_keras_hub_backbones_run_on_our_layer(name):
    keras.utils.set_random_seed(0)
    model, inputs, block, attention = hub_models()[name]
    converted = keras_mha.convert(model)
    layers = [
        layer
        for layer in converted._flatten_layers()
        if isinstance(layer, (MultiHeadAttention, keras.layers.MultiHeadAttention))
    ]
    assert len(layers) == 2 and all(isinstance(layer, MultiHeadAttention) for layer in layers)
    assert {type(layer).__name__ for layer in layers} == {attention}
    assert all(
        type(p).__name__ == block
        for p in converted._flatten_layers()
        if "transformer_layer" in p.name
    )
    want, got = model(inputs), converted(inputs)
    want = want["sequence_output"] if isinstance(want, dict) else want
    got = got["sequence_output"] if isinstance(got, dict) else got
    assert_close(got, want)


@needs_hub
def test_keras_hub_cached_generation_gives_the_same_tokens():
    """GPT-2's causal LM generates token by token through the attention
    cache (CachedMultiHeadAttention, rebased on ours): the same tokens."""
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone, _, _, _ = hub_models()["gpt2"]
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(sampler="greedy")
    converted = keras_hub.models.GPT2CausalLM(
        backbone=keras_mha.convert(backbone), preprocessor=None
    )
    converted.compile(sampler="greedy")
    prompt = {
        "token_ids": np.array([[5, 9, 2, 0, 0, 0, 0, 0, 0, 0]], "int32"),
        "padding_mask": np.array([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]], "bool"),
    }
    want = npy(lm.generate(prompt, stop_token_ids=None)["token_ids"])
    got = npy(converted.generate(prompt, stop_token_ids=None)["token_ids"])
    np.testing.assert_array_equal(got, want)
    assert (want[0, 3:] != 0).all()  # it generated to the end


# ------------------------------------------------- attention weights, any model
def hub_classifier(seed=5):
    """keras-io's text classifier: keras-hub's token and position embedding,
    two TransformerEncoders (on keras.layers.MultiHeadAttention), pooling."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((6,), dtype="int32")
    x = keras_hub.layers.TokenAndPositionEmbedding(20, 6, 8, mask_zero=True)(tokens)
    for i in range(2):
        x = keras_hub.layers.TransformerEncoder(16, num_heads=2, name=f"encoder_{i}")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(3, activation="softmax")(x))


@needs_hub
def test_attention_model_reads_a_converted_keras_hub_model():
    """The attention signature's model (keras_mha.model.attention_model) on a
    model the user built with keras-hub: after convert, every encoder's
    weights, equal to those Keras's own layer computes in the original."""
    from keras_mha.model import attention_model, attention_recorders

    original = hub_classifier()
    converted = keras_mha.convert(original)
    assert [layer.name for layer in attention_recorders(original)] == []
    assert len(attention_recorders(converted)) == 2
    outputs = attention_model(converted, batch_size=None)(TOKENS)
    assert list(outputs) == ["attention_0", "attention_1"]
    # The weights Keras's own layer computes in the original model, as it runs
    # (its call wrapped for the test to return them too).
    recorded = []
    for i in range(2):
        keras_layer = original.get_layer(f"encoder_{i}")._self_attention_layer

        def recording(*args, _call=keras_layer.call, **kwargs):
            output, scores = _call(*args, **{**kwargs, "return_attention_scores": True})
            recorded.append(scores)
            return output

        keras_layer.call = recording
    original(TOKENS)
    assert len(recorded) == 2
    for i, want in enumerate(recorded):
        got = outputs[f"attention_{i}"]
        assert tuple(got.shape) == (2, 2, 6, 6)
        assert_close(got, want)
    assert float(np.abs(npy(outputs["attention_0"])[0, :, :, 4:]).max()) == 0.0  # padded keys
    left = [x.name for x in converted._flatten_layers() if attention_sink(x) is not None]
    assert left == []


def test_attention_model_reads_nested_models_and_refuses_none():
    """Attention inside a nested model is found; a model without ours is one line."""
    from keras_mha.model import attention_model

    inner = keras_classifier()
    tokens = keras.Input((None,), dtype="int32")
    outer = keras.Model(tokens, inner(tokens))
    with pytest.raises(ValueError, match="has no keras_mha MultiHeadAttention.*keras_mha.convert"):
        attention_model(outer, batch_size=None)
    converted = keras_mha.convert(outer)
    weights = attention_model(converted, batch_size=None)(TOKENS)["attention_0"]
    _, want = keras_mha.convert(inner).get_layer("mha")(
        inner.layers[1](TOKENS), inner.layers[1](TOKENS),
        attention_mask=(TOKENS != 0)[:, None, :], return_attention_scores=True,
    )  # fmt: skip
    assert tuple(weights.shape) == (2, 4, 6, 6)
    assert_close(weights, want)
