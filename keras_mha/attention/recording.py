"""Recording the attention weights layers compute, for the attention signature.

While `recording(layers)` is open, each of those layers appends `(itself,
weights)` to its list on every call, the weights `(B, h, T, S)` it computed
(`keras_mha.model.attention_model`). A context variable, not an attribute of
the layer: another thread (which starts in a context of its own) calling the
same model records nothing, and a recording inside a recording ends without
touching the outer one. Not in the config.
"""

from __future__ import annotations

import contextlib
import contextvars

_RECORDING: contextvars.ContextVar[dict[int, list] | None] = contextvars.ContextVar(
    "keras_mha_attention_recording", default=None
)


def attention_sink(layer) -> list | None:
    """The list `layer` records its attention weights to now; None: not recording."""
    sinks = _RECORDING.get()
    return None if sinks is None else sinks.get(id(layer))


@contextlib.contextmanager
def recording(layers):
    """Record the attention weights `layers` compute while open: yields the list
    they append `(layer, weights)` to, in the order they run."""
    sink: list = []
    token = _RECORDING.set({**(_RECORDING.get() or {}), **{id(layer): sink for layer in layers}})
    try:
        yield sink
    finally:
        _RECORDING.reset(token)
