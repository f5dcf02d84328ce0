"""Keras's own MultiHeadAttention tests, run against keras_mha's layer.

The suite module (keras_suite.py) is not named test_*.py, so the main pytest
run does not collect it; tests/keras_suite/run.py runs it on each backend.
This conftest registers the marker Keras's file uses and applies the
exclusion list (exclusions.py): each listed test is a strict xfail, so a
listed test that passes fails the run and the list can only shrink.
"""

from __future__ import annotations

import keras
import pytest

from keras_suite.exclusions import EXCLUDED


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "requires_trainable_backend: Keras's marker (skips on the numpy backend)"
    )


def pytest_collection_modifyitems(config, items):
    backend = keras.backend.backend()
    for item in items:
        if not str(item.fspath).endswith(("keras_suite.py", "gqa_suite.py")):
            continue
        for pattern, (backends, reason) in EXCLUDED.items():
            if item.name.startswith(pattern) and backend in backends:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
