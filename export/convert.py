"""Keras classifier -> batch-1 SavedModel -> one TFLite flatbuffer per mode.

The model is traced once into a SavedModel whose only signature takes a
batch of exactly 1 (`serving_default_inputs:0`); a dynamic batch adds about
twenty shape ops (SHAPE, GATHER, PACK, ...) to every graph. The trace calls
the model with `training=False`, the way `TFLiteConverter.from_keras_model`
does for Keras 3, so dropout is off. Each mode then converts that SavedModel
with builtin ops only (never SELECT_TF_OPS: a plain runtime has no Flex
kernels).

| mode      | weights | activations | model input / output        |
| --------- | ------- | ----------- | --------------------------- |
| float32   | float32 | float32     | as the Keras model          |
| dynamic   | int8*   | float32     | as the Keras model          |
| float16   | float16 | float32     | as the Keras model          |
| int8      | int8    | int8        | int8 (token ids: int32) / int8 |
| int16x8   | int8    | int16       | int16 (token ids: int32) / int16 |

(*) TFLite's dynamic-range quantizer leaves weights with fewer than 1024
elements in float32, so a very small model converts to the float32 graph.

TensorFlow is noisy (absl log lines, "Saved artifact at ...", converter
diagnostics printed from C++): `captured_output()` collects everything written
to the process's stdout/stderr while it runs, so a failure can still quote it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import keras

MODES = ("float32", "dynamic", "float16", "int8", "int16x8")


class ConversionError(Exception):
    """The converter could not produce a mode; the message is one line."""


def _flush_c_streams() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output() -> Iterator[list[str]]:
    """Collect what Python and native code print to stdout/stderr meanwhile.

    Yields a list that holds the captured lines once the block has ended.
    """
    lines: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no file descriptors to redirect (embedded interpreter)
        saved = None
    python_text = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        if saved is not None:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
        try:
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(python_text),
                contextlib.redirect_stderr(python_text),
            ):
                warnings.simplefilter("ignore")
                yield lines
        finally:
            _flush_c_streams()  # native printf output still in libc's buffers
            if saved is not None:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
            sink.seek(0)
            native = sink.read().decode(errors="replace")
            lines.extend((python_text.getvalue() + native).splitlines())


def import_tensorflow() -> types.ModuleType:
    """Import TensorFlow, Keras and keras_mha quietly; return `tensorflow`.

    keras_mha is imported so that its layers are registered before any
    `.keras` file is loaded (FIELD_NOTES.md: otherwise the error is vague).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with captured_output():
        import tensorflow as tf

        import keras_mha  # noqa: F401  (registers the custom layers)
    tf.get_logger().setLevel("ERROR")
    with contextlib.suppress(ImportError):
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    return tf


def write_saved_model(model: keras.Model, directory: str | os.PathLike) -> None:
    """Trace `model(x, training=False)` for a batch of 1 into a SavedModel."""
    import keras
    import tensorflow as tf

    spec = model.inputs[0]
    signature = [tf.TensorSpec((1, *spec.shape[1:]), spec.dtype, name="inputs")]
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", functools.partial(model.__call__, training=False), signature)
    with captured_output():
        archive.write_out(str(directory), verbose=False)


def _one_line(error: BaseException, captured: list[str]) -> str:
    """The most informative single line of a converter failure."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # MLIR diagnostics: "<loc>: error: 'tfl.neg' op ..." -> the part after "error:".
    for line in lines + [line.strip() for line in captured]:
        match = re.search(r"\berror: (.+)", line)
        if match and "converter error" not in match.group(1).lower():
            return re.sub(r"^loc\(.*?\):\s+", "", match.group(1).strip())
    if lines:
        return lines[0]
    return type(error).__name__


def convert(
    saved_model_dir: str | os.PathLike, mode: str, calibration: np.ndarray | None = None
) -> bytes:
    """Convert the batch-1 SavedModel to a TFLite flatbuffer in `mode`.

    `calibration`: representative model inputs `(N, ...)` for `int8` and
    `int16x8` (each fed as a batch of 1). Raises `ConversionError` with a
    one-line reason when the converter cannot produce the mode.
    """
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}; expected one of {MODES}.")
    tf = import_tensorflow()
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir))
    ops_set = tf.lite.OpsSet
    converter.target_spec.supported_ops = [ops_set.TFLITE_BUILTINS]
    if mode != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if mode in ("int8", "int16x8"):
        if calibration is None or len(calibration) == 0:
            raise ValueError(f"Mode {mode!r} needs calibration inputs.")
        samples = np.asarray(calibration)

        def representative_dataset():
            for x in samples:
                yield [x[None]]

        converter.representative_dataset = representative_dataset
    if mode in ("int8", "int16x8"):
        io_type = tf.int8 if mode == "int8" else tf.int16
        converter.target_spec.supported_ops = [
            ops_set.TFLITE_BUILTINS_INT8
            if mode == "int8"
            else ops_set.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
        ]
        if np.issubdtype(samples.dtype, np.floating):
            converter.inference_input_type = io_type  # token ids stay int32
        converter.inference_output_type = io_type
    captured: list[str] = []
    try:
        with captured_output() as captured:
            return bytes(converter.convert())
    except Exception as error:  # the converter raises many types; report one line
        reason = _one_line(error, captured)
        if (
            mode == "int16x8"
            and "min/max" in str(error)
            and calibration is not None
            and not np.issubdtype(np.asarray(calibration).dtype, np.floating)
        ):
            reason += " (TF's 16x8 quantizer cannot handle integer token-id inputs)"
        raise ConversionError(reason) from error
