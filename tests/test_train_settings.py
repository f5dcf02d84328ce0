"""Training settings: presets, validation, the memory estimate, augmentation."""

from __future__ import annotations

import numpy as np
import pytest

from bundle_contract.errors import UsageError
from keras_mha import data, train
from keras_mha.train import memory
from keras_mha.train.augment import shift_augment


def test_presets_are_valid_configs():
    for name in data.DATASETS:
        config, settings = train.resolve_settings(name)
        config.validate()
        assert settings.epochs > 0 and settings.patience > 0
    config, _ = train.resolve_settings("pronouns", model_options={"num_heads": 1})
    assert config.num_heads == 1 and config.d_model == train.PRESETS["pronouns"][0]["d_model"]
    with pytest.raises(UsageError, match="Unknown model option"):
        train.resolve_settings("digits", model_options={"sequence_length": 9})
    with pytest.raises(UsageError, match="Unknown distribution strategy 'tpu'"):
        train.resolve_settings("digits", distribute="tpu")
    with pytest.raises(UsageError, match="epochs must be a positive integer.*epochs=0"):
        train.resolve_settings("digits", epochs=0)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"input_kind": "tokens", "feature_dim": 40, "sequence_length": 16, "num_classes": 3},
        {"num_heads": [3, 1], "num_layers": 2, "key_dim": 4, "pooling": "flatten"},
        {"positional": "learned", "d_model": 12, "num_heads": 3},
    ],
    ids=["default", "tokens", "pruned-flatten", "learned-positions"],
)
def test_parameter_estimate_is_the_built_models_count(options):
    from keras_mha.model import ModelConfig, build_classifier

    config = ModelConfig(**options)
    assert memory.estimate_params(config) == build_classifier(config).count_params()


def test_a_model_too_large_for_the_memory_is_refused_before_it_is_built():
    config, settings = train.resolve_settings("digits", model_options={"d_model": 100000})
    with pytest.raises(UsageError, match=r"model too large .* 80,\d{3},\d{3},\d{3} parameters"):
        memory.check_fits(config, settings.batch_size, available=64 << 30)
    small, settings = train.resolve_settings("digits")
    memory.check_fits(small, settings.batch_size, available=64 << 30)  # 0.2 M parameters: fine
    need = memory.estimate_training_bytes(small, settings.batch_size)
    with pytest.raises(UsageError, match="of memory is available"):
        memory.check_fits(small, settings.batch_size, available=need - 1)
    assert memory.available_bytes() is None or memory.available_bytes() > 0


def test_shift_augment_moves_each_pixel_one_step():
    x = np.zeros((1, 3, 3), "float32")
    x[0, 1, 1] = 1.0
    shifted, y = shift_augment(x, np.array([7]))
    assert shifted.shape == (5, 3, 3) and y.tolist() == [7] * 5
    centres = [tuple(np.argwhere(s)[0]) for s in shifted]
    assert centres == [(1, 1), (2, 1), (0, 1), (1, 2), (1, 0)]
    edge = np.zeros((1, 3, 3), "float32")
    edge[0, 2, 0] = 1.0  # shifted off the image: zero fill, no wrap-around
    assert shift_augment(edge, np.array([0]))[0][1].sum() == 0.0
