"""TensorFlow Lite Micro as a tf.lite-style runtime, and what a part is sized by.

`tflite_micro.python.tflite_micro.runtime.Interpreter` (pip `tflite-micro`)
runs a model on the microcontroller runtime's reference kernels, compiled for
this machine. Its interface differs from `tf.lite.Interpreter`: inputs and
outputs go by position (`set_input(a, 0)`, `get_output(0)`), tensor details
have no index or name, and the tensor arena is a fixed size given up front.
`Interpreter` here wraps it so that code written for LiteRT runs it unchanged
(`model_content=`, `get_input_details()`, `set_tensor`, `invoke`,
`get_tensor`); indices and names are read from the flatbuffer.

`smallest_arena` finds, by bisection, the smallest tensor arena the model
allocates and invokes in, each size tried in a child process (TFLM crashes on
some too-small arenas instead of saying so); `print_allocations()`'s total is smaller than that
(it leaves out the temporary allocations made while preparing kernels), so it
is only reported beside it. `footprint` is what an embedded engineer sizes a
part by: flash (the model file) and RAM (the arena). docs/field_notes.md
(TensorFlow Lite Micro) has the measured numbers.

Standard library, numpy and tflite_micro only.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from typing import Any

import numpy as np

from .runtime import captured_stderr

# Ample for the bundle's models (about 30 KB); smallest_arena finds the real need.
DEFAULT_ARENA_BYTES = 4 * 1024 * 1024
MAX_ARENA_BYTES = 256 * 1024 * 1024  # smallest_arena gives up above this
TRIAL_TIMEOUT_S = 120
_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")


def _runtime() -> Any:
    from tflite_micro.python.tflite_micro import runtime

    return runtime


def _schema() -> Any:
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
    schema = _schema()
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


# One trial of an arena size, in a child process: TFLM can crash (SIGSEGV) on
# some too-small arenas instead of reporting them, e.g. the int8 digits model at
# 19,000 and 20,000 bytes but not at 19,500. Model bytes, then an .npz of the
# inputs (one per model input, in order; none = zeros), arrive on stdin.
_TRIAL = r"""
import io, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except Exception:
    pass
import numpy as np
from tflite_micro.python.tflite_micro import runtime
data = sys.stdin.buffer.read()
size = int(sys.argv[2])
content, rest = data[:size], data[size:]
try:
    interpreter = runtime.Interpreter.from_bytes(content, arena_size=int(sys.argv[1]))
    i = 0
    while True:
        try:
            detail = interpreter.get_input_details(i)
        except (IndexError, ValueError):
            break
        value = np.zeros(detail["shape"], detail["dtype"])
        if rest:
            value = np.load(io.BytesIO(rest))[f"x{i}"]
        interpreter.set_input(value, i)
        i += 1
    interpreter.invoke()
except Exception:
    sys.exit(3)
"""


def runs_in(content: bytes, arena_size: int, sample: list[np.ndarray] | None = None) -> bool:
    """True if the model allocates and invokes once in an arena of `arena_size` bytes.

    Tried in a child process (a crash there is a "no"). `sample`: one value
    per input, batch as exported; zeros by default.
    """
    payload = b""
    if sample is not None:
        buffer = io.BytesIO()
        np.savez(buffer, **{f"x{i}": np.ascontiguousarray(v) for i, v in enumerate(sample)})
        payload = buffer.getvalue()
    proc = subprocess.run(
        [sys.executable, "-c", _TRIAL, str(int(arena_size)), str(len(content))],
        input=bytes(content) + payload,
        capture_output=True,
        timeout=TRIAL_TIMEOUT_S,
        check=False,
    )
    return proc.returncode == 0


def smallest_arena(model_bytes: bytes, sample: list[np.ndarray] | None = None) -> int:
    """The smallest tensor arena (bytes) the model allocates and invokes in.

    Doubles from 4 KB until the model runs, then bisects to the byte: the
    answer runs and one byte less does not. `sample`: one value per input
    (batch as exported); zeros by default. Raises ValueError if even
    MAX_ARENA_BYTES is too small, with TFLM's reason.
    """
    hi = 4096
    while not runs_in(model_bytes, hi, sample):
        if hi >= MAX_ARENA_BYTES:
            Interpreter(model_content=model_bytes, arena_size=MAX_ARENA_BYTES)  # raises: why
            raise ValueError(f"the model does not run in TFLM with a {hi}-byte arena")
        hi *= 2
    lo = hi // 2 if hi > 4096 else 0  # lo fails (or is 0), hi runs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if runs_in(model_bytes, mid, sample):
            hi = mid
        else:
            lo = mid
    return hi


def reported_arena(model_bytes: bytes, sample: list[np.ndarray] | None = None) -> int | None:
    """`print_allocations()`'s "Arena allocation total" after one invoke (None if absent)."""
    interpreter = Interpreter(model_content=model_bytes)
    details = interpreter.get_input_details()
    if sample is None:
        sample = [np.zeros(d["shape"], d["dtype"]) for d in details]
    for detail, value in zip(details, sample, strict=True):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    found = _TOTAL.search(interpreter.allocation_report())
    return int(found.group(1)) if found else None


def weight_bytes(model_bytes: bytes) -> int:
    """Bytes of constant data (weights, biases, quantization tables) in the flatbuffer."""
    model = _schema().Model.GetRootAsModel(model_bytes, 0)
    total = 0
    for i in range(model.BuffersLength()):
        buffer = model.Buffers(i)
        total += int(buffer.Size()) if buffer.Offset() else int(buffer.DataLength())
    return total


def footprint(model_bytes: bytes, sample: list[np.ndarray] | None = None) -> dict[str, int | None]:
    """What a part is sized by: flash (the model file, kept in place) and RAM (the arena).

    `flash_bytes` is the .tflite file as linked into flash (TFLM reads it in
    place); `weight_bytes` the constant data in it, the rest being graph
    structure and strings; `arena_bytes` from `smallest_arena`;
    `reported_arena_bytes` what print_allocations says it used.
    """
    return {
        "flash_bytes": len(model_bytes),
        "weight_bytes": weight_bytes(model_bytes),
        "arena_bytes": smallest_arena(model_bytes, sample),
        "reported_arena_bytes": reported_arena(model_bytes, sample),
    }
