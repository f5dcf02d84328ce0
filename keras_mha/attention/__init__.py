"""`keras_mha.attention`: the multi-head attention layer, as the lesson writes it.

    layer.py        MultiHeadAttention: the lesson's steps and the public API
                    (grouped-query attention with num_key_value_heads)
    grouped.py      GroupedQueryAttention: the same layer under Keras's GQA arguments
    args.py         its constructor's arguments and input sizes, checked
    masks.py        masks, attention axes, a call's inputs
    weights.py      per-head weights, pruning, Keras's layer to and fro, 0.1 files
    keras_names.py  Keras's private names and hooks, for subclasses of Keras's layer
    recording.py    the attention weights a model records (its attention signature)

Import the layer from here (or `keras_mha`); the modules are the package's own.
"""

from .args import IMPLEMENTATIONS
from .grouped import GroupedQueryAttention, GroupQueryAttention
from .layer import MultiHeadAttention
from .recording import attention_sink, recording

__all__ = [
    "IMPLEMENTATIONS",
    "GroupQueryAttention",
    "GroupedQueryAttention",
    "MultiHeadAttention",
    "attention_sink",
    "recording",
]

# Keras imported for the first time by layer.py above: the package's other
# layers register now that MultiHeadAttention is bound (keras_mha/__init__.py).
from keras_mha import register_deferred  # noqa: E402

register_deferred()
