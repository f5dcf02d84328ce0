"""Head importance is the mean absolute mask gradient; a dead head ranks last."""

from __future__ import annotations

import numpy as np
from heads_models import digits_like, tiny_model

from keras_mha import heads
from keras_mha.model import attention_layers, forward


def test_importance_is_the_mean_absolute_mask_gradient():
    model, _ = tiny_model()
    x, y = digits_like(n=6, seed=1)
    scores = heads.head_importance(model, x, y, batch_size=4)
    # Finite differences of each example's loss with respect to each head's mask.
    eps = 2e-3
    for layer in range(2):
        raw = np.zeros(4)
        for head in range(4):
            for i in range(len(x)):
                losses = []
                for delta in (eps, -eps):
                    head_masks = [np.ones(4, "float32"), np.ones(4, "float32")]
                    head_masks[layer][head] += delta
                    p = np.asarray(forward(model, x[i : i + 1], head_masks=head_masks))[0, y[i]]
                    losses.append(-np.log(p))
                raw[head] += abs((losses[0] - losses[1]) / (2 * eps))
        expected = raw / np.linalg.norm(raw)
        np.testing.assert_allclose(scores[layer], expected, atol=2e-3)
        assert abs(np.linalg.norm(scores[layer]) - 1.0) < 1e-5


def test_a_planted_dead_head_ranks_last():
    model, _ = tiny_model()
    layer = attention_layers(model)[1]
    value_kernel = np.asarray(layer.value_kernel).copy()
    value_kernel[:, 2] = 0.0  # (d_model, h, d_v): head 2's W^V
    layer.value_kernel.assign(value_kernel)
    value_bias = np.asarray(layer.value_bias).copy()
    value_bias[2] = 0.0
    layer.value_bias.assign(value_bias)
    x, y = digits_like(n=32, seed=2)
    scores = heads.head_importance(model, x, y)
    assert scores[1][2] == 0.0
    assert (scores[1][[0, 1, 3]] > 0.01).all()
    assert heads.rank_heads(scores)[0] == (1, 2)
    # A head already masked off scores 0 and is no longer ranked.
    head_masks = heads.all_heads_on(model)
    head_masks[0][1] = 0.0
    masked = heads.head_importance(model, x, y, head_masks)
    assert masked[0][1] == 0.0 and (0, 1) not in heads.rank_heads(masked, head_masks)


def test_selection_is_greedy_and_keeps_a_head_per_layer():
    model, _ = tiny_model()
    x, y = digits_like(n=32, seed=3)
    removed = heads.select_heads_to_prune(model, x, y, 0.5)
    assert len(removed) == 4 and len(set(removed)) == 4
    assert removed[0] == heads.rank_heads(heads.head_importance(model, x, y))[0]
    assert heads.count_heads(0.5, 8) == 4 and heads.count_heads(0.05, 10) == 1
