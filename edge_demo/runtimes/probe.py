"""Load each model once in a child process before this process touches it.

A runtime that does not verify its flatbuffer can crash the process on a
malformed model (tflite-runtime 2.14 segfaults on a truncated one), so
`probe_model` loads, allocates and invokes it in a child first: a crash there
becomes a one-line message here, and a runtime that lacks an op or kernel
becomes a skipped mode instead of a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import numpy as np

from bundle_contract.entries import ModelEntry
from bundle_contract.errors import UsageError
from bundle_contract.tensors import TensorSpec

from .model import manifest_mismatch
from .runtime import Runtime

PROBE_TIMEOUT_S = 300
_TOP_PACKAGE = __package__.split(".")[0]  # edge_demo
# A runtime that cannot run a valid model says one of these (an op or an op
# version it does not have, a type a kernel does not support).
_UNSUPPORTED = re.compile(
    r"Didn't find op for builtin opcode|unsupported|not supported|only supports|unresolved custom op"
    r"|builtin_code out of range|Registration failed"
    r"|\bonly [\w, ]+ types? (?:are|is) supported",  # TFLM: "Only float32 and int8 types are ..."
    re.IGNORECASE,
)
# The directory holding edge_demo/: a runtime module inside
# the package (".micro") must import in the child too, from a copied folder as
# from an install. This file is edge_demo/runtimes/probe.py.
_PACKAGE_PARENT = str(pathlib.Path(__file__).resolve().parents[2])

# Runs in a fresh interpreter (`python -c`): standard library, numpy and the
# runtime only, so it works from a copied folder. Model bytes arrive on stdin.
_PROBE_SCRIPT = r"""
import gc, importlib, json, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = int(sys.argv[2])
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
except Exception:
    pass
if sys.argv[4]:
    sys.path.insert(0, sys.argv[4])
options = json.loads(sys.argv[5])
# [[model bytes, sample bytes, sample dtype], ...], in the order they arrive on stdin
layout = json.loads(sys.argv[3])
data = memoryview(sys.stdin.buffer.read())


def say(*parts):
    print(" ".join(" ".join(str(p).split()) for p in parts), flush=True)


def probe(module, content, sample, dtype):
    def fill(detail):
        value = np.zeros(detail["shape"], detail["dtype"])
        if sample and value.nbytes == len(sample) and value.dtype.name == dtype:
            value = np.frombuffer(sample, value.dtype).reshape(value.shape)
        return value

    kwargs = {}
    if options.get("debug"):  # the quantization debugger's interpreter (LiteRT)
        kwargs = {
            "experimental_preserve_all_tensors": True,
            "experimental_op_resolver_type": module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        }
    try:
        interpreter = module.Interpreter(model_content=content, num_threads=1, **kwargs)
        interpreter.allocate_tensors()
        # A dynamic sequence axis ([1, -1], an embedding model): the sample's length.
        details = interpreter.get_input_details()
        signature = list(details[0].get("shape_signature", [])) if len(details) == 1 else []
        if sample and len(signature) == 2 and signature[1] == -1:
            width = len(sample) // np.dtype(details[0]["dtype"]).itemsize
            interpreter.resize_tensor_input(details[0]["index"], [1, max(1, width)])
            interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():
            interpreter.set_tensor(detail["index"], fill(detail))
        interpreter.invoke()
        for detail in interpreter.get_output_details():
            interpreter.get_tensor(detail["index"])
    except BaseException as exc:
        say("PROBE-ERROR", f"{type(exc).__name__}: {exc}")
        return False
    tensors = []
    for detail in interpreter.get_input_details() + interpreter.get_output_details():
        scale, zero_point = detail["quantization"]
        tensors.append({
            "index": int(detail["index"]), "name": str(detail["name"]),
            "shape": [int(d) for d in detail["shape"]], "dtype": np.dtype(detail["dtype"]).name,
            "quantization": [float(scale), int(zero_point)],
            "input": len(tensors) < len(interpreter.get_input_details()),
        })
    say("PROBE-OK", json.dumps(tensors))
    # Every signature, each in its own interpreter as the app makes them: a
    # signature whose subgraph index or tensor indices are corrupt crashes here,
    # in the child, never in the app.
    listed = getattr(interpreter, "get_signature_list", None)
    names = []
    try:
        names = sorted(listed()) if listed is not None else []
    except BaseException as exc:
        say("PROBE-SIGNATURES-ERROR", f"{type(exc).__name__}: {exc}")
    for name in names:
        try:
            fresh = module.Interpreter(model_content=content, num_threads=1, **kwargs)
            fresh.allocate_tensors()
            runner = fresh.get_signature_runner(name)
            inputs = runner.get_input_details()
            outputs = runner.get_output_details()
            found = runner(**{key: fill(detail) for key, detail in inputs.items()})
            for key in outputs:
                found[key]
            say("PROBE-SIGNATURE-OK", json.dumps(name))
        except BaseException as exc:
            say("PROBE-SIGNATURE-ERROR", json.dumps(name), f"{type(exc).__name__}: {exc}")
    say("PROBE-DONE")
    return True


status = 0
try:
    import numpy as np
    module = importlib.import_module(sys.argv[1])
except BaseException as exc:
    say("PROBE-MODEL", 0)
    say("PROBE-ERROR", f"{type(exc).__name__}: {exc}")
    sys.exit(3)
at = 0
for number, (size, sample_size, dtype) in enumerate(layout):
    say("PROBE-MODEL", number)
    content = bytes(data[at : at + size])
    sample = bytes(data[at + size : at + size + sample_size])
    at += size + sample_size
    if not probe(module, content, sample, dtype):
        status = 3
    del content
    gc.collect()  # one model's interpreters gone before the next loads
sys.exit(status)
"""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """A child process's first load of a model: fine, or cannot run in this runtime."""

    ok: bool
    reason: str = ""  # why the runtime cannot run it (the mode is then skipped)
    inputs: tuple[TensorSpec, ...] = ()  # as the child's interpreter saw them
    outputs: tuple[TensorSpec, ...] = ()
    # (A signature the runtime refuses with an exception, not a crash, is the
    # run's to report: EdgeModel.run_signature raises InferenceError.)

    def check_manifest(self, entry: ModelEntry, where: str | os.PathLike) -> None:
        """Raise UsageError if the probed tensors differ from the manifest entry."""
        manifest_mismatch(where, entry, self.inputs, self.outputs)


def _signal_name(returncode: int) -> str:
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _run_child(
    runtime: Runtime, items: list[tuple[bytes, np.ndarray | None]], debug: bool
) -> tuple[int | None, list[list[str]], str]:
    """One child probes `items` ((content, sample) each) in order:
    (its exit code, None if it hung; each model's lines; its stderr)."""
    layout, parts = [], []
    for content, sample in items:
        sample_bytes = b"" if sample is None else np.ascontiguousarray(sample).tobytes()
        layout.append(
            [len(content), len(sample_bytes), "" if sample is None else sample.dtype.name]
        )
        parts += [content, sample_bytes]
    payload = b"".join(parts)
    # the models' bytes arrive whole; each model's interpreters may take 16 times its size
    memory_limit = 2 * 1024**3 + 16 * max(size for size, _, _ in layout) + len(payload)
    inside_package = runtime.module.startswith(f"{_TOP_PACKAGE}.")
    argv = [sys.executable, "-c", _PROBE_SCRIPT, runtime.module, str(memory_limit)]
    argv += [json.dumps(layout), _PACKAGE_PARENT if inside_package else ""]
    argv += [json.dumps({"debug": debug})]
    try:
        proc = subprocess.run(
            argv,
            input=payload,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        return None, [], ""
    models: list[list[str]] = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith("PROBE-MODEL "):
            models.append([])
        elif models:
            models[-1].append(line)
    return returncode, models, stderr.decode("utf-8", "replace")


def probe_model(
    runtime: Runtime,
    content: bytes,
    where: str | os.PathLike,
    sample: np.ndarray | None = None,
    debug: bool = False,
) -> ProbeResult:
    """Load, allocate and invoke a model once in a child process.

    `sample` is one input as the model takes it (batch 1, already quantized);
    zeros are used without it, which some models cannot take (an all-padding
    sentence makes a mean over no tokens).

    Then every signature the model lists (`get_signature_list`) is loaded
    and invoked, each in a fresh interpreter, with every output read: the
    app's first use of a signature (the attention `view`) never meets a
    corrupt subgraph index first. `debug`: the quantization debugger's
    interpreter options (LiteRT builtin kernels, all tensors kept).

    Returns ProbeResult(ok=False, reason) if the runtime says it lacks an op or
    kernel (the caller skips the mode, unless the manifest says this runtime
    ran it). Raises UsageError naming `where` if the child crashes (a signal,
    also while running a signature), runs out of memory, hangs, or rejects the
    model otherwise.
    """
    if not sys.executable:
        return ProbeResult(True)  # embedded Python: no way to start a child
    returncode, models, stderr = _run_child(runtime, [(content, sample)], debug)
    if returncode is None:
        raise UsageError(
            f"{runtime.name} did not finish loading it in {PROBE_TIMEOUT_S} s", where
        ) from None
    return _judge(runtime, returncode, models[0] if models else [], stderr, where)


def probe_models(
    runtime: Runtime,
    items: list[tuple[bytes, str | os.PathLike, np.ndarray | None]],
    debug: bool = False,
) -> Iterator[ProbeResult]:
    """`probe_model` of each (content, where, sample), in order, yielded one by one.

    One child process probes them all (starting Python, numpy and the runtime
    takes seconds on a small or emulated CPU, the probe itself milliseconds).
    Its results are taken only if every model loaded and ran, or was refused
    cleanly for an op or kernel the runtime lacks, and the child ended by
    itself within PROBE_TIMEOUT_S (for all of them: a sound bundle's take
    seconds). Otherwise a model may have upset the child for the ones after
    it: each model is then probed in a child of its own, as `probe_model`
    does, one at a time as the caller asks, so what is raised and when is
    exactly what calling `probe_model` in turn gives (a model that hangs
    costs one timeout more).
    """
    if len(items) > 1 and sys.executable:
        results = _shared_child(runtime, items, debug)
        if results is not None:
            yield from results
            return
    for content, where, sample in items:
        yield probe_model(runtime, content, where, sample, debug)


def _shared_child(runtime: Runtime, items, debug: bool) -> list[ProbeResult] | None:
    """Every item probed in one child: their results, or None unless the child
    ended by itself and each model ran or was refused for a missing kernel."""
    returncode, models, stderr = _run_child(
        runtime, [(content, sample) for content, _, sample in items], debug
    )
    if returncode not in (0, 3) or len(models) != len(items):
        return None
    results = []
    for lines, (_, where, _) in zip(models, items):
        code = 0 if "PROBE-DONE" in lines else 3  # the child's code had it probed alone
        result = _judge(runtime, code, lines, stderr, where, raise_errors=False)
        if result is None:
            return None
        results.append(result)
    return results


def _judge(
    runtime: Runtime,
    returncode: int,
    lines: list[str],
    stderr: str,
    where: str | os.PathLike,
    raise_errors: bool = True,
) -> ProbeResult | None:
    """What one model's lines from the child say; with raise_errors=False,
    None where a UsageError would be raised."""
    ok = [ln for ln in lines if ln.startswith("PROBE-OK ")]
    done = "PROBE-DONE" in lines
    problem = None
    if returncode < 0 or (ok and not done):
        running = [ln for ln in lines if ln.startswith("PROBE-SIGNATURE")]
        stage = "running its signatures" if ok else "loading it"
        problem = (
            f"{runtime.name} {runtime.version} crashed {stage} ({_signal_name(returncode)}"
            f"{', after ' + str(len(running)) + ' signature(s)' if ok else ''}): "
            "not a usable TFLite model"
        )
    elif returncode == 0 and ok:
        try:
            tensors = [
                (t["input"], TensorSpec.from_detail({**t, "dtype": np.dtype(t["dtype"])}))
                for t in json.loads(ok[-1][len("PROBE-OK ") :])
            ]
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"{runtime.name} probe said something unexpected ({exc})"
        else:
            return ProbeResult(
                True,
                inputs=tuple(info for is_input, info in tensors if is_input),
                outputs=tuple(info for is_input, info in tensors if not is_input),
            )
    else:
        errors = [ln for ln in lines if ln.startswith("PROBE-ERROR ")]
        detail = (
            errors[-1][len("PROBE-ERROR ") :]
            if errors
            else (stderr.strip().splitlines() or ["?"])[-1]
        )
        detail = detail if len(detail) <= 300 else detail[:297] + "..."
        if "MemoryError" in detail or "bad_alloc" in detail:
            problem = f"{runtime.name} ran out of memory loading it ({detail}): malformed model?"
        elif _UNSUPPORTED.search(detail):
            return ProbeResult(False, f"{runtime.name} {runtime.version} cannot run it ({detail})")
        else:
            problem = f"{runtime.name} {runtime.version} cannot load it ({detail})"
    if not raise_errors:
        return None
    raise UsageError(problem, where)
