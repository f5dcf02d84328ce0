"""Several processes training one model: `keras-mha-train --processes N`.

    # on each host (or each process on one host), its own --process-id:
    keras-mha-train --from all-MiniLM-L6-v2 --data my.csv --distribute heads \\
        --processes 2 --process-id 0 --coordinator 10.0.0.1:29500

Each process sees its own devices (its GPUs, or its CPU split by
`XLA_FLAGS=--xla_force_host_platform_device_count=N`); `jax.distributed`
joins them into one list, process 0 hosting the coordinator, and Keras's
distribution lays the model over all of them. Every process reads the data
and feeds its part of every batch (`finetune.process_rows`); process 0
reports progress and writes the run.

A process that dies takes the job down: JAX's coordinator notices the
missing heartbeats after `timeout` seconds and ends every other process
from C++ (a fatal log line and a stack trace, then the process is gone), and
a collective whose peer is gone fails in Gloo. So the command runs the
training in a child process (`supervise`): the child's own messages
(progress, its one-line errors) reach the user as they come; what XLA and
Gloo print goes to a log file; the child marks the end of its own answer in
that log (`WORKER_EXIT`), and a child that ends without it is reported in one
line, naming what happened and the log. No run is half-written: only process
0 writes it, after the job has ended (`Job.leave`); a `--checkpoint`'s state
is written during the job, each file whole (keras_mha/train/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time

from bundle_contract.errors import EXIT_FAILED, one_line

WORKER_ENV = "KERAS_MHA_TRAIN_WORKER"  # the path of the child's log
WORKER_EXIT = "keras-mha-train worker exit status "  # + the status: the child's last word
TIMEOUT = 60  # seconds: to join, and without a heartbeat from another process


# What a collective raises when its peer process is gone (Gloo over TCP).
LOST = ("Connection reset by peer", "Connection closed by peer", "Socket closed", "Broken pipe")


class JobLost(Exception):
    """Another process of the job is gone (one line)."""


@dataclasses.dataclass
class Job:
    """This process's place in a training job (default: a job of one process)."""

    processes: int = 1
    process_id: int = 0
    coordinator: str | None = None  # host:port of process 0's coordinator
    timeout: int = TIMEOUT
    joined: bool = False

    @property
    def where(self) -> str:
        return f"process {self.process_id} of {self.processes}"

    @property
    def lead(self) -> bool:
        """Process 0: it reports progress and writes the run."""
        return self.process_id == 0

    def join(self) -> None:
        """Connect to the other processes (`jax.distributed.initialize`), before
        JAX has made its devices. Waits at most `timeout` seconds for them."""
        if self.processes == 1 or self.joined:
            return
        import jax

        try:
            jax.distributed.initialize(
                self.coordinator,
                self.processes,
                self.process_id,
                initialization_timeout=self.timeout,
                heartbeat_timeout_seconds=self.timeout,
                shutdown_timeout_seconds=self.timeout,
            )
        except Exception as error:  # the coordinator's port taken, a peer never came, ...
            raise JobLost(
                f"{self.where}: the job's {self.processes} processes did not all join at "
                f"{self.coordinator} within {self.timeout} s ({one_line(error)[:200]}); "
                "no run written"
            ) from None
        self.joined = True

    def leave(self) -> None:
        """Leave the job once every process has what it needs (a barrier)."""
        if not self.joined:
            return
        import jax

        jax.distributed.shutdown()
        self.joined = False

    @contextlib.contextmanager
    def running(self):
        """Training in the job: a collective that fails because another
        process is gone (Gloo's connection reset) becomes one line (a
        JobLost), instead of an internal error."""
        try:
            yield
        except Exception as error:
            text = str(error)
            if self.processes > 1 and any(sign in text for sign in LOST):
                reason = next(sign for sign in LOST if sign in text)
                raise JobLost(
                    f"{self.where}: another process of the job stopped ({reason.lower()} in a "
                    "collective); this one stopped too, no run written"
                ) from None
            raise

    def local_devices(self) -> int | None:
        """Each process's device count in a job of several (None: one process)."""
        if self.processes == 1:
            return None
        import jax

        return jax.local_device_count()

    def host_values(self, variables) -> list:
        """The variables' values as whole numpy arrays on this process: sharded
        values gathered from every device (from every process: each process
        must call this, with the same variables)."""
        from keras import ops

        if self.processes == 1:
            return [ops.convert_to_numpy(v.value) for v in variables]
        import numpy as np
        from jax.experimental import multihost_utils

        values = []
        for v in variables:
            value = v.value
            if getattr(value, "is_fully_addressable", True):
                values.append(np.asarray(value))
            else:
                values.append(np.asarray(multihost_utils.process_allgather(value, tiled=True)))
        return values


# ------------------------------------------------------------ the supervisor
def supervise(prog: str, argv: list[str], job: Job) -> int:
    """Run `python -m keras_mha.train ARGV` as this process's worker and
    return its exit status; a worker that ends without its own word (XLA
    ended it) is reported in one line, with the log of what XLA printed."""
    fd, log_path = tempfile.mkstemp(prefix=f"{prog}-process{job.process_id}-", suffix=".log")
    os.close(fd)
    child = subprocess.Popen(
        [sys.executable, "-m", "keras_mha.train", *argv],
        stdin=subprocess.DEVNULL,
        env={**os.environ, WORKER_ENV: log_path},
    )
    try:
        code = child.wait()
    except KeyboardInterrupt:  # the worker, in the same process group, got it too
        try:
            code = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise KeyboardInterrupt from None
    with open(log_path, errors="replace") as log:
        text = log.read()
    if f"\n{WORKER_EXIT}{code}\n" in text:  # the worker said why itself, and ended so
        os.unlink(log_path)
        return code
    print(f"{prog}: error: {_why(job, code, text)} (log: {log_path})", file=sys.stderr)
    return EXIT_FAILED


def _why(job: Job, code: int, text: str) -> str:
    """One line for a worker that ended without saying why, from its log's `text`."""
    where = job.where
    if "RegisterTask" in text:  # joining, not yet training
        return (
            f"{where}: the job's {job.processes} processes did not all join at "
            f"{job.coordinator} within {job.timeout} s; no run written"
        )
    if "stopped sending heartbeats" in text:
        return (
            f"{where}: another process of the job stopped (no heartbeat for "
            f"{job.timeout} s); this one stopped too, no run written"
        )
    if "another task died" in text:
        return (
            f"{where}: the job's coordinator ({job.coordinator}, process 0) stopped or "
            "lost this process; this one stopped too, no run written"
        )
    how = f"signal {-code}" if code < 0 else f"exit status {code}"
    return f"{where}: training stopped with {how}; no run written"


def become_worker() -> bool:
    """Whether this process is a supervisor's worker. If so, what XLA, Gloo
    and TensorFlow print (to the file descriptors 1 and 2) goes to the log
    from now on, while Python's own output (progress, the summary, one-line
    errors) still reaches the user; and the worker ends when its supervisor does."""
    path = os.environ.pop(WORKER_ENV, None)
    if path is None:
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(path, os.O_WRONLY | os.O_APPEND)
    out, err = os.dup(1), os.dup(2)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout = open(out, "w", buffering=1, errors="replace")  # noqa: SIM115
    sys.stderr = open(err, "w", buffering=1, errors="replace")  # noqa: SIM115
    parent = os.getppid()

    def watch():  # a supervisor killed outright leaves no one to wait for this child
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(EXIT_FAILED)

    threading.Thread(target=watch, daemon=True).start()
    return True


def worker_exit(code: int) -> None:
    """The worker's last word in its log: it said why it ends (`supervise` reads it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(2, f"\n{WORKER_EXIT}{code}\n".encode())
