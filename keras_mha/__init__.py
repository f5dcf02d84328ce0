"""keras-mha: multi-head attention as the lesson writes it, ready for the edge."""

from keras_mha.attention import MultiHeadAttention
from keras_mha.layers import (
    LayerNorm,
    MaskedMeanPooling,
    PositionalEncoding,
    TransformerEncoderBlock,
)
from keras_mha.model import ModelConfig, build_classifier

__version__ = "0.1.0"
__all__ = [
    "LayerNorm",
    "MaskedMeanPooling",
    "ModelConfig",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TransformerEncoderBlock",
    "__version__",
    "build_classifier",
]
