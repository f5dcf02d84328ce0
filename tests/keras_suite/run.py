"""Run the layer's tests and Keras's own MultiHeadAttention tests on every backend.

    python tests/keras_suite/run.py            # Keras's suite on all three, layer tests on JAX, torch
    python tests/keras_suite/run.py --layer-tests-on-tensorflow   # also the TF layer tests
    python tests/keras_suite/run.py --bench    # benchmarks/bench_attention.py on each backend

One process per backend (KERAS_BACKEND is read once, at import): TensorFlow
in .venv, JAX in .venv-jax, PyTorch in .venv-torch (made by mk/backends.mk).
A backend whose venv is missing or failed to install is reported SKIPPED
with the reason. Prints one line per backend and suite:

    tensorflow  keras suite: 48 passed, 0 failed, 0 excluded, 2 skipped

and exits 1 if anything failed (a listed exclusion that passes fails too).
The main `pytest` run already covers the layer tests on TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[2]
VENVS = {"tensorflow": ".venv", "jax": ".venv-jax", "torch": ".venv-torch"}
KERAS_SUITE = ["tests/keras_suite/keras_suite.py"]
LAYER_TESTS = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_attention*.py"))


def _python(backend: str) -> tuple[pathlib.Path | None, str]:
    venv = REPO / VENVS[backend]
    failed = venv / ".failed"
    if failed.exists():
        return None, f"install failed: {failed.read_text().strip()}"
    if not (venv / ".installed").exists() and backend != "tensorflow":
        return None, f"{VENVS[backend]} is not installed (make backend-venvs)"
    python = venv / "bin" / "python"
    if not python.exists():
        return None, f"{python} is missing"
    return python, ""


def _counts(junit: pathlib.Path) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "excluded": 0, "skipped": 0}
    for case in ET.parse(junit).iter("testcase"):
        kinds = {child.tag for child in case}
        skipped = case.find("skipped")
        if "failure" in kinds or "error" in kinds:
            counts["failed"] += 1
        elif skipped is not None and skipped.get("type") == "pytest.xfail":
            counts["excluded"] += 1
        elif skipped is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def run_pytest(backend: str, python: pathlib.Path, files: list[str]) -> dict[str, int] | None:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with tempfile.TemporaryDirectory() as tmp:
        junit = pathlib.Path(tmp) / "junit.xml"
        cmd = [str(python), "-m", "pytest", *files, "-q", "-p", "no:cacheprovider"]
        cmd += ["-o", "addopts=--strict-markers", f"--junitxml={junit}", "-rfE"]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if not junit.exists():
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            return None
        counts = _counts(junit)
        if counts["failed"]:
            sys.stderr.write(proc.stdout[-8000:])
        return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(VENVS), choices=list(VENVS))
    parser.add_argument("--layer-tests-on-tensorflow", action="store_true")
    parser.add_argument("--bench", action="store_true", help="run the benchmark instead")
    parser.add_argument(
        "--json", help="with --bench: write the results here (one file per backend)"
    )
    args = parser.parse_args(argv)
    ok = True
    lines = []
    for backend in args.backends:
        python, why = _python(backend)
        if python is None:
            lines.append(f"{backend:<11} SKIPPED: {why}")
            continue
        if args.bench:
            cmd = [str(python), "benchmarks/bench_attention.py", "--memory"]
            if args.json:
                stem = pathlib.Path(args.json)
                cmd += ["--json", str(stem.with_name(f"{stem.stem}_{backend}{stem.suffix}"))]
            env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
            ok &= subprocess.run(cmd, cwd=REPO, env=env).returncode == 0
            continue
        suites = [("keras suite", KERAS_SUITE)]
        if backend != "tensorflow" or args.layer_tests_on_tensorflow:
            suites.append(("layer tests", LAYER_TESTS))
        for name, files in suites:
            counts = run_pytest(backend, python, files)
            if counts is None:
                lines.append(f"{backend:<11} {name}: pytest did not run (output above)")
                ok = False
                continue
            ok &= counts["failed"] == 0
            lines.append(
                f"{backend:<11} {name}: {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['excluded']} excluded, {counts['skipped']} skipped"
            )
            print(lines[-1], flush=True)
    print("\n".join(["", "backends:"] + lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
