"""Same seed, same machine, same numbers: TensorFlow's op determinism for a block.

Determinism holds within one machine (and one process or across processes
on it); another CPU rounds differently and trains to different numbers
(docs/field_notes.md, "Determinism").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def op_determinism(enabled: bool) -> Iterator[None]:
    """Enable TensorFlow op determinism for a block, then restore the old state.

    TensorFlow has no public switch back, so the restore uses its internal
    config module when present (enabling is a process-wide setting).
    """
    if not enabled:
        yield
        return
    import tensorflow as tf

    try:
        from tensorflow.python.framework import config as tf_config

        was_enabled = tf_config.is_op_determinism_enabled()
    except (ImportError, AttributeError):
        tf_config, was_enabled = None, True
    tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if not was_enabled:
            tf_config.disable_op_determinism()
