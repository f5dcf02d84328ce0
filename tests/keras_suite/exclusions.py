"""The one list of Keras's MultiHeadAttention tests that keras_mha does not pass.

test name prefix -> (backends, reason). A test may be listed only where it
depends on a private detail of Keras's implementation that a replacement
cannot honour without giving up the lesson's layout. Each entry is a strict
xfail (conftest.py): when a listed test starts passing, the run fails.
"""

from __future__ import annotations

ALL = ("tensorflow", "jax", "torch")

EXCLUDED: dict[str, tuple[tuple[str, ...], str]] = {}
