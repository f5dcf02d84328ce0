"""A script's commands answered by one long-lived process per interpreter.

A test that asks another venv's Python (torch, JAX) a question pays for that
interpreter's imports each time it starts one: torch and transformers take
about 8 s on 2 cores, Keras on JAX about 6 s. A script written for this runs
`serve(main)` when its only argument is `serve`; `ask` starts that process
once per (interpreter, script, environment) in this test process, sends each
command as a JSON line and gets back what a process of its own would have
exited with and printed. Standard library only: both sides import it (the
script from its own folder, the tests as `tests.oracle.serving`).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import select
import subprocess
import sys
import tempfile
import traceback

TIMEOUT = 600  # s: a hang guard for one command, not a speed limit


def serve(main) -> int:
    """Answer `main(argv)` for each JSON list of arguments on stdin with one JSON
    line on stdout: {"returncode", "stdout", "stderr"}. A command seeds what it
    uses, so its files are the ones a process of its own writes. Ends at the end
    of stdin."""
    answer = sys.stdout
    for line in sys.stdin:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(json.loads(line))
            except SystemExit as stop:  # argparse's --help and errors
                code = stop.code if isinstance(stop.code, int) else 1
            except Exception:  # what a process of its own would show and exit 1 on
                traceback.print_exc()
                code = 1
        reply = {"returncode": code or 0, "stdout": out.getvalue(), "stderr": err.getvalue()}
        answer.write(json.dumps(reply) + "\n")
        answer.flush()
    return 0


_SERVERS: dict[tuple, subprocess.Popen] = {}
# What pytest changes in os.environ from one test to the next (the running
# test's name): a server is not started again for it. Copied into every
# test's `env`, it made each test start its own server: 30 JAX and PyTorch
# servers in one make test, 5 to 9 CPU-s of imports each (Intel Xeon). The 8
# classifiers' backend tests: 8 servers and 119 s, now 2 and 91 s.
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


def _server(python, script, env) -> subprocess.Popen:
    if env is not None:
        env = {k: v for k, v in env.items() if k not in VOLATILE}
    key = (str(python), str(script), tuple(sorted((env or {}).items())))
    server = _SERVERS.get(key)
    if server is None or server.poll() is not None:
        log = tempfile.TemporaryFile(mode="w+")  # what a library prints past Python's streams
        server = subprocess.Popen(
            [str(python), str(script), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )
        server.log = log
        server.key = key
        _SERVERS[key] = server
    return server


@atexit.register
def _stop_servers() -> None:
    for server in _SERVERS.values():
        if server.poll() is None:
            server.stdin.close()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        server.stdout.close()
        server.log.close()


def ask(python, script, argv, env=None) -> subprocess.CompletedProcess:
    """`python script ARGV...` (env: the child's whole environment), answered by
    that script's server: the same exit status and output."""
    argv = [str(a) for a in argv]
    server = _server(python, script, env)
    try:
        server.stdin.write(json.dumps(argv) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], TIMEOUT)
        line = server.stdout.readline() if ready else ""
    except BrokenPipeError:
        line = ""
    if line:
        reply = json.loads(line)
    else:  # it died or hung: what it printed, and a new one for the next command
        server.kill()
        server.wait()
        for stream in (server.stdin, server.stdout):
            with contextlib.suppress(OSError):  # a broken pipe's unflushed write
                stream.close()
        server.log.seek(0)
        why = f"no answer in {TIMEOUT} s" if server.returncode == -9 else "it died"
        name = getattr(script, "name", script)
        reply = {"returncode": server.returncode or 1, "stdout": "",
                 "stderr": f"{name} serve: {why}\n{server.log.read()[-3000:]}"}  # fmt: skip
        server.log.close()
        _SERVERS.pop(server.key, None)
    return subprocess.CompletedProcess(
        [str(python), str(script), *argv], reply["returncode"], reply["stdout"], reply["stderr"]
    )
