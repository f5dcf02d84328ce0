"""keras-mha: multi-head attention as the lesson writes it, ready for the edge.

The names below load on first use (PEP 562), so that `python -m
keras_mha.train --help` answers without importing Keras and TensorFlow.
`from keras_mha import MultiHeadAttention` (or any other name below) imports
Keras and registers all of the package's layers for `keras.saving.load_model`; a bare
`import keras_mha` does not, so import a name (or `keras_mha.layers`) before
loading a `.keras` file.
"""

from __future__ import annotations

import importlib
import os as _os
import sys as _sys

# Before anything imports TensorFlow: its C++ start-up logs go to stderr.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

__version__ = "0.1.0"

_LAZY = {
    "MultiHeadAttention": "keras_mha.attention",
    "LayerNorm": "keras_mha.layers",
    "MaskedMeanPooling": "keras_mha.layers",
    "PositionalEncoding": "keras_mha.layers",
    "TransformerEncoderBlock": "keras_mha.layers",
    "ModelConfig": "keras_mha.model",
    "build_classifier": "keras_mha.model",
}
__all__ = [*sorted(_LAZY), "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        # Any of these names registers all of the package's layers, so that
        # keras.saving.load_model finds them whichever one was imported.
        importlib.import_module("keras_mha.layers")
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_mha' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if "keras" in _sys.modules:  # Keras is loaded already: register the layers now
    importlib.import_module("keras_mha.layers")
