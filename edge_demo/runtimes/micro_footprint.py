"""What a TensorFlow Lite Micro part is sized by: flash (the model file) and RAM (the arena).

`smallest_arena` finds, by bisection, the smallest tensor arena the model
allocates and invokes in, each size tried in a process of its own (TFLM
crashes on some too-small arenas instead of saying so): a child that has
imported TFLM once forks one per size (`_Trials`), about 5 ms a size where a
fresh interpreter took 150 (and every new one where fork is missing);
`print_allocations()`'s total is
smaller than that (it leaves out the temporary allocations made while
preparing kernels), so it is only reported beside it. `footprint` is what an
embedded engineer sizes a part by. docs/field_notes.md (TensorFlow Lite
Micro) has the measured numbers.

Standard library, numpy and tflite_micro only.
"""

from __future__ import annotations

import io
import os
import re
import select
import signal
import subprocess
import sys

import numpy as np

from .micro import Interpreter, flatbuffer_schema

MAX_ARENA_BYTES = 256 * 1024 * 1024  # smallest_arena gives up above this
TRIAL_TIMEOUT_S = 120
_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")


# Trials of arena sizes, in a child process: TFLM can crash (SIGSEGV) on some
# too-small arenas instead of reporting them, e.g. the int8 digits model at
# 19,000 and 20,000 bytes but not at 19,500. The model bytes, then an .npz of
# the inputs (one per model input, in order; none = zeros), arrive on stdin,
# each after its length (8 bytes). `python -c _TRIAL SIZE`: one size, the exit
# status says (0 ran, 3 did not). `python -c _TRIAL serve`: a size a line on
# stdin, each tried in a process forked for it, "1" (ran) or "0" a line back.
_TRIAL = r"""
import io, os, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except Exception:
    pass
import numpy as np
from tflite_micro.python.tflite_micro import runtime
stdin = sys.stdin.buffer
def chunk():
    return stdin.read(int.from_bytes(stdin.read(8), "little"))
content, rest = chunk(), chunk()
def trial(size):
    try:
        interpreter = runtime.Interpreter.from_bytes(content, arena_size=size)
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
    except BaseException:
        os._exit(3)
    os._exit(0)
if sys.argv[1] != "serve":
    trial(int(sys.argv[1]))
for line in stdin:
    pid = os.fork()
    if pid == 0:
        trial(int(line))
    _, status = os.waitpid(pid, 0)
    sys.stdout.write("1\n" if status == 0 else "0\n")
    sys.stdout.flush()
"""


def _stdin(content: bytes, sample: list[np.ndarray] | None) -> bytes:
    """The model and its inputs as _TRIAL reads them."""
    payload = b""
    if sample is not None:
        buffer = io.BytesIO()
        np.savez(buffer, **{f"x{i}": np.ascontiguousarray(v) for i, v in enumerate(sample)})
        payload = buffer.getvalue()
    return b"".join(len(part).to_bytes(8, "little") + part for part in (bytes(content), payload))


def runs_in(content: bytes, arena_size: int, sample: list[np.ndarray] | None = None) -> bool:
    """True if the model allocates and invokes once in an arena of `arena_size` bytes.

    Tried in a child process (a crash there is a "no"). `sample`: one value
    per input, batch as exported; zeros by default.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _TRIAL, str(int(arena_size))],
        input=_stdin(content, sample),
        capture_output=True,
        timeout=TRIAL_TIMEOUT_S,
        check=False,
    )
    return proc.returncode == 0


class _Trials:
    """`runs_in` for one model and many sizes: each size still runs in a process
    of its own, forked from one child that imported TFLM and read the model once.
    A context manager; where os.fork is missing, each size is `runs_in`."""

    def __init__(self, content: bytes, sample: list[np.ndarray] | None):
        self.content, self.sample, self.proc = bytes(content), sample, None
        if hasattr(os, "fork"):
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _TRIAL, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
                start_new_session=True,  # its group: a trial that hangs goes with it
            )
            self.proc.stdin.write(_stdin(self.content, sample))

    def __call__(self, arena_size: int) -> bool:
        if self.proc is None:
            return runs_in(self.content, arena_size, self.sample)
        self.proc.stdin.write(f"{int(arena_size)}\n".encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], TRIAL_TIMEOUT_S)
        answer = self.proc.stdout.readline() if ready else b""
        if answer not in (b"0\n", b"1\n"):  # it hung, or the child itself died
            why = f"none within {TRIAL_TIMEOUT_S} s" if not ready else "its process ended"
            raise RuntimeError(f"TFLM's trial of a {arena_size}-byte arena gave no answer ({why})")
        return answer == b"1\n"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                stream.close()


def smallest_arena(model_bytes: bytes, sample: list[np.ndarray] | None = None) -> int:
    """The smallest tensor arena (bytes) the model allocates and invokes in.

    Doubles from 4 KB until the model runs, then bisects to the byte: the
    answer runs and one byte less does not. `sample`: one value per input
    (batch as exported); zeros by default. Raises ValueError if even
    MAX_ARENA_BYTES is too small, with TFLM's reason.
    """
    with _Trials(model_bytes, sample) as runs:
        hi = 4096
        while not runs(hi):
            if hi >= MAX_ARENA_BYTES:
                Interpreter(model_content=model_bytes, arena_size=MAX_ARENA_BYTES)  # raises: why
                raise ValueError(f"the model does not run in TFLM with a {hi}-byte arena")
            hi *= 2
        lo = hi // 2 if hi > 4096 else 0  # lo fails (or is 0), hi runs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if runs(mid):
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
    model = flatbuffer_schema().Model.GetRootAsModel(model_bytes, 0)
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
