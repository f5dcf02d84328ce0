"""TensorFlow's start-up, quiet: for the commands, never for the layer.

`import tensorflow` writes C++ log lines straight to file descriptor 2. Most
are filtered by `TF_CPP_MIN_LOG_LEVEL`, read when TensorFlow loads. Some are
not: where oneDNN is on (Intel CPUs by default, or `TF_ENABLE_ONEDNN_OPTS=1`),
absl logs

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1796159047.520679    2709 port.cc:153] oneDNN custom operations are on. ...

before TensorFlow's own level applies. `import_tensorflow()` imports it with
descriptor 2 captured and replays every line the level would have let
through, so the level means what it says for these lines too. oneDNN stays
as TensorFlow chose: turning it off would change the numbers.

The commands call `import_tensorflow()` first thing after parsing their
arguments; importing `keras_mha` itself changes nothing in the process.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = 3  # the commands show errors in their own words, not TensorFlow's
# absl's prefix: severity letter, MMDD, time (TF 2.21 prints 00:00:<unix seconds>),
# thread, file:line]
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_PRE_INIT_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"


def log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL as TensorFlow reads it (0 when unset or not a number)."""
    try:
        return int(os.environ.get(LEVEL_VARIABLE, "0"))
    except ValueError:
        return 0


def filter_start_up_log(text: str, level: int) -> str:
    """`text` less absl's lines below `level` (0 info, 1 warning, 2 error, 3 fatal only).

    absl's notice that it is not initialised yet is about those lines, so it
    goes when info lines do. Any other text is kept. (TensorFlow's multi-line
    banners are logged after its own level applies, so they never get here.)
    """
    kept = []
    for line in text.splitlines(keepends=True):
        prefix = _ABSL_LINE.match(line)
        if prefix and _SEVERITY[prefix.group(1)] < level:
            continue
        if line.startswith(_PRE_INIT_NOTICE) and level >= 1:
            continue
        kept.append(line)
    return "".join(kept)


def _flush_c_streams() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output() -> Iterator[list[str]]:
    """Collect what Python and native code print to stdout/stderr meanwhile.

    Yields a list that holds the captured lines once the block has ended.
    """
    lines: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no file descriptors to redirect (embedded interpreter)
        saved = None
    python_text = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        if saved is not None:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
        try:
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(python_text),
                contextlib.redirect_stderr(python_text),
            ):
                warnings.simplefilter("ignore")
                yield lines
        finally:
            _flush_c_streams()  # native printf output still in libc's buffers
            if saved is not None:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
            sink.seek(0)
            native = sink.read().decode(errors="replace")
            lines.extend((python_text.getvalue() + native).splitlines())


def import_tensorflow() -> types.ModuleType | None:
    """Import TensorFlow and Keras with the start-up logs filtered; return `tensorflow`.

    Sets TF_CPP_MIN_LOG_LEVEL to 3 unless the environment has it (an explicit
    value wins, so `TF_CPP_MIN_LOG_LEVEL=0` shows everything). Returns None
    where TensorFlow is not installed (a JAX or PyTorch environment).
    """
    os.environ.setdefault(LEVEL_VARIABLE, str(DEFAULT_LEVEL))
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    tf = None
    with captured_output() as lines:
        with contextlib.suppress(ImportError):
            import keras  # noqa: F401  (with TensorFlow's backend, more start-up lines)
            import tensorflow as tf
    sys.stderr.write(filter_start_up_log("".join(f"{line}\n" for line in lines), log_level()))
    sys.stderr.flush()
    if tf is not None and log_level() >= 2:  # TensorFlow's Python loggers, likewise
        tf.get_logger().setLevel("ERROR")
        with contextlib.suppress(ImportError):
            from absl import logging as absl_logging

            absl_logging.set_verbosity(absl_logging.ERROR)
    return tf
