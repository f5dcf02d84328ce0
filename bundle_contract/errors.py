"""The error policy of keras-mha's commands: keras-mha-train, keras-mha-export,
keras-mha-edge, keras-mha-heads, keras-mha-import, keras-mha-qat, keras-mha-rescale,
keras-mha-generate.

The bottom layer of edge_demo: standard library only, importing nothing of
this package, so the device app (no TensorFlow), the library (keras_mha) and
the exporter share it, and `--help` answers before anything heavy is imported.

- Bad input is a `UsageError`: one line on stderr, `PROG: error: ...`, exit 2.
  Argument errors (`Parser`) look the same.
- Out of memory (`MemoryError`) is bad input too: one line, exit 2.
- Ctrl-C: `PROG: interrupted`, exit 130. Writers build beside the target and
  rename (`contract/files.py`), so an interrupted command leaves nothing half-written.
- Anything else is a bug: one line, exit 3; `KERAS_MHA_DEBUG=1` shows the
  traceback instead.

    def main(argv: list[str] | None = None) -> int:
        return run_main(PROG, lambda: _run(build_parser().parse_args(argv)))
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and its result is a failure (e.g. parity)
EXIT_USAGE = 2  # bad input: a file, a flag, the environment, out of memory
EXIT_INTERNAL = 3  # a bug
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
DEBUG_ENV = "KERAS_MHA_DEBUG"


MESSAGE_LIMIT = 1000  # characters of a message's problem; a bundle cannot print megabytes


def one_line(text: object) -> str:
    """`text` with every run of whitespace (newlines too) as one space."""
    return " ".join(str(text).split())


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    """A character a terminal may act on, or that cannot be encoded: C0/C1 controls,
    DEL, lone surrogates, bidirectional overrides and line/paragraph separators."""
    code = ord(char)
    return (
        code < 0x20
        or 0x7F <= code < 0xA0
        or 0xD800 <= code < 0xE000
        or code in (0x2028, 0x2029)
        or 0x202A <= code <= 0x202E
        or 0x2066 <= code <= 0x2069
    )


def safe(text: object, limit: int | None = None) -> str:
    """`text` made safe to print on a terminal: control characters (escape codes,
    newlines, carriage returns), lone surrogates and bidi overrides escaped as
    `\\xNN` / `\\uNNNN`; cut to `limit` characters with "..." when given.

    For every untrusted string in a message, a table or a field read back
    from a file: file names, mode names, `dataset`, labels. Idempotent, so a
    field cleaned on read and written again stays the same, and `safe(x) ==
    x` says x is printable. A backslash is left as it is: `shown()` doubles it
    where a person reads the string.
    """
    text = str(text)
    if any(_unsafe(c) for c in text):
        text = "".join(_escape(c) if _unsafe(c) else c for c in text)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text


def shown(text: object, limit: int | None = None) -> str:
    """`safe(text)` for a person to read: a backslash doubled first, so a name
    holding the four characters `\\x1b` is not shown as the escape code's
    name (`safe` writes ESC itself as `\\x1b`). For paths, sentences and
    word pieces the commands print, and the file a UsageError names."""
    return safe(str(text).replace("\\", "\\\\"), limit)


class UsageError(ValueError):
    """Input a command refuses: a file, a flag, an array, the environment.

    The message is one line, `WHERE: PROBLEM` when `where` is given.

    Args:
        problem: what is wrong and what was expected.
        where: what the user would name: a file path, a flag (`--out`), a
            package; None when the problem says it.
    """

    def __init__(self, problem: str, where: str | os.PathLike | None = None):
        self.problem = safe(one_line(problem), MESSAGE_LIMIT)
        self.where = None if where is None else shown(where, 300)
        super().__init__(self.problem if self.where is None else f"{self.where}: {self.problem}")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, `PROG: error: ...`, exit 2.

    Subparsers made by `add_subparsers` inherit the class.
    """

    def error(self, message: str):  # type: ignore[override]
        text = safe(one_line(message), MESSAGE_LIMIT)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


def _int_at_least(minimum: int, expectation: str, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expectation}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {expectation}, got {value}")
        return value

    return parse


def int_in(minimum: int, maximum: int):
    """argparse `type=`: an integer from `minimum` to `maximum`."""
    return _int_at_least(minimum, f"an integer from {minimum} to {maximum}", maximum)


positive_int = _int_at_least(1, "a positive integer")
positive_int.__doc__ = "argparse `type=`: an integer >= 1."
nonnegative_int = _int_at_least(0, "an integer >= 0")
nonnegative_int.__doc__ = "argparse `type=`: an integer >= 0 (an index, a count)."


def _reconfigure_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="replace")  # µ and Δ on an ASCII terminal


# The interrupt records of the commands running (run_main's), innermost last.
_NOTED: list[list[bool]] = []


def raise_if_interrupted() -> None:
    """KeyboardInterrupt if Ctrl-C came during this command but something swallowed it.

    TensorFlow's op dispatch clears a Python error raised while it runs, the
    KeyboardInterrupt too (measured: a Ctrl-C while Keras traced the attention
    probe, and export went on to write its bundle, exit 0). A staged write calls
    this before its rename, so such a Ctrl-C still leaves nothing behind.
    """
    if _NOTED and _NOTED[-1]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _noting_interrupts() -> Iterator[list[bool]]:
    """Note whether Ctrl-C came, even if the code it interrupted turned it into another error.

    (TensorFlow interrupted while tracing can raise an AttributeError from its
    half-built state instead of the KeyboardInterrupt.) Yields a list that
    holds True once SIGINT arrived. Leaves SIGINT alone if it is not Python's
    default handler (ignored, or someone else's).
    """
    noted: list[bool] = []
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield noted
            return

        def handler(signum, frame):
            noted.append(True)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield noted
        return
    _NOTED.append(noted)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _NOTED.pop()


def run_main(prog: str, body: Callable[[], int]) -> int:
    """Run a command's `body` under the policy; return the exit status.

    `body` returns 0 (success) or 1 (a failure it reported itself). A
    `SystemExit` (argparse's `--help`, its usage errors) passes its code on.
    """
    _reconfigure_streams()
    with _noting_interrupts() as interrupted:
        try:
            return body()
        except UsageError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except MemoryError as exc:
            detail = f" ({safe(one_line(exc), 200)})" if str(exc) else ""
            print(
                f"{prog}: error: out of memory{detail}; try a smaller model or input",
                file=sys.stderr,
            )
            return EXIT_USAGE
        except SystemExit as exc:  # --help, --version, argparse's usage errors
            if exc.code is None or isinstance(exc.code, int):
                return exc.code or EXIT_OK
            print(f"{prog}: error: {safe(one_line(exc.code), MESSAGE_LIMIT)}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:  # e.g. piped into `head`: stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_FAILED
        except Exception as exc:
            if interrupted:  # raised while unwinding from Ctrl-C: it is the interrupt
                print(f"{prog}: interrupted", file=sys.stderr)
                return EXIT_INTERRUPTED
            if os.environ.get(DEBUG_ENV):
                raise
            print(
                f"{prog}: internal error: {type(exc).__name__}: {safe(one_line(exc), 500)} "
                f"(set {DEBUG_ENV}=1 for a traceback)",
                file=sys.stderr,
            )
            return EXIT_INTERNAL
