"""The TFLite runtimes: which one, imported only when a model is about to run.

A runtime is one entry of `RUNTIMES`: the name the manifest's `runtimes` uses,
the module whose `Interpreter(model_content=, num_threads=)` follows the
`tf.lite.Interpreter` interface, and the package whose version is reported.
A module name starting with "." lives in this package (`.micro`, the TFLite
Micro adapter). `select_runtime("auto")` tries them in order, imported only then.
The model wrapper every caller runs through is model.py's `EdgeModel`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bundle_contract.errors import UsageError


@dataclasses.dataclass(frozen=True)
class RuntimeEntry:
    """A runtime the demo can use: `--runtime CHOICE`."""

    name: str  # as in the manifest's `runtimes`: "ai-edge-litert"
    module: str  # has `Interpreter`; ".micro" = this package's micro.py
    package: str  # imported to report its version
    numpy_below_2: bool = False  # its binary wheels were built against numpy 1.x


# LiteRT's (and tflite-runtime's) line when it applies a delegate to a model.
DELEGATE_CREATED = re.compile(r"Created TensorFlow Lite (\w+) delegate")
_DELEGATES: dict[str, set[str]] = {}  # runtime name -> the delegates it said it created
MICRO_RUNTIME = "tflite-micro"  # TensorFlow Lite Micro (micro.py)
RUNTIMES: dict[str, RuntimeEntry] = {
    "litert": RuntimeEntry("ai-edge-litert", "ai_edge_litert.interpreter", "ai_edge_litert"),
    "tflite-runtime": RuntimeEntry(
        "tflite-runtime", "tflite_runtime.interpreter", "tflite_runtime", numpy_below_2=True
    ),
    # Last, so `auto` never picks it; runs each mode's deploy file (policy.py).
    "tflite-micro": RuntimeEntry(MICRO_RUNTIME, ".micro", "tflite_micro"),
}


@dataclasses.dataclass(frozen=True)
class Runtime:
    """An imported runtime; `interpreter(model_content=, num_threads=)` makes an interpreter."""

    name: str
    version: str
    module: str  # the absolute interpreter module, for the child-process probe
    interpreter: Callable[..., Any] = dataclasses.field(repr=False, compare=False)

    def note_load(self, output: str) -> None:
        """Keep what a model's load wrote to fd 2 says of delegates (`delegates`)."""
        _DELEGATES.setdefault(self.name, set()).update(DELEGATE_CREATED.findall(output))

    @property
    def delegates(self) -> list[str]:
        """The delegates this runtime said it created in this process ("XNNPACK").

        LiteRT logs "Created TensorFlow Lite XNNPACK delegate" on fd 2 once per
        process, when the first model loads; the app captures it (model.py)."""
        return sorted(_DELEGATES.get(self.name, ()))

    def info(self) -> dict:
        """What the report and JSON say about the runtime and its environment."""
        return {
            "name": self.name,
            "version": self.version,
            "module": self.module,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "delegates": self.delegates,
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


def import_runtime(choice: str) -> Runtime:
    """Import the runtime `RUNTIMES[choice]`; UsageError naming it if it cannot be."""
    entry = RUNTIMES[choice]
    if entry.numpy_below_2 and int(np.__version__.split(".")[0]) >= 2:
        raise UsageError(
            f"{entry.name} needs numpy<2 but numpy {np.__version__} is installed: "
            "pip install -r edge_demo/requirements-tflite-runtime.txt, or use ai-edge-litert",
            entry.name,
        )
    module_name = importlib.util.resolve_name(entry.module, __package__)
    package_name = importlib.util.resolve_name(entry.package, __package__)
    try:
        module = importlib.import_module(module_name)
        package = importlib.import_module(package_name)
    except Exception as exc:  # ImportError, or a broken binary wheel
        raise UsageError(
            f"cannot import {module_name} ({type(exc).__name__}: {exc})", entry.name
        ) from None
    return Runtime(
        entry.name, _package_version(entry.name, package), module_name, module.Interpreter
    )


def select_runtime(choice: str = "auto") -> Runtime:
    """Import a runtime: a `RUNTIMES` key, or `auto` (each in order, the first that imports)."""
    if choice in RUNTIMES:
        return import_runtime(choice)
    if choice != "auto":
        raise UsageError(f"unknown runtime {choice!r} ({', '.join(RUNTIMES)}, auto)", "--runtime")
    problems = []
    for candidate in RUNTIMES:
        try:
            return import_runtime(candidate)
        except UsageError as exc:
            problems.append(exc.problem)
    raise UsageError(
        "no TFLite runtime found: pip install -r edge_demo/requirements.txt "
        f"(ai-edge-litert), or tflite-runtime with numpy<2 [{'; '.join(problems)}]",
        "runtime",
    )


def load_interpreter(runtime: Runtime, content: bytes, threads, where, ready) -> tuple:
    """(an interpreter of `content`, what `ready(interpreter)` returned, ms it took):
    made and readied (allocated, its runners made: LiteRT says "Created ... XNNPACK
    delegate" on fd 2 then) with fd 2 captured (`Runtime.note_load`). A UsageError
    naming `where` when the runtime cannot load it."""
    start = time.perf_counter()
    with captured_stderr() as captured:
        try:
            interpreter = runtime.interpreter(model_content=content, num_threads=threads)
            readied = ready(interpreter)
        except Exception as exc:  # the runtimes raise ValueError or RuntimeError
            error: Exception | None = exc
        else:
            error = None
    if error is not None:
        detail = " ".join(f"{error} {''.join(captured)}".split())[:300]
        raise UsageError(f"{runtime.name} cannot load it ({detail})", where)
    runtime.note_load("".join(captured))
    return interpreter, readied, (time.perf_counter() - start) * 1e3


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
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
