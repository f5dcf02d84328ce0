"""Run the layer's tests and Keras's own MultiHeadAttention tests on every backend.

    python tests/keras_suite/run.py            # Keras's and keras-hub's suites on all three,
                                               # layer tests on JAX, torch
    python tests/keras_suite/run.py --layer-tests-on-tensorflow   # also the TF layer tests
    python tests/keras_suite/run.py --bench    # benchmarks/bench_attention.py on each backend

One process per backend (KERAS_BACKEND is read once, at import): TensorFlow
in .venv, JAX in .venv-jax, PyTorch in .venv-torch (made by mk/backends.mk;
--venv jax=DIR overrides one). Prints one line per backend and suite:

    tensorflow  keras suite: 49 passed, 0 failed, 2 skipped, 0 excluded

and exits 1 if a suite failed: a test failed (a listed exclusion that passes
too), fewer than MIN_PASSED passed, or Keras's suite did not build our class
(SWAP_TEST did not pass). A backend whose venv is missing or failed to
install is SKIPPED with the reason, and fails under a strict run (CI=true or
KERAS_MHA_STRICT=1, tests/environment.py). With --junit-dir, each suite's
junit (or a .txt saying why it did not run) is kept there for tests/summary.py.
The main `pytest` run already covers the layer tests on TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from environment import jax_test_env, strict  # noqa: E402
from summary import cases, counts, outcome  # noqa: E402

VENVS = {"tensorflow": ".venv", "jax": ".venv-jax", "torch": ".venv-torch"}
KERAS_SUITE = ["tests/keras_suite/keras_suite.py"]
# Keras's tests of GroupedQueryAttention, on keras_mha.GroupedQueryAttention.
GQA_SUITE = ["tests/keras_suite/gqa_suite.py"]
GQA_SWAP_TEST = "test_the_grouped_class_under_test_is_keras_mha"  # gqa_suite.py
# keras-hub's tests of the layers and models built on MultiHeadAttention
# (tests/keras_hub_suite/README.md). keras-hub's test helpers import
# TensorFlow, which the JAX and PyTorch venvs have none of by design (they
# prove the layer needs none): there the suite runs with the TensorFlow venv's
# site-packages appended to sys.path (`_beside_tensorflow`), after the venv's
# own, so Keras, the backend and numpy are still the venv's. TensorFlow's
# compiled packages then load beside that venv's numpy and ml_dtypes: the
# suite runs only where Python's version and those packages' (`SHARED`) are
# the same in both venvs, else it is reported as not run, with the reason. A
# package only TensorFlow's venv has (protobuf, in a fresh JAX venv) loads from
# there: one copy, nothing to differ.
KERAS_HUB_SUITE = sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "tests" / "keras_hub_suite").glob("*.py")
    if p.name not in ("conftest.py", "__init__.py")
)
HUB_SWAP_TEST = "test_keras_hub_builds_keras_mha"  # swap_check.py: keras-hub's classes are ours
LAYER_TESTS = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_attention*.py"))
SWAP_TEST = "test_the_class_under_test_is_keras_mha"  # keras_suite.py: the class is ours
# Fewest passes a suite may have. Today (Keras 3.15): Keras's suite passes 49
# on TensorFlow (its 2 flash tests skip there, as for Keras's own layer) and
# 51 on JAX and PyTorch, SWAP_TEST included; our layer tests 214 on TF and JAX,
# 213 on PyTorch (docs/layer.md; Intel Xeon, 2026-12); keras-hub's 60 on
# TensorFlow, 61 on JAX, 60 on PyTorch (keras-hub 0.32.0, AMD EPYC, 2026-12). A few below, so a Keras
# release that drops or renames a test or two does not fail the run; far above
# 0, so a suite that silently collects or skips some of its tests does. Raise
# them with the counts. Keras's GroupedQueryAttention file: 29 on TensorFlow (its
# 2 flash tests skip there), 31 on JAX and PyTorch, the swap check included (AMD EPYC).
MIN_PASSED = {
    "keras suite": {"tensorflow": 45, "jax": 47, "torch": 47},
    "keras GQA suite": {"tensorflow": 26, "jax": 28, "torch": 28},
    "keras-hub suite": {"tensorflow": 55, "jax": 55, "torch": 55},
    "layer tests": {"tensorflow": 205, "jax": 205, "torch": 205},
}


def _python(backend: str, venvs: dict[str, str]) -> tuple[pathlib.Path | None, str]:
    venv = REPO / venvs[backend]
    failed = venv / ".failed"
    if failed.exists():
        return None, failed.read_text().strip()  # mk/backends.mk: names the venv, what failed
    if not (venv / ".installed").exists() and backend != "tensorflow":
        return None, f"{venvs[backend]} is not installed (make backend-venvs)"
    python = venv / "bin" / "python"
    if not python.exists():
        return None, f"{python} is missing"
    return python, ""


def _result(junit_dir: pathlib.Path, name: str, backend: str, suffix: str) -> pathlib.Path:
    """Where a suite's junit (.xml) or why it did not run (.txt) goes; clears both."""
    stem = junit_dir / f"{name.replace(' ', '-')}-{backend}"
    for old in (".xml", ".txt"):
        stem.with_suffix(old).unlink(missing_ok=True)
    return stem.with_suffix(suffix)


SHARED = ("keras", "numpy", "ml_dtypes", "protobuf")  # what TensorFlow's packages load beside


def _describe_venv(python: pathlib.Path) -> dict:
    """A venv's site-packages (`site`), Python version and the versions of `SHARED`."""
    code = (
        "import importlib.metadata as m, json, sys, sysconfig\n"
        "def version(name):\n"
        "    try:\n"
        "        return m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        f"found = {{n: version(n) for n in {SHARED!r}}}\n"
        "found['python'] = '%d.%d' % sys.version_info[:2]\n"
        "found['site'] = sysconfig.get_paths()['purelib']\n"
        "print(json.dumps(found))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def _beside_tensorflow(python: pathlib.Path, venvs: dict[str, str]) -> tuple[list[str], str]:
    """How `python` starts pytest with the TensorFlow venv's packages importable
    after its own (`site.addsitedir` appends), or [] and why it cannot."""
    tensorflow, why = _python("tensorflow", venvs)
    if tensorflow is None:
        return [], f"keras-hub's test helpers need TensorFlow: {why}"
    ours, theirs = _describe_venv(python), _describe_venv(tensorflow)
    if not ours or not theirs:
        return [], "could not read the venvs' package versions"
    differ = [
        f"{name} {ours[name]} here, {theirs[name]} beside TensorFlow"
        for name in ("python", *SHARED)
        if ours[name] is not None and ours[name] != theirs[name]
    ]
    if differ:
        return [], "TensorFlow's venv differs: " + "; ".join(differ)
    code = "import site, sys; site.addsitedir(%r); import pytest; sys.exit(pytest.main())"
    return ["-c", code % theirs["site"]], ""


def run_pytest(
    backend, python, name, files, junit_dir, start=("-m", "pytest")
) -> tuple[dict[str, int] | None, str]:
    """Run one suite on one backend: (counts, problem); problem is "" when it passed.
    `start`: how the venv's python starts pytest (`_beside_tensorflow`)."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["KERAS_MHA_HUB_SUITE"] = "1"  # tests/keras_hub_suite/conftest.py: swap the class
    if backend == "jax":
        # Tests, not timings (tests/environment.py): XLA compiles each new
        # function with its cheapest code generation and runs it on one thread.
        # The suites compile hundreds of small functions and run each a few
        # times; the first takes the JAX layer tests from 85 s to 58 s of
        # test_attention_keras.py (AMD EPYC). The results are the same programs',
        # kept on disk for the next suite (JAX_TEST_CACHE).
        env = jax_test_env(env)
    junit = _result(junit_dir, name, backend, ".xml")
    cmd = [str(python), *start, *files, "-q", "-p", "no:cacheprovider"]
    cmd += ["-o", "addopts=--strict-markers", f"--junitxml={junit}", "-rfE"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if not junit.exists():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        return None, "pytest did not run (output above)"
    found = cases(junit)
    problem = judge(name, backend, found)
    if counts(found)["failed"]:
        sys.stderr.write(proc.stdout[-8000:])
    return counts(found), problem


def judge(name: str, backend: str, found) -> str:
    """What is wrong with one suite's junit test cases on one backend; "" if nothing."""
    result = counts(found)
    if result["failed"]:
        return f"{result['failed']} failed (output above)"
    least = MIN_PASSED[name][backend]
    if result["passed"] < least:
        return f"only {result['passed']} passed, at least {least} expected (MIN_PASSED)"
    passed = {c.get("name") for c in found if outcome(c) == "passed"}
    if name == "keras suite" and SWAP_TEST not in passed:
        return f"Keras's tests may not have built our class: {SWAP_TEST} did not pass"
    if name == "keras GQA suite" and GQA_SWAP_TEST not in passed:
        return f"Keras's GQA tests may not have built our class: {GQA_SWAP_TEST} did not pass"
    if name == "keras-hub suite" and HUB_SWAP_TEST not in passed:
        return f"keras-hub's tests may not have built our class: {HUB_SWAP_TEST} did not pass"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(VENVS), choices=list(VENVS))
    parser.add_argument("--venv", action="append", default=[], metavar="BACKEND=DIR")
    parser.add_argument("--layer-tests-on-tensorflow", action="store_true")
    parser.add_argument("--junit-dir", type=pathlib.Path, help="keep each suite's junit here")
    parser.add_argument("--bench", action="store_true", help="run the benchmark instead")
    parser.add_argument(
        "--json", help="with --bench: write the results here (one file per backend)"
    )
    args = parser.parse_args(argv)
    venvs = {**VENVS, **dict(v.split("=", 1) for v in args.venv)}
    keep = args.junit_dir
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.TemporaryDirectory()
    junit_dir = keep or pathlib.Path(scratch.name)
    ok = True
    lines = []
    for backend in args.backends:
        suites = [
            ("keras suite", KERAS_SUITE),
            ("keras GQA suite", GQA_SUITE),
            ("keras-hub suite", KERAS_HUB_SUITE),
        ]
        if backend != "tensorflow" or args.layer_tests_on_tensorflow:
            suites.append(("layer tests", LAYER_TESTS))
        python, why = _python(backend, venvs)
        if python is None:
            ok &= not strict()
            if strict():
                why += " (a strict run needs every backend; KERAS_MHA_STRICT=0 skips it)"
            lines.append(f"{backend:<11} {'FAILED' if strict() else 'SKIPPED'}: {why}")
            print(lines[-1], flush=True)
            for name, _ in suites:
                _result(junit_dir, name, backend, ".txt").write_text(why + "\n")
            continue
        if args.bench:
            cmd = [str(python), "benchmarks/bench_attention.py", "--memory"]
            if args.json:
                stem = pathlib.Path(args.json)
                cmd += ["--json", str(stem.with_name(f"{stem.stem}_{backend}{stem.suffix}"))]
            env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
            ok &= subprocess.run(cmd, cwd=REPO, env=env).returncode == 0
            continue
        for name, files in suites:
            start = ("-m", "pytest")
            if name == "keras-hub suite" and backend != "tensorflow":
                start, why = _beside_tensorflow(python, venvs)
                if not start:
                    ok &= not strict()
                    lines.append(
                        f"{backend:<11} {name}: {'FAILED' if strict() else 'SKIPPED'}: {why}"
                    )
                    print(lines[-1], flush=True)
                    _result(junit_dir, name, backend, ".txt").write_text(why + "\n")
                    continue
            result, problem = run_pytest(backend, python, name, files, junit_dir, start)
            ok &= not problem
            found = "" if result is None else ", ".join(f"{n} {k}" for k, n in result.items())
            failed = f"  FAILED: {problem}" if problem else ""
            lines.append(f"{backend:<11} {name}: {found}{failed}")
            print(lines[-1], flush=True)
    scratch.cleanup()
    print("\n".join(["", "backends:"] + lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
