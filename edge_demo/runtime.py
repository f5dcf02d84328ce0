"""The TFLite runtime: choice, crash-safe probing, and the inference wrapper.

LiteRT (`ai_edge_litert.interpreter`) first, `tflite_runtime.interpreter` as
fallback, imported only by `select_runtime`. A runtime that does not verify
its flatbuffer can crash the process on a malformed model (tflite-runtime
2.14 segfaults on a truncated one), so `probe_model` loads each model once in
a child process first: a crash there becomes a one-line message here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .bundle import ModelSpec, TensorSpec
from .errors import BadInput

# --runtime choice -> (name used in manifest `runtimes`, interpreter module, package module)
RUNTIMES = {
    "litert": ("ai-edge-litert", "ai_edge_litert.interpreter", "ai_edge_litert"),
    "tflite-runtime": ("tflite-runtime", "tflite_runtime.interpreter", "tflite_runtime"),
}
PROBE_TIMEOUT_S = 300
# A runtime that cannot run a valid model says one of these (an op or an op
# version it does not have, a type a kernel does not support).
_UNSUPPORTED = re.compile(
    r"Didn't find op for builtin opcode|unsupported|not supported|only supports|unresolved custom op"
    r"|builtin_code out of range|Registration failed",
    re.IGNORECASE,
)


# --- quantization ---------------------------------------------------------------


def quantize(x: np.ndarray, scale: float, zero_point: int, dtype: np.dtype | str) -> np.ndarray:
    """`q = round(x / scale) + zero_point`, clipped to `dtype`.

    Rounds half away from zero on the float32 quotient, as TFLite's QUANTIZE
    kernel does (numpy's `round` rounds half to even).
    """
    info = np.iinfo(np.dtype(dtype))
    scaled = (np.asarray(x, np.float32) / np.float32(scale)).astype(np.float64)
    rounded = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)
    return np.clip(rounded + zero_point, info.min, info.max).astype(dtype)


def to_input(
    x: np.ndarray, dtype: np.dtype | str, scale: float | None, zero_point: int | None
) -> np.ndarray:
    """Samples as an input tensor of `dtype` takes them: quantized if it has a scale."""
    dtype = np.dtype(dtype)
    if scale is not None and zero_point is not None:
        return quantize(x, scale, zero_point, dtype)
    if dtype.kind in "iu" and np.asarray(x).dtype.kind == "f":
        raise ValueError(
            f"an unquantized {dtype.name} input takes ids, not {np.asarray(x).dtype.name}"
        )
    return np.ascontiguousarray(x, dtype=dtype)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """`(q - zero_point) * scale` in float32."""
    return (np.asarray(q).astype(np.float32) - np.float32(zero_point)) * np.float32(scale)


# --- runtime choice -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Runtime:
    """An imported TFLite runtime."""

    name: str  # "ai-edge-litert" | "tflite-runtime", as in the manifest's `runtimes`
    version: str
    module: str  # the interpreter module, e.g. "ai_edge_litert.interpreter"
    interpreter_cls: Any = dataclasses.field(repr=False, compare=False)

    def info(self) -> dict:
        """What the report and JSON say about the runtime and its environment."""
        import platform

        return {
            "name": self.name,
            "version": self.version,
            "module": self.module,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
        }


def _package_version(package: str, module: Any) -> str:
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib import metadata

        return metadata.version(package)
    except Exception:  # metadata missing in a copied install: not worth failing for
        return "unknown"


def _import_runtime(choice: str) -> Runtime:
    name, module_name, package_name = RUNTIMES[choice]
    if choice == "tflite-runtime" and int(np.__version__.split(".")[0]) >= 2:
        # Its wheels were built against numpy 1.x: Interpreter() fails with numpy 2.
        raise BadInput(
            name,
            f"tflite-runtime 2.14 needs numpy<2 but numpy {np.__version__} is installed: "
            "pip install -r edge_demo/requirements-tflite-runtime.txt, or use ai-edge-litert",
        )
    try:
        module = importlib.import_module(module_name)
        package = importlib.import_module(package_name)
    except Exception as exc:  # ImportError, or a broken binary wheel
        raise BadInput(name, f"cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    return Runtime(name, _package_version(name, package), module_name, module.Interpreter)


def select_runtime(choice: str = "auto") -> Runtime:
    """Import the runtime: `litert`, `tflite-runtime`, or `auto` (LiteRT first)."""
    if choice in RUNTIMES:
        return _import_runtime(choice)
    if choice != "auto":
        raise BadInput("--runtime", f"unknown runtime {choice!r} (litert, tflite-runtime, auto)")
    problems = []
    for candidate in RUNTIMES:
        try:
            return _import_runtime(candidate)
        except BadInput as exc:
            problems.append(exc.problem)
    raise BadInput(
        "runtime",
        "no TFLite runtime found: pip install -r edge_demo/requirements.txt "
        f"(ai-edge-litert), or tflite-runtime with numpy<2 [{'; '.join(problems)}]",
    )


# --- the inference wrapper ----------------------------------------------------


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Capture what native code writes to fd 2 (e.g. "INFO: Created ... XNNPACK").

    Yields a list that holds the captured text once the block ends.
    """
    captured: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield captured
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.append(tmp.read().decode("utf-8", "replace"))


class InferenceError(Exception):
    """The runtime failed while running a model it had loaded (a model problem)."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """An interpreter tensor: index, shape, dtype and its own quantization."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    scale: float | None
    zero_point: int | None

    @classmethod
    def from_detail(cls, detail: dict) -> TensorInfo:
        scale, zero_point = detail["quantization"]
        quantized = bool(scale) and np.dtype(detail["dtype"]).kind in "iu"
        return cls(
            int(detail["index"]),
            str(detail.get("name", "")),
            tuple(int(d) for d in detail["shape"]),
            np.dtype(detail["dtype"]),
            float(scale) if quantized else None,
            int(zero_point) if quantized else None,
        )


def _compare(where: str | os.PathLike, role: str, actual: TensorInfo, expected: TensorSpec) -> None:
    """Raise BadInput if the interpreter's tensor differs from the manifest's."""
    problems = []
    if actual.shape != expected.shape:
        problems.append(f"shape {list(actual.shape)} vs {list(expected.shape)}")
    if actual.dtype.name != expected.dtype:
        problems.append(f"dtype {actual.dtype.name} vs {expected.dtype}")
    if (actual.scale is None) != (expected.scale is None):
        problems.append(f"scale {actual.scale} vs {expected.scale}")
    elif actual.scale is not None and expected.scale is not None:
        if abs(actual.scale - expected.scale) > 1e-6 * abs(expected.scale):
            problems.append(f"scale {actual.scale:.9g} vs {expected.scale:.9g}")
        if actual.zero_point != expected.zero_point:
            problems.append(f"zero_point {actual.zero_point} vs {expected.zero_point}")
    if problems:
        raise BadInput(
            where,
            f"{role} tensor differs from manifest.json: {'; '.join(problems)} (model vs manifest)",
        )


class EdgeModel:
    """One TFLite model in a runtime, at batch 1, with its quantization handled.

    Inputs are quantized and outputs dequantized with the interpreter's own
    `(scale, zero_point)`; `check_manifest` cross-checks them with the bundle.

    Args:
        runtime: from `select_runtime`.
        content: the model's bytes (already validated by `bundle.read_model`).
        threads: the interpreter's `num_threads`.
        where: the model file, for messages.
    """

    def __init__(self, runtime: Runtime, content: bytes, threads: int = 1, where: str = "model"):
        self.runtime = runtime
        self.where = where
        start = time.perf_counter()
        with _captured_stderr() as captured:
            try:
                interpreter = runtime.interpreter_cls(model_content=content, num_threads=threads)
                interpreter.allocate_tensors()
            except Exception as exc:
                error: Exception | None = exc
            else:
                error = None
        if error is not None:
            detail = " ".join(f"{error} {''.join(captured)}".split())[:300]
            raise BadInput(where, f"{runtime.name} cannot load it ({detail})")
        self.load_ms = (time.perf_counter() - start) * 1e3
        self._interpreter = interpreter
        inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
        if len(inputs) != 1 or len(outputs) != 1:
            raise BadInput(
                where,
                f"expected 1 input and 1 output tensor, found {len(inputs)} and {len(outputs)}",
            )
        self.input = TensorInfo.from_detail(inputs[0])
        self.output = TensorInfo.from_detail(outputs[0])

    def check_manifest(self, spec: ModelSpec) -> None:
        """Raise BadInput if the model's tensors differ from its manifest entry."""
        _compare(self.where, "input", self.input, spec.input)
        _compare(self.where, "output", self.output, spec.output)

    def prepare(self, x: np.ndarray) -> np.ndarray:
        """Samples `(N, ...)` as the input tensor takes them (quantized if it is)."""
        info = self.input
        try:
            return to_input(x, info.dtype, info.scale, info.zero_point)
        except ValueError as exc:
            raise BadInput(self.where, str(exc)) from None

    def finish(self, raw: np.ndarray) -> np.ndarray:
        """Raw outputs -> float32 probabilities (dequantized if quantized)."""
        info = self.output
        if info.scale is not None:
            return dequantize(raw, info.scale, info.zero_point)
        return raw.astype(np.float32)

    def run(self, prepared: np.ndarray, repeat: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Invoke once per sample, `repeat` passes; time set_tensor + invoke + get_tensor.

        Returns the first pass's raw outputs `(N, C)` and every latency in ns.
        Raises InferenceError if the runtime fails on a sample.
        """
        interpreter = self._interpreter
        set_tensor, invoke, get_tensor = (
            interpreter.set_tensor,
            interpreter.invoke,
            interpreter.get_tensor,
        )
        in_index, out_index = self.input.index, self.output.index
        n = prepared.shape[0]
        outputs = np.empty((n, *self.output.shape[1:]), self.output.dtype)
        latencies = np.empty(n * repeat, np.int64)
        clock = time.perf_counter_ns
        i = 0
        try:
            set_tensor(in_index, prepared[:1])  # warm-up: the first invoke plans memory
            invoke()
            for r in range(repeat):
                for i in range(n):
                    row = prepared[i : i + 1]
                    start = clock()
                    set_tensor(in_index, row)
                    invoke()
                    out = get_tensor(out_index)
                    latencies[r * n + i] = clock() - start
                    if r == 0:
                        outputs[i] = out[0]
        except (RuntimeError, ValueError) as exc:
            raise InferenceError(f"{self.runtime.name} failed on sample {i}: {exc}") from None
        return outputs, latencies

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Float32 probabilities `(N, C)` for samples `(N, ...)`, one at a time."""
        raw, _ = self.run(self.prepare(x))
        return self.finish(raw)

    def close(self) -> None:
        """Drop the interpreter (frees its arena before the next mode loads)."""
        self._interpreter = None


# --- probing in a child process -----------------------------------------------

# Runs in a fresh interpreter (`python -c`): standard library, numpy and the
# runtime only, so it works from a copied folder. Model bytes arrive on stdin.
_PROBE_SCRIPT = r"""
import importlib, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = int(sys.argv[2])
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
except Exception:
    pass
data = sys.stdin.buffer.read()
size = int(sys.argv[3])
content, sample = data[:size], data[size:]
try:
    import numpy as np
    interpreter = importlib.import_module(sys.argv[1]).Interpreter(
        model_content=content, num_threads=1
    )
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        value = np.zeros(detail["shape"], detail["dtype"])
        if sample and value.nbytes == len(sample) and value.dtype.name == sys.argv[4]:
            value = np.frombuffer(sample, value.dtype).reshape(value.shape)
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
except BaseException as exc:
    print("PROBE-ERROR " + " ".join(f"{type(exc).__name__}: {exc}".split()), flush=True)
    sys.exit(3)
import json
tensors = []
for detail in interpreter.get_input_details() + interpreter.get_output_details():
    scale, zero_point = detail["quantization"]
    tensors.append({
        "index": int(detail["index"]), "name": str(detail["name"]),
        "shape": [int(d) for d in detail["shape"]], "dtype": np.dtype(detail["dtype"]).name,
        "quantization": [float(scale), int(zero_point)],
        "input": len(tensors) < len(interpreter.get_input_details()),
    })
print("PROBE-OK " + json.dumps(tensors), flush=True)
"""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """A child process's first load of a model: fine, or cannot run in this runtime."""

    ok: bool
    reason: str = ""  # why the runtime cannot run it (the mode is then skipped)
    inputs: tuple[TensorInfo, ...] = ()  # as the child's interpreter saw them
    outputs: tuple[TensorInfo, ...] = ()

    def check_manifest(self, spec: ModelSpec, where: str | os.PathLike) -> None:
        """Raise BadInput if the probed tensors differ from the manifest entry."""
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            raise BadInput(
                where,
                f"expected 1 input and 1 output tensor, found {len(self.inputs)} and {len(self.outputs)}",
            )
        _compare(where, "input", self.inputs[0], spec.input)
        _compare(where, "output", self.outputs[0], spec.output)


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def probe_model(
    runtime: Runtime,
    content: bytes,
    where: str | os.PathLike,
    sample: np.ndarray | None = None,
) -> ProbeResult:
    """Load, allocate and invoke a model once in a child process.

    `sample` is one input as the model takes it (batch 1, already quantized);
    zeros are used without it, which some models cannot take (an all-padding
    sentence makes a mean over no tokens).

    Returns ProbeResult(ok=False, reason) if the runtime says it lacks an op or
    kernel (the caller skips the mode). Raises BadInput naming `where` if the
    child crashes, runs out of memory, hangs, or rejects the model otherwise.
    """
    if not sys.executable:
        return ProbeResult(True)  # embedded Python: no way to start a child
    memory_limit = 2 * 1024**3 + 16 * len(content)
    sample_bytes = b"" if sample is None else np.ascontiguousarray(sample).tobytes()
    dtype = "" if sample is None else sample.dtype.name
    argv = [sys.executable, "-c", _PROBE_SCRIPT, runtime.module, str(memory_limit)]
    try:
        proc = subprocess.run(
            [*argv, str(len(content)), dtype],
            input=content + sample_bytes,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BadInput(
            where, f"{runtime.name} did not finish loading it in {PROBE_TIMEOUT_S} s"
        ) from None
    stdout = proc.stdout.decode("utf-8", "replace")
    stderr = proc.stderr.decode("utf-8", "replace")
    ok = [ln for ln in stdout.splitlines() if ln.startswith("PROBE-OK ")]
    if proc.returncode == 0 and ok:
        try:
            tensors = [
                (t["input"], TensorInfo.from_detail({**t, "dtype": np.dtype(t["dtype"])}))
                for t in json.loads(ok[-1][len("PROBE-OK ") :])
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(
                where, f"{runtime.name} probe said something unexpected ({exc})"
            ) from None
        return ProbeResult(
            True,
            inputs=tuple(info for is_input, info in tensors if is_input),
            outputs=tuple(info for is_input, info in tensors if not is_input),
        )
    if proc.returncode < 0:
        raise BadInput(
            where,
            f"{runtime.name} {runtime.version} crashed loading it ({_signal_name(proc.returncode)}): "
            "not a usable TFLite model",
        )
    lines = [ln for ln in stdout.splitlines() if ln.startswith("PROBE-ERROR ")]
    detail = (
        lines[-1][len("PROBE-ERROR ") :] if lines else (stderr.strip().splitlines() or ["?"])[-1]
    )
    detail = detail if len(detail) <= 300 else detail[:297] + "..."
    if "MemoryError" in detail or "bad_alloc" in detail:
        raise BadInput(
            where, f"{runtime.name} ran out of memory loading it ({detail}): malformed model?"
        )
    if _UNSUPPORTED.search(detail):
        return ProbeResult(False, f"{runtime.name} {runtime.version} cannot run it ({detail})")
    raise BadInput(where, f"{runtime.name} {runtime.version} cannot load it ({detail})")
