"""What a test needs from the machine, and what happens when it is missing.

A test that cannot run because something outside the code is missing (a
Chromium, a venv, root for a tmpfs mount) calls `missing(...)`. On a
developer's machine that is a skip with the reason. Under CI (`CI=true`) or
`KERAS_MHA_STRICT=1` it is a failure naming what was missing, so a green
run means everything ran.

    from environment import missing
    if shutil.which("chromium") is None:
        missing("Debian's chromium (make browser installs it as root)")
"""

from __future__ import annotations

import os

import pytest

STRICT_VARIABLE = "KERAS_MHA_STRICT"


def strict() -> bool:
    """True under CI (CI=true) or KERAS_MHA_STRICT=1; KERAS_MHA_STRICT=0 turns it off."""
    explicit = os.environ.get(STRICT_VARIABLE, "").strip().lower()
    if explicit:
        return explicit not in ("0", "false", "no")
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str) -> None:
    """Skip, or under strict fail, because `what` is not on this machine. Never returns."""
    if strict():
        message = f"strict run: {what} is missing (set {STRICT_VARIABLE}=0 to skip instead)"
        pytest.fail(message, pytrace=False)  # one line, no traceback
    pytest.skip(f"{what} is missing")


def venv_python(path, how: str):
    """`path` (a venv's bin/python) if it exists, else `missing(...)`.

    Where make skipped the venv because its runtime has no wheel for this
    Python (tflite-runtime, TFLite Micro), the venv's `.skipped` file says so,
    and that line is the reason given.
    """
    import pathlib

    path = pathlib.Path(path)
    if path.exists():
        return path
    skipped = path.parent.parent / ".skipped"
    if skipped.is_file():
        missing(f"{path} ({skipped.read_text().strip()})")
    missing(f"{path} ({how})")


# Tests, not timings: a JAX child compiles each new function with XLA's cheapest
# code generation, and runs it on one thread, as make test's other processes do
# (Makefile, ONE_THREAD): two copies of Keras's suite at once on 2 cores, 39 s
# each with XLA's pool, 36 s on one thread (AMD EPYC). tests/keras_suite/run.py
# gives the JAX suites the same flags.
JAX_TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
    " intra_op_parallelism_threads=1"
)


def backend_env(backend: str, **extra: str) -> dict[str, str]:
    """os.environ for a child process running Keras on `backend` (its venv's python)."""
    env = {**os.environ, "KERAS_BACKEND": backend, **extra}
    if backend == "jax":
        env.setdefault("XLA_FLAGS", JAX_TEST_XLA_FLAGS)
    return env
