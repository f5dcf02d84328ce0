"""End-to-end fuzz campaign: mutated bundles and command lines through `python -m edge_demo`.

    python tests/fuzz/campaign.py --bundle DIR -n 1000 [--python .venv-edge/bin/python]
    python tests/fuzz/campaign.py --build -n 1000          # exports a fixture first (TF venv)

Each case copies the fixture bundle, applies one random recipe
(tests/fuzz/mutations.py: JSON field values, raw JSON, byte flips,
truncation, TFLite flatbuffer fields, hostile npz members; checksums
updated) and one argument set, runs the app in a child under a timeout and
an address-space limit, and classifies the outcome:

    ok-0 / fail-1 / usage-2   exits as designed (2: one line naming the file)
    exit-3                    an internal error for bad input       (a finding)
    signal                    killed by a signal (SIGSEGV, ...)     (a finding)
    timeout                   no answer within --timeout s          (a finding)
    traceback                 "Traceback" on stderr                 (a finding)
    multi-line                an error of more than one line        (a finding)
    corrupt-passed            exit 0 with a mutated model's mode skipped because
                              the runtime refused it, not because the
                              manifest says this runtime cannot run it (a finding)
    memory                    peak RSS over --memory-mb             (a finding)

Findings are written to tests/fuzz/regressions/ as JSON recipes (replayed
by tests/fuzz/test_fuzz_regressions.py). Prints the counts and writes them
as JSON (`--report`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from mutations import ARGUMENT_SETS, HOSTILE_ARGUMENTS, apply, random_recipe  # noqa: E402

FINDINGS = ("exit-3", "signal", "timeout", "traceback", "multi-line", "corrupt-passed", "memory")
PROG = "keras-mha-edge"


def build_fixture(out: pathlib.Path) -> pathlib.Path:
    """A small text bundle (float32, int8) from an untrained token model (needs TF)."""
    sys.path.insert(0, str(REPO / "tests"))
    from edge_bundle import export_command, make_text_run

    run = make_text_run(out / "run")
    proc = export_command(run, out / "bundle", "float32,int8")
    if proc.returncode != 0:
        raise SystemExit(f"export failed: {proc.stderr[-2000:]}")
    return out / "bundle"


INHERITED_SLACK_MB = 32


def _limit(memory_mb: int):
    def apply_limits():
        os.setsid()
        limit = memory_mb * 4 * 1024 * 1024  # address space: runtimes map far more than they touch
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply_limits


def _rss_mb() -> float:
    """This process's resident memory now (VmRSS), in MB; 0 where /proc has none."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_case(python, bundle, args, timeout, memory_mb, root=REPO) -> dict:
    """Run the app once; the outcome's exit, signal, output and peak RSS (wait4's).

    A child's peak RSS counts the image it was forked from: Linux keeps the
    pre-exec high-water mark (a copy of this process) in the child's. So
    `inherited_mb`, this process's RSS as it forks, is a floor below which
    wait4's figure says nothing of the app (`classify`). A pytest worker that
    has grown past the limit (models loaded in earlier tests) would otherwise
    make every case a memory finding."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("KERAS_MHA_DEBUG", None)
    inherited = _rss_mb()
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [str(python), "-m", "edge_demo", str(bundle), *args],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=_limit(memory_mb),
        )
        timed_out = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                timed_out = True
                os.killpg(proc.pid, 9)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {
        "code": proc.returncode,
        "timeout": timed_out,
        "stdout": stdout.decode("utf-8", "replace"),
        "stderr": stderr.decode("utf-8", "replace"),
        "seconds": round(time.monotonic() - start, 2),
        "maxrss_mb": usage.ru_maxrss / 1024,  # this case's process tree's largest
        "inherited_mb": inherited,
    }


def classify(outcome: dict, recipe: dict, memory_mb: int, peak_before: float) -> str:
    stderr_lines = [ln for ln in outcome["stderr"].splitlines() if ln.strip()]
    if outcome["timeout"]:
        return "timeout"
    if outcome["code"] < 0:
        return "signal"
    if "Traceback" in outcome["stderr"]:
        return "traceback"
    # what the fork carried over (run_case), with room for the pages it touches before exec
    inherited = outcome.get("inherited_mb", 0.0) + INHERITED_SLACK_MB
    if outcome["maxrss_mb"] > max(memory_mb, peak_before, inherited):
        return "memory"
    if outcome["code"] == 3:
        return "exit-3"
    if outcome["code"] == 2 and (
        len(stderr_lines) != 1 or not stderr_lines[0].startswith(f"{PROG}: error: ")
    ):
        return "multi-line"
    if outcome["code"] == 0 and recipe["kind"] == "tflite" and probe_skips(outcome["stdout"]):
        return "corrupt-passed"
    return {0: "ok-0", 1: "fail-1", 2: "usage-2", 130: "interrupted"}.get(
        outcome["code"], f"exit-{outcome['code']}"
    )


def probe_skips(stdout: str) -> list[str]:
    """The modes skipped because the runtime refused the model. A mode the manifest
    says this runtime cannot run (tflite-runtime: dynamic range, a text model's
    int8) is skipped unread, as designed; only a refused model can hide a
    corrupted one behind exit 0."""
    found = []
    for line in stdout.splitlines():
        mode, sep, reason = line.partition(": skipped: ")
        if sep and not reason.startswith("manifest.json says "):
            found.append(mode.strip())
    return found


def names_file(outcome: dict, recipe: dict) -> bool | None:
    """For a usage error from a mutated file: does the line name that file (or a manifest field)?"""
    if outcome["code"] != 2:
        return None
    line = outcome["stderr"]
    return recipe.get("file", "manifest.json") in line or "manifest.json" in line


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (Linux), else the platform's word."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=100, help="cases (default 100)")
    parser.add_argument("--bundle", type=pathlib.Path, help="the fixture bundle")
    parser.add_argument("--build", action="store_true", help="export a fixture bundle first")
    parser.add_argument("--python", default=str(REPO / ".venv-edge" / "bin" / "python"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--report", type=pathlib.Path)
    parser.add_argument(
        "--app-root", type=pathlib.Path, default=REPO, help="directory holding edge_demo/"
    )
    parser.add_argument("--save", action="store_true", help="write findings to regressions/")
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="edge-fuzz-"))
    try:
        fixture = args.bundle or (build_fixture(work / "fixture") if args.build else None)
        if fixture is None:
            parser.error("give --bundle DIR or --build")
        rng = random.Random(args.seed)
        counts: collections.Counter = collections.Counter()
        named = collections.Counter()
        peak = 0.0
        findings = []
        for i in range(args.n):
            case = work / f"case{i}"
            bundle = case / "bundle"
            shutil.copytree(fixture, bundle)
            if rng.random() < 0.1:
                recipe = {"kind": "none"}
                argset = rng.choice(HOSTILE_ARGUMENTS)
            else:
                recipe = random_recipe(fixture, rng)
                argset = rng.choice(ARGUMENT_SETS)
                try:
                    apply(bundle, recipe)
                except (ValueError, KeyError, IndexError, TypeError, OSError) as exc:
                    counts["recipe-not-applicable"] += 1
                    print(f"{i}: recipe not applicable ({exc})", flush=True)
                    shutil.rmtree(case, ignore_errors=True)
                    continue
            argv_case = [a.format(tmp=case, bundle=bundle) for a in argset]
            outcome = run_case(
                args.python, bundle, argv_case, args.timeout, args.memory_mb, args.app_root
            )
            label = classify(outcome, recipe, args.memory_mb, 0.0)
            peak = max(peak, outcome["maxrss_mb"])
            counts[label] += 1
            naming = names_file(outcome, recipe)
            if naming is not None:
                named["names-file" if naming else "does-not-name-file"] += 1
                if not naming and recipe["kind"] != "none":
                    print(f"{i}: unnamed: {recipe.get('file')}: {outcome['stderr'].strip()[:300]}")
            if label in FINDINGS:
                finding = {"recipe": recipe, "args": argset, "found": label,
                           "stderr": outcome["stderr"][-600:]}  # fmt: skip
                findings.append(finding)
                print(f"{i}: {label}: {json.dumps(finding)[:600]}", flush=True)
            elif i % 50 == 0:
                print(f"{i}: {label} ({outcome['seconds']} s) {dict(counts)}", flush=True)
            shutil.rmtree(case, ignore_errors=True)
        report = {
            "cases": args.n,
            "seed": args.seed,
            "counts": dict(counts),
            "error_lines": dict(named),
            "findings": sum(counts[f] for f in FINDINGS),
            "peak_rss_mb": round(peak, 1),
            "machine": f"{platform.machine()} {cpu_name()}, {os.cpu_count()} cores",
            "python": args.python,
        }
        print(json.dumps(report, indent=1))
        if args.report:
            args.report.write_text(json.dumps(report, indent=1) + "\n")
        if args.save:
            for k, finding in enumerate(findings):
                path = HERE / "regressions" / f"campaign-{args.seed}-{k}.json"
                path.write_text(
                    json.dumps({k: finding[k] for k in ("recipe", "args", "found")}) + "\n"
                )
        return 1 if report["findings"] else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
