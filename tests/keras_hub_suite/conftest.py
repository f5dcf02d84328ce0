"""keras-hub's tests, run with keras_mha's layer underneath (README.md here).

`keras.layers.MultiHeadAttention` is replaced by ours before keras_hub is
imported: CachedMultiHeadAttention, TransformerEncoder/Decoder and the
Whisper, Moonshine and XLNet attention subclasses then build on our class.
The files are not named test_*.py, so the main pytest run does not collect
them; tests/keras_suite/run.py runs them (TensorFlow: keras-hub's test
helpers import it) with KERAS_MHA_HUB_SUITE=1, which turns the swap on.
"""

from __future__ import annotations

import os

import keras
import pytest

import keras_mha

# Only in the suite's own run: the main pytest run also loads this conftest
# when it walks tests/, and must keep Keras's class.
if os.environ.get("KERAS_MHA_HUB_SUITE") == "1":
    keras.layers.MultiHeadAttention = keras_mha.MultiHeadAttention


def pytest_configure(config):
    for marker in ("large", "extra_large", "multi_device", "kaggle_key_required"):
        config.addinivalue_line("markers", f"{marker}: keras-hub's marker")


def pytest_collection_modifyitems(config, items):
    # extra_large: every preset, downloaded from Kaggle at run time (no network here).
    skip = pytest.mark.skip(reason="keras-hub's extra_large: downloads presets from Kaggle")
    for item in items:
        if "extra_large" in item.keywords:
            item.add_marker(skip)
