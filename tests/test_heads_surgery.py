"""Pruning removes heads for real, and the smaller model equals the masked one."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from heads_models import digits_like, tiny_model, tiny_token_model

from keras_mha import heads
from keras_mha.heads.surgery import ffn_layers
from keras_mha.model import ModelConfig, attention_layers, build_classifier, forward


def test_pruning_equals_masking_and_really_removes_weights(tmp_path):
    model, config = tiny_model()
    x, _ = digits_like()
    remove = {0: [1, 3], 1: [0]}
    head_masks = [np.array([1, 0, 1, 0], "float32"), np.array([0, 1, 1, 1], "float32")]
    masked = np.asarray(forward(model, x, head_masks=head_masks))
    full = np.asarray(model(x))
    assert np.abs(masked - full).max() > 1e-4  # the masked heads did matter
    pruned, pruned_config = heads.prune_model(model, remove, config)
    assert heads.heads_per_layer(pruned) == [2, 3]
    assert pruned_config.num_heads == [2, 3] and pruned_config.key_dim == 4
    assert build_classifier(pruned_config).count_params() == pruned.count_params()
    np.testing.assert_allclose(np.asarray(pruned(x)), masked, atol=1e-5)
    # Each removed head takes 3 * (16*4 + 4) projection weights and 4*16 of W^O.
    per_head = 3 * (16 * 4 + 4) + 4 * 16
    assert pruned.count_params() == model.count_params() - 3 * per_head
    assert tuple(attention_layers(pruned)[0].output_kernel.shape) == (2, 4, 16)  # (h, d_v, d)
    # The pruned model saves and loads with its new head counts.
    pruned.save(tmp_path / "pruned.keras")
    reloaded = keras.saving.load_model(tmp_path / "pruned.keras")
    assert heads.heads_per_layer(reloaded) == [2, 3]
    np.testing.assert_allclose(np.asarray(reloaded(x)), masked, atol=1e-5)


def test_token_model_prunes_with_padding():
    model, config = tiny_token_model()
    ids = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 6, 7, 8, 9], [2, 2, 0, 0, 0, 0]], "int32")
    head_masks = [np.array([0, 1, 1, 1], "float32"), np.array([1, 1, 0, 1], "float32")]
    pruned, _ = heads.prune_model(model, {0: [0], 1: [2]}, config)
    np.testing.assert_allclose(
        np.asarray(pruned(ids)), np.asarray(forward(model, ids, head_masks=head_masks)), atol=1e-5
    )


def test_pruning_refuses_an_empty_layer_and_a_config_of_another_model():
    model, config = tiny_model()
    with pytest.raises(ValueError, match="leave layer 1 with no head"):
        heads.prune_model(model, {1: [0, 1, 2, 3]}, config)
    with pytest.raises(ValueError, match="config has heads"):
        heads.prune_model(model, {}, ModelConfig(d_model=16, num_heads=2, num_layers=2))


def test_keras_anchor_classifier_equals_ours_with_the_same_weights():
    """implementation="keras" swaps in keras.layers.MultiHeadAttention (benchmarks)."""
    from keras_mha import MultiHeadAttention

    anchor = build_classifier(
        ModelConfig(d_model=16, num_heads=4, num_layers=2, ff_dim=16, implementation="keras")
    )
    ours = build_classifier(ModelConfig(d_model=16, num_heads=4, num_layers=2, ff_dim=16))
    for layer in anchor.layers:
        if not layer.weights:
            continue
        target = ours.get_layer(layer.name)
        if hasattr(layer, "attention"):
            assert isinstance(layer.attention, keras.layers.MultiHeadAttention)
            target.attention.set_weights(
                MultiHeadAttention.from_keras(layer.attention).get_weights()
            )
            for name in ("attention_norm", "ffn_norm"):
                getattr(target, name).set_weights(getattr(layer, name).get_weights())
            for mine, theirs in zip(ffn_layers(target), ffn_layers(layer)):
                mine.set_weights(theirs.get_weights())
        else:
            target.set_weights(layer.get_weights())
    x, _ = digits_like(n=5, seed=4)
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(anchor(x)), atol=1e-5)
    assert anchor.count_params() == ours.count_params()
