"""TensorFlow Lite Micro as a tf.lite-style runtime.

`tflite_micro.python.tflite_micro.runtime.Interpreter` (pip `tflite-micro`)
runs a model on the microcontroller runtime's reference kernels, compiled for
this machine. Its interface differs from `tf.lite.Interpreter`: inputs and
outputs go by position (`set_input(a, 0)`, `get_output(0)`), tensor details
have no index or name, and the tensor arena is a fixed size given up front.
`Interpreter` here wraps it so that code written for LiteRT runs it unchanged
(`model_content=`, `get_input_details()`, `set_tensor`, `invoke`,
`get_tensor`); indices and names are read from the flatbuffer. What a part
is sized by (flash, the smallest arena) is micro_footprint.py's.

Standard library, numpy and tflite_micro only.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .runtime import captured_stderr

# Ample for the bundle's models (about 30 KB); micro_footprint.smallest_arena
# finds the real need.
DEFAULT_ARENA_BYTES = 4 * 1024 * 1024


def _runtime() -> Any:
    from tflite_micro.python.tflite_micro import runtime

    return runtime


def flatbuffer_schema() -> Any:
    """tflite_micro's generated flatbuffer schema (`Model.GetRootAsModel`)."""
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated

    return schema_py_generated


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_error(log: str, arena_size: int) -> str:
    """TFLM's reason, led by what it means: arena too small, or not supported.

    "not supported" lets the edge demo's probe skip the mode rather than fail
    (a kernel rejecting a type, e.g. float16 weights, or a missing op).
    """
    detail = _one_line(log)
    if "Failed to allocate" in log or "missing:" in log or "Too many buffers" in log:
        return f"TFLM needs a tensor arena larger than {arena_size} bytes ({detail})"
    if "failed to prepare" in log or "Didn't find op" in log or "not supported" in log:
        return f"not supported by TFLM's kernels ({detail})"
    return f"TFLM cannot load the model ({detail})"


def _tensor_table(content: bytes) -> tuple[list[int], list[int], dict[int, str]]:
    """(input tensor indices, output tensor indices, index -> name) of subgraph 0."""
    schema = flatbuffer_schema()
    model = schema.Model.GetRootAsModel(content, 0)
    if model.SubgraphsLength() < 1:
        raise ValueError("the model has no subgraph")
    graph = model.Subgraphs(0)
    inputs = [int(graph.Inputs(i)) for i in range(graph.InputsLength())]
    outputs = [int(graph.Outputs(i)) for i in range(graph.OutputsLength())]
    names = {}
    for index in inputs + outputs:
        name = graph.Tensors(index).Name()
        names[index] = name.decode("utf-8", "replace") if name else ""
    return inputs, outputs, names


def _detail(raw: dict, index: int, name: str) -> dict:
    """A TFLM tensor detail in LiteRT's layout (index, name, quantization, ...)."""
    params = raw.get("quantization_parameters", {})
    scales = np.asarray(params.get("scales", []), np.float32)
    zero_points = np.asarray(params.get("zero_points", []), np.int32)
    shape = np.asarray(raw["shape"], np.int32)
    return {
        "name": name,
        "index": index,
        "shape": shape,
        "shape_signature": shape.copy(),
        "dtype": np.dtype(raw["dtype"]).type,
        # (scale, zero_point) when per-tensor, (0.0, 0) when unquantized, as LiteRT says
        "quantization": (float(scales[0]), int(zero_points[0])) if scales.size else (0.0, 0),
        "quantization_parameters": {
            "scales": scales,
            "zero_points": zero_points,
            "quantized_dimension": int(params.get("quantized_dimension", 0)),
        },
        "sparsity_parameters": {},
    }


class Interpreter:
    """TFLM's interpreter behind the tf.lite Interpreter interface (batch as exported).

    Args:
        model_path: a .tflite file, or
        model_content: the model's bytes.
        num_threads: accepted for compatibility; TFLM runs on one thread.
        arena_size: the tensor arena in bytes (default DEFAULT_ARENA_BYTES).

    Raises:
        ValueError: the model does not allocate in the arena (TFLM's message,
            e.g. "Failed to allocate ... missing: N", or an unsupported op or type).
    """

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        model_content: bytes | None = None,
        num_threads: int | None = None,
        arena_size: int | None = None,
        **_ignored: Any,
    ):
        if (model_path is None) == (model_content is None):
            raise ValueError("pass exactly one of `model_path` and `model_content`")
        if model_content is None:
            with open(model_path, "rb") as f:
                model_content = f.read()
        self.arena_size = int(arena_size or DEFAULT_ARENA_BYTES)
        content = bytes(model_content)
        self._inputs, self._outputs, names = _tensor_table(content)
        with captured_stderr() as log:
            try:
                interpreter = _runtime().Interpreter.from_bytes(content, arena_size=self.arena_size)
            except Exception as exc:
                error: Exception | None = exc
            else:
                error = None
        if error is not None:
            raise ValueError(
                _load_error("".join(log) + " " + str(error), self.arena_size)
            ) from None
        self._interpreter = interpreter
        self._input_details = [
            _detail(interpreter.get_input_details(i), t, names[t])
            for i, t in enumerate(self._inputs)
        ]
        self._output_details = [
            _detail(interpreter.get_output_details(i), t, names[t])
            for i, t in enumerate(self._outputs)
        ]
        self._last_input: dict[int, np.ndarray] = {}

    def allocate_tensors(self) -> None:
        """No-op: TFLM plans the arena when the interpreter is made."""

    def get_input_details(self) -> list[dict]:
        return [dict(d) for d in self._input_details]

    def get_output_details(self) -> list[dict]:
        return [dict(d) for d in self._output_details]

    def set_tensor(self, tensor_index: int, value: np.ndarray) -> None:
        """Copy `value` into the input tensor `tensor_index` (dtype and shape must match)."""
        if tensor_index not in self._inputs:
            raise ValueError(
                f"tensor {tensor_index} is not an input (TFLM sets inputs only: {self._inputs})"
            )
        position = self._inputs.index(tensor_index)
        detail = self._input_details[position]
        value = np.asarray(value)
        if value.dtype.type is not detail["dtype"]:
            raise ValueError(
                f"Cannot set tensor: Got value of type {value.dtype.name.upper()} but expected "
                f"type {np.dtype(detail['dtype']).name.upper()} for input {tensor_index}"
            )
        if tuple(value.shape) != tuple(detail["shape"]):
            raise ValueError(
                f"Cannot set tensor: Dimension mismatch. Got {list(value.shape)} but expected "
                f"{detail['shape'].tolist()} for input {tensor_index}"
            )
        value = np.ascontiguousarray(value)
        self._interpreter.set_input(value, position)
        self._last_input[tensor_index] = value.copy()

    def invoke(self) -> None:
        """Run the model; a kernel error raises RuntimeError with TFLM's message."""
        with captured_stderr() as log:
            try:
                self._interpreter.invoke()
            except Exception as exc:
                error: Exception | None = exc
            else:
                error = None
        if error is not None:
            raise RuntimeError(f"TFLM invoke failed: {_one_line(''.join(log) + ' ' + str(error))}")

    def get_tensor(self, tensor_index: int) -> np.ndarray:
        """A copy of an output tensor (or of the input last set): TFLM keeps no others."""
        if tensor_index in self._outputs:
            return np.array(self._interpreter.get_output(self._outputs.index(tensor_index)))
        if tensor_index in self._last_input:
            return self._last_input[tensor_index].copy()
        raise ValueError(
            f"tensor {tensor_index} is not an output: TFLM keeps only inputs and outputs "
            f"(outputs: {self._outputs})"
        )

    def allocation_report(self) -> str:
        """`print_allocations()`'s text (call after `invoke`)."""
        with captured_stderr() as log:
            self._interpreter.print_allocations()
        return "".join(log)
