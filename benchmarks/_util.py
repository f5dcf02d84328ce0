"""Shared by the benchmark scripts."""

from __future__ import annotations

import pathlib


def write_json_atomic(path: pathlib.Path, data) -> None:
    """Write `data` as JSON to `path` through a temporary file and a rename."""
    from keras_mha import fsutil  # here: keras_mha imports Keras and TensorFlow

    fsutil.write_json_atomic(path, data)
    print(f"\nwrote {path}")
