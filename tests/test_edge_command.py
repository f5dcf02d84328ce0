"""The command-line policy shared by train, export, edge and heads (bundle_contract.errors)."""

from __future__ import annotations

import os
import pathlib

import pytest

from bundle_contract.errors import (
    DEBUG_ENV,
    Parser,
    UsageError,
    nonnegative_int,
    positive_int,
    run_main,
)
from bundle_contract.files import check_writable

pytest_plugins = ["edge_fixtures"]  # read_only_dir


def _raise(exc: BaseException):
    def body() -> int:
        raise exc

    return body


def test_usage_error_is_one_line_value_error_naming_where():
    error = UsageError("expected a\n  positive   integer", "--threads")
    assert isinstance(error, ValueError)
    assert str(error) == "--threads: expected a positive integer"
    assert (error.where, error.problem) == ("--threads", "expected a positive integer")
    assert str(UsageError("no where")) == "no where" and UsageError("x").where is None


@pytest.mark.parametrize(
    "exc, status, expected",
    [
        (UsageError("is not a directory", "/tmp/x"), 2, "prog: error: /tmp/x: is not a directory"),
        (MemoryError("Unable to allocate 74.5 GiB"), 2, "prog: error: out of memory"),
        (KeyboardInterrupt(), 130, "prog: interrupted"),
        (
            RuntimeError("boom\nsecond line"),
            3,
            "prog: internal error: RuntimeError: boom second line",
        ),
    ],
    ids=["usage", "memory", "interrupt", "bug"],
)
def test_run_main_maps_each_outcome_to_one_line(exc, status, expected, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert run_main("prog", _raise(exc)) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(expected), captured.err


def test_run_main_passes_results_and_exit_codes_through(capsys):
    assert run_main("prog", lambda: 1) == 1
    assert run_main("prog", _raise(SystemExit(0))) == 0
    assert run_main("prog", _raise(SystemExit(2))) == 2
    assert capsys.readouterr().err == ""


def test_debug_env_shows_the_traceback(monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(RuntimeError, match="boom"):
        run_main("prog", _raise(RuntimeError("boom")))


def test_parser_errors_are_one_line_exit_2(capsys):
    parser = Parser(prog="prog")
    parser.add_argument("--n", type=positive_int)
    sub = parser.add_subparsers(dest="command").add_parser("go")
    sub.add_argument("--i", type=nonnegative_int)
    for argv, fragment in (
        (["--n", "0"], "argument --n: expected a positive integer, got 0"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["go", "--i", "x"], "argument --i: expected an integer >= 0, got 'x'"),
    ):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("prog") and fragment in err, err


def test_check_writable_accepts_new_nested_paths_and_leaves_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "bundle"
    assert check_writable(target) == target
    assert list(tmp_path.iterdir()) == []  # nothing created, no probe file left


def test_check_writable_refuses_a_file_as_parent_and_a_dangling_link(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match=r"--out .*file/bundle: .*file is not a directory"):
        check_writable(tmp_path / "file" / "bundle")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="dangling symbolic link"):
        check_writable(tmp_path / "link", "--json")


def test_check_writable_refuses_a_read_only_file_system(read_only_dir):
    directory = read_only_dir
    reason = "Permission denied" if os.geteuid() != 0 else "Read-only file system"
    with pytest.raises(UsageError) as info:
        check_writable(directory / "bundle")
    assert (
        str(info.value) == f"--out {directory / 'bundle'}: cannot write in {directory} ({reason})"
    )
    assert not pathlib.Path(directory / "bundle").exists()


def test_an_error_raised_while_unwinding_from_ctrl_c_is_the_interrupt(capsys):
    """Library code that turns the KeyboardInterrupt into another error still exits 130.

    Python's own handler is set first: a shell starts a background job with SIGINT
    ignored, and run_main rightly leaves an ignored SIGINT alone."""
    import signal

    def body() -> int:
        try:
            signal.raise_signal(signal.SIGINT)  # this thread: TF's threads may take a kill()
        except KeyboardInterrupt:
            raise AttributeError("half-built state") from None
        return 0

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert run_main("prog", body) == 130
        assert capsys.readouterr().err == "prog: interrupted\n"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_swallowed_ctrl_c_still_cancels_the_write(tmp_path, capsys):
    """TensorFlow's op dispatch clears a KeyboardInterrupt raised inside it and the
    command goes on; the staged bundle and file are not renamed into place, and
    the command exits 130 (tests/test_export_input.py's Ctrl-C test met it once
    in CI: export exit 0, a bundle written)."""
    import signal

    from bundle_contract.files import building, write_bytes_atomic

    def body(write) -> int:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # what TensorFlow's dispatcher does with it
        write()
        return 0

    def bundle():
        with building(tmp_path / "bundle") as staging:
            (staging / "model.tflite").write_bytes(b"x")

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for write in (bundle, lambda: write_bytes_atomic(tmp_path / "report.json", b"{}")):
            assert run_main("prog", lambda write=write: body(write)) == 130
            assert capsys.readouterr().err == "prog: interrupted\n"
            assert list(tmp_path.iterdir()) == []
        assert run_main("prog", lambda: (bundle(), 0)[1]) == 0  # the next command is not
        assert [p.name for p in tmp_path.iterdir()] == ["bundle"]
    finally:
        signal.signal(signal.SIGINT, before)


def test_building_replaces_the_target_or_leaves_nothing(tmp_path):
    from bundle_contract.files import building

    out = tmp_path / "new" / "bundle"
    with pytest.raises(KeyboardInterrupt):
        with building(out) as staging:
            (staging / "half").write_text("x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []  # no staging dir, and the parent it made is gone
    with building(out) as staging:
        (staging / "whole").write_text("x")
    assert [p.name for p in out.iterdir()] == ["whole"]
    assert [p.name for p in out.parent.iterdir()] == ["bundle"]
