# keras-hub's keras_hub/src/models/xlnet/xlnet_backbone_test.py, unchanged below this header.
# Copied from keras-team/keras-hub at 71453d08f59e (2026-08-21; we install 0.32.0);
# Copyright 2024, KerasHub authors; Apache License 2.0. See README.md here.

import pytest
from keras import ops

from keras_hub.src.models.xlnet.xlnet_backbone import XLNetBackbone
from keras_hub.src.tests.test_case import TestCase


class XLNetTest(TestCase):
    def setUp(self):
        self.init_kwargs = {
            "vocabulary_size": 10,
            "num_layers": 2,
            "num_heads": 2,
            "hidden_dim": 2,
            "intermediate_dim": 4,
        }
        self.input_data = {
            "token_ids": ops.ones((2, 5), dtype="int32"),
            "segment_ids": ops.zeros((2, 5), dtype="int32"),
            "padding_mask": ops.ones((2, 5), dtype="int32"),
        }

    def test_backbone_basics(self):
        self.run_backbone_test(
            cls=XLNetBackbone,
            init_kwargs=self.init_kwargs,
            input_data=self.input_data,
            expected_output_shape=(2, 5, 2),
        )

    @pytest.mark.large
    def test_saved_model(self):
        self.run_model_saving_test(
            cls=XLNetBackbone,
            init_kwargs=self.init_kwargs,
            input_data=self.input_data,
        )

    def test_litert_export(self):
        self.run_litert_export_test(
            cls=XLNetBackbone,
            init_kwargs=self.init_kwargs,
            input_data=self.input_data,
        )
