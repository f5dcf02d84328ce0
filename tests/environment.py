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
import pathlib

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
# each with XLA's pool, 36 s on one thread (AMD EPYC). Most of a suite's time is
# compiling (eager Keras on JAX compiles each op anew for each new shape, about
# 30 ms each): XLA's older fusion code generator (use_fusion_emitters=false, one
# of XLA's two CPU code paths) compiles faster: Keras's suite 42 s -> 30 s,
# test_attention_keras.py 103 s -> 67 s, a keras-hub Moonshine test 28 s -> 16 s
# (Intel Xeon, one process alone). The same tests pass on both.
# tests/keras_suite/run.py gives the JAX suites the same flags.
JAX_TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
    " --xla_cpu_use_fusion_emitters=false intra_op_parallelism_threads=1"
)


# ... and keeps what it compiled where the next JAX process finds it: the JAX
# suites (tests/keras_suite/run.py) and pytest's JAX children compile many of
# the same small programs (the layer on the same shapes), each process anew.
# XLA's compilation cache on disk, keyed on the program, the flags and the
# versions, gives back the same executable: Keras's suite on JAX in 20 s
# instead of 42 s with the cache an earlier run left, Keras's GQA suite in 15 s
# instead of 24 s after Keras's suite (Intel Xeon, one process alone). Every
# program is kept (no minimum compile time or size), and none is evicted: with a
# size limit JAX lists and sizes the whole folder at every write, and keras-hub's
# suite on JAX (some 4,000 programs) took 543 s instead of 217 s. A make
# test adds some 30 MB; under .cache/, so a clean clone starts empty and
# `make clean` empties it.
JAX_TEST_CACHE = {
    "JAX_COMPILATION_CACHE_DIR": str(
        pathlib.Path(__file__).resolve().parents[1] / ".cache" / "jax-compile"
    ),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    "JAX_COMPILATION_CACHE_MAX_SIZE": "-1",
}


def jax_test_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the JAX test settings above, where it does not set them itself."""
    env = dict(env)
    env.setdefault("XLA_FLAGS", JAX_TEST_XLA_FLAGS)
    for name, value in JAX_TEST_CACHE.items():
        env.setdefault(name, value)
    return env


def backend_env(backend: str, **extra: str) -> dict[str, str]:
    """os.environ for a child process running Keras on `backend` (its venv's python)."""
    env = {**os.environ, "KERAS_BACKEND": backend, **extra}
    return jax_test_env(env) if backend == "jax" else env
