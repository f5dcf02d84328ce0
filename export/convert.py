"""Keras model (any task) -> batch-1 SavedModel -> one TFLite flatbuffer per mode.

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

Attention weights ride along as a second signature (docs/artifacts.md):
with `attention_saved_model_dir` (`write_attention_saved_model`), `convert`
also converts `keras_mha.model.attention_model` in the same mode and appends
its subgraph to the task model's flatbuffer (`add_view_signature`):

| subgraph | signature         | input    | outputs                              |
| -------- | ----------------- | -------- | ------------------------------------ |
| 0        | `serving_default` | `inputs` | the task's output (probabilities, vectors, scores) |
| 1        | `view`            | `inputs` | `attention_0` .. : (1, h, T, T) each |

Subgraph 0 is the single-signature model unchanged (ops, tensors,
quantization, weights), so its outputs are bit-identical and TFLite Micro,
which runs subgraph 0, still runs the task's model. One SavedModel with both
signatures converted at once does not do: its int16x8 quantizer corrupts the
scales of constants the signatures share, and LiteRT aborts running the
second one. `attention_signature(model)` describes the outputs.

Export writes these for every task (bundle_contract/tasks/): a classifier's
probabilities, an encoder's sentence vectors, a cross-encoder's scores.

TensorFlow is noisy (absl log lines, "Saved artifact at ...", converter
diagnostics printed from C++): `captured_output()` collects everything written
to the process's stdout/stderr while it runs, so a failure can still quote it.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import types
from typing import TYPE_CHECKING

import numpy as np

from bundle_contract.arrays import own_lengths

from . import tflite_schema

if TYPE_CHECKING:
    import keras

MODES = ("float32", "dynamic", "float16", "int8", "int16x8")
CLASSIFY_SIGNATURE = "serving_default"
VIEW_SIGNATURE = "view"
# The attention subgraph's name. Runtimes apply no delegate to a subgraph named
# "VALIDATION:...": tflite-runtime 2.14's XNNPACK delegate keeps the float32
# copies of float16 weights for all subgraphs in one growing vector, so a
# second delegated subgraph moved the classifier's copies and its float16
# probabilities came out 0.98 off (docs/artifacts.md). The view runs on the
# builtin kernels; the classifier keeps its delegate.
VIEW_SUBGRAPH_NAME = "VALIDATION:view"


class ConversionError(Exception):
    """The converter could not produce a mode; the message is one line."""


def import_tensorflow() -> types.ModuleType:
    """Import TensorFlow, Keras and keras_mha quietly; return `tensorflow`.

    keras_mha.layers is imported so that its layers are registered before any
    `.keras` file is loaded (docs/field_notes.md: otherwise the error is vague).
    """
    from keras_mha import quiet_tensorflow as quiet  # here: importing the package stays light

    tf = quiet.import_tensorflow()
    with quiet.captured_output():
        import keras_mha.layers  # noqa: F401  (registers the custom layers)
    return tf


def write_saved_model(
    model: keras.Model, directory: str | os.PathLike, length: int | None = None
) -> None:
    """Trace `model(x, training=False)` for a batch of 1 into a SavedModel.

    `length`: trace a token-id input of dynamic length at `(1, length)`."""
    import keras
    import tensorflow as tf

    from keras_mha.quiet_tensorflow import (
        captured_output,  # not at the top: the package stays light
    )

    spec = model.inputs[0]
    shape = (1, *spec.shape[1:]) if length is None else (1, int(length))
    signature = [tf.TensorSpec(shape, spec.dtype, name="inputs")]
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", functools.partial(model.__call__, training=False), signature)
    with captured_output():
        archive.write_out(str(directory), verbose=False)


def write_attention_saved_model(
    model: keras.Model, directory: str | os.PathLike, length: int | None = None
) -> None:
    """The classifier's attention weights (`attention_model`) as a batch-1 SavedModel.

    Its outputs are named `attention_0`, `attention_1`, ... (one per keras_mha
    attention layer, in the order they run).
    """
    from keras_mha.model import attention_model

    write_saved_model(attention_model(model, batch_size=1), directory, length)


def saved_models(
    model: keras.Model,
    scratch: pathlib.Path,
    view: bool,
    ranges: dict | None = None,
    length: int | None = None,
    newton_steps: int = 0,
) -> tuple[pathlib.Path, pathlib.Path | None]:
    """The SavedModels a mode converts: the model's and, with `view`, its attention's.

    With `ranges` (keras_mha.qat's ranges.json) every quantization point rounds
    to its range (FakeQuant ops, which the converter takes as the tensors' int8
    ranges) while they are traced. `length`: traced at that fixed sequence
    length (`write_saved_model`). `newton_steps`: every LayerNorm's inverse std
    refined with that many Newton steps (`keras_mha.layers.newton_refined`: the
    int16x8 graph of a token-id model)."""
    from keras_mha.layers import newton_refined

    suffix = ("" if ranges is None else "_ranges") + (
        f"_newton{newton_steps}" if newton_steps else ""
    )
    model_dir = scratch / f"saved_model{suffix}"
    view_dir = scratch / f"attention_saved_model{suffix}" if view else None
    if ranges is not None:
        from keras_mha import qat

        qat.attach(model, ranges)
    try:
        with newton_refined(model, newton_steps):
            write_saved_model(model, model_dir, length)
            if view_dir is not None:
                write_attention_saved_model(model, view_dir, length)
    finally:
        if ranges is not None:
            qat.detach(model)
    return model_dir, view_dir


def attention_weights(model: keras.Model, x: np.ndarray) -> list[np.ndarray]:
    """The float Keras model's attention weights on `x`, float32, one array a layer
    (`keras_mha.model.attention_model`: dropout off)."""
    from bundle_contract.attention import output_name
    from keras_mha.model import attention_model

    outputs = attention_model(model, batch_size=None).predict(x, batch_size=64, verbose=0)
    return [np.asarray(outputs[output_name(i)], np.float32) for i in range(len(outputs))]


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
    saved_model_dir: str | os.PathLike,
    mode: str,
    calibration: np.ndarray | None = None,
    *,
    attention_saved_model_dir: str | os.PathLike | None = None,
    pad_id: int | None = None,
) -> bytes:
    """Convert the batch-1 SavedModel to a TFLite flatbuffer in `mode`.

    `calibration`: representative model inputs `(N, ...)` for `int8` and
    `int16x8` (each fed as a batch of 1). `pad_id` (token ids, a dynamic
    sequence axis): each sentence is fed at its own length, without its
    trailing `pad_id`s, as the device runs it, so padding never widens a range.
    `attention_saved_model_dir` (from
    `write_attention_saved_model`): also convert it, with the same
    calibration, and add it as the `view` signature (module docstring).
    Raises `ConversionError` with a one-line reason when the converter
    cannot produce the mode.
    """
    classifier = _convert_one(saved_model_dir, mode, calibration, pad_id)
    if attention_saved_model_dir is None:
        return classifier
    attention = _convert_one(attention_saved_model_dir, mode, calibration, pad_id)
    try:
        return add_view_signature(classifier, attention)
    except ValueError as error:
        raise ConversionError(f"cannot add the attention signature: {error}") from error


def _convert_one(
    saved_model_dir: str | os.PathLike,
    mode: str,
    calibration: np.ndarray | None,
    pad_id: int | None = None,
) -> bytes:
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}; expected one of {MODES}.")
    if mode == "int16x8" and token_ids(calibration):
        # TF's 16x8 quantizer cannot take integer inputs; ai-edge-quantizer can (aeq.py)
        from . import aeq

        float_model = _convert_one(saved_model_dir, "float32", None)
        try:
            return aeq.quantize_int16x8(float_model, np.asarray(calibration), pad_id)
        except aeq.AeqMissing as error:
            raise ConversionError(str(error)) from None
        except Exception as error:  # AEQ raises many types; report one line
            raise ConversionError(f"ai-edge-quantizer: {_one_line(error, [])}") from error
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

        lengths = None if pad_id is None else own_lengths(samples, pad_id)  # the device's rule

        def representative_dataset():
            for i, x in enumerate(samples):
                yield [x[None] if lengths is None else x[None, : int(lengths[i])]]

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
    return run_converter(converter)


def run_converter(converter) -> bytes:
    """`converter.convert()`, its output captured; ConversionError (one line) if it fails."""
    from keras_mha.quiet_tensorflow import (
        captured_output,  # not at the top: the package stays light
    )

    captured: list[str] = []
    try:
        with captured_output() as captured:
            return bytes(converter.convert())
    except Exception as error:  # the converter raises many types; report one line
        raise ConversionError(_one_line(error, captured)) from error


def token_ids(calibration: np.ndarray | None) -> bool:
    """Whether the calibration inputs are integer (token ids), not floats."""
    return (
        calibration is not None
        and len(calibration) > 0
        and not np.issubdtype(np.asarray(calibration).dtype, np.floating)
    )


# --- the attention signature ------------------------------------------------------


def _unpack(model: bytes, what: str):
    unpacked = tflite_schema.unpack(model, what)
    if len(unpacked.subgraphs or []) != 1 or len(unpacked.signatureDefs or []) != 1:
        raise ValueError(f"the {what} must have one subgraph and one signature")
    if any(b.offset for b in unpacked.buffers or []):
        raise ValueError(f"the {what} keeps buffers outside the flatbuffer (> 2 GB)")
    return unpacked


def add_view_signature(classifier: bytes, attention: bytes) -> bytes:
    """The classifier flatbuffer plus the attention model's subgraph as `view`.

    Both are single-signature models of one conversion mode. The classifier's
    subgraph, buffers, operator codes and metadata stay as they are (subgraph
    0, `serving_default`); the attention subgraph becomes subgraph 1 with the
    signature `view`, its operator codes merged and its weight buffers
    shared with the classifier's where the bytes are identical.
    """
    model = _unpack(classifier, "classifier model")
    extra = _unpack(attention, "attention model")
    if model.signatureDefs[0].signatureKey.decode() != CLASSIFY_SIGNATURE:
        raise ValueError(f"the classifier's signature is not {CLASSIFY_SIGNATURE!r}")

    def code_key(code) -> tuple:
        return (code.deprecatedBuiltinCode, code.builtinCode, code.customCode, code.version)

    codes = {code_key(code): i for i, code in enumerate(model.operatorCodes)}
    code_map = []
    for code in extra.operatorCodes:
        if code_key(code) not in codes:
            codes[code_key(code)] = len(model.operatorCodes)
            model.operatorCodes.append(code)
        code_map.append(codes[code_key(code)])

    if model.buffers[0].data is not None and len(model.buffers[0].data):
        raise ValueError("the classifier's buffer 0 is not the empty buffer")
    by_bytes = {
        np.asarray(b.data, np.uint8).tobytes(): i
        for i, b in enumerate(model.buffers)
        if b.data is not None and len(b.data)
    }
    buffer_map = []
    for b in extra.buffers:
        if b.data is None or len(b.data) == 0:
            buffer_map.append(0)  # no data: the shared empty buffer
            continue
        key = np.asarray(b.data, np.uint8).tobytes()
        if key not in by_bytes:
            by_bytes[key] = len(model.buffers)
            model.buffers.append(b)
        buffer_map.append(by_bytes[key])

    graph = extra.subgraphs[0]
    for tensor in graph.tensors:
        tensor.buffer = buffer_map[tensor.buffer]
        tensor.name = _short_name(tensor.name or b"")
    for op in graph.operators:
        op.opcodeIndex = code_map[op.opcodeIndex]
    graph.name = VIEW_SUBGRAPH_NAME.encode()
    signature = extra.signatureDefs[0]
    signature.signatureKey = VIEW_SIGNATURE.encode()
    signature.subgraphIndex = len(model.subgraphs)
    model.subgraphs.append(graph)
    model.signatureDefs.append(signature)
    return tflite_schema.pack_aligned(model, len(classifier) + len(attention))


def _short_name(name: bytes) -> bytes:
    """`view/<layer path>` from the converter's `a/attention_weights_1/b/c;...` names.

    The converter joins the names of fused ops with ';' and prefixes every
    op of the attention model with its wrapper's path; the first op's path
    inside the classifier is enough to find a tensor (and keeps the file small).
    """
    first = name.decode(errors="replace").split(";")[0]
    inner = re.sub(r"^.*?/attention_weights(_\d+)?/", "", first)
    return f"{VIEW_SIGNATURE}/{inner}".encode()


def attention_signature(model: bytes) -> dict | None:
    """Describe the `view` signature's tensors (docs/artifacts.md); None without one.

    `{"signature": "view", "subgraph": 1, "input": {...}, "outputs": [{"name":
    "attention_0", "layer": 0, "shape": [1, h, T, T], "dtype": "int8",
    "scale": 0.00390625, "zero_point": -128}, ...]}`, outputs in layer order;
    `scale` and `zero_point` are None for float tensors. Reads the
    flatbuffer only (no interpreter).
    """
    schema = tflite_schema.schema()
    buf = bytearray(model)
    if len(buf) < 8 or bytes(buf[4:8]) != b"TFL3":
        raise ValueError("not a TFLite flatbuffer (missing the 'TFL3' identifier)")
    root = schema.Model.GetRootAs(buf, 0)
    types_by_value = {value: name.lower() for value, name in tflite_schema.enum_names()[1].items()}
    for i in range(root.SignatureDefsLength()):
        signature = root.SignatureDefs(i)
        if signature.SignatureKey().decode() == VIEW_SIGNATURE:
            break
    else:
        return None
    graph = root.Subgraphs(signature.SubgraphIndex())

    def describe(tensor_map) -> dict:
        tensor = graph.Tensors(tensor_map.TensorIndex())
        dtype = types_by_value.get(tensor.Type(), f"type{tensor.Type()}")
        quant = tensor.Quantization()
        quantized = quant is not None and quant.ScaleLength() > 0 and not dtype.startswith("float")
        return {
            "name": tensor_map.Name().decode(),
            "shape": [int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else [],
            "dtype": dtype,
            "scale": float(quant.Scale(0)) if quantized else None,
            "zero_point": int(quant.ZeroPoint(0)) if quantized else None,
        }

    inputs = [describe(signature.Inputs(j)) for j in range(signature.InputsLength())]
    outputs = [describe(signature.Outputs(j)) for j in range(signature.OutputsLength())]
    for entry in outputs:
        match = re.fullmatch(r"attention_(\d+)", entry["name"])
        if match is None:
            raise ValueError(
                f"unexpected output {entry['name']!r} in the {VIEW_SIGNATURE!r} signature"
            )
        entry["layer"] = int(match.group(1))
    outputs.sort(key=lambda entry: entry["layer"])
    return {
        "signature": VIEW_SIGNATURE,
        "subgraph": int(signature.SubgraphIndex()),
        "input": inputs[0] if len(inputs) == 1 else inputs,
        "outputs": [
            {
                "name": e["name"],
                "layer": e["layer"],
                **{k: e[k] for k in ("shape", "dtype", "scale", "zero_point")},
            }
            for e in outputs
        ],
    }


def without_view_signature(model: bytes) -> bytes:
    """`model` with only subgraph 0 and its signature (for TFLite Micro).

    TFLite Micro's Python interpreter (tflite-micro 0.dev2026) crashes in
    `MicroAllocator::CommitStaticMemoryPlan` on any model with a second
    subgraph, so a microcontroller build drops the attention signature.
    Subgraph 0 is kept as it is; buffers only the view used stay, unused.
    """
    unpacked = tflite_schema.unpack(model)
    unpacked.subgraphs = unpacked.subgraphs[:1]
    unpacked.signatureDefs = [s for s in unpacked.signatureDefs or [] if s.subgraphIndex == 0]
    return tflite_schema.pack_aligned(unpacked, len(model))
