"""The parts of `make test-arm64` that run without root or an emulated CPU.

The emulated run itself (.ci/arm64/test.sh) needs root and minutes; here:
the fake /proc/cpuinfo, the refusals that must come before anything is
mounted or built, and the gate and tables of .ci/arm64/summary.py on
made-up results shaped like the measured ones, alone and through make
test-arm64's recipe (with the emulated run and the edge demo stood in for).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from environment import missing

REPO = pathlib.Path(__file__).resolve().parents[1]
ARM64 = REPO / ".ci" / "arm64"


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args), capture_output=True, text=True, check=False, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize(
    "cpu, part, feature", [("cortex-a72", "0xd08", "crc32"), ("cortex-a76", "0xd0b", "asimddp")]
)
def test_cpuinfo_describes_four_cores_of_the_pi(cpu, part, feature):
    proc = _run("bash", str(ARM64 / "cpuinfo.sh"), cpu)
    assert proc.returncode == 0, proc.stderr
    blocks = [b for b in proc.stdout.split("\n\n") if b.startswith("processor")]
    assert len(blocks) == 4
    for block in blocks:
        fields = dict(line.split(":", 1) for line in block.splitlines())
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        assert fields["CPU implementer"] == "0x41" and fields["CPU part"] == part
        assert feature in fields["Features"].split()
    # No SVE/SME: the point of not emulating qemu's "max" CPU.
    assert "sve" not in proc.stdout and "sme" not in proc.stdout


def test_cpuinfo_refuses_an_unknown_core():
    proc = _run("bash", str(ARM64 / "cpuinfo.sh"), "cortex-a53")
    assert proc.returncode == 2 and "cortex-a53" in proc.stderr


@pytest.mark.parametrize(
    "cpus, message",
    [("max", "QEMU_CPU=max"), ("", "ARM64_CPUS is empty"), ("cortex-a53", "no /proc/cpuinfo")],
)
def test_test_sh_refuses_a_cpu_before_touching_anything(tmp_path, cpus, message):
    proc = _run(
        "bash",
        str(ARM64 / "test.sh"),
        str(tmp_path / "out"),
        str(tmp_path),
        str(tmp_path),
        "a sentence",
        env={"ARM64_CPUS": cpus, "ARM64_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


CPUS = ("cortex-a72", "cortex-a76")
MODES = {
    "digits": ("float32", "dynamic", "float16", "int8", "int16x8"),
    "text": ("float32", "dynamic", "float16", "int8"),
}
# Checks summary.py counts for two CPUs: the run status; per bundle, a report per machine
# and a parity check per machine and mode; the x86-64 raw file, one per CPU, and a raw
# check per CPU and mode.
CHECKS = 1 + sum(3 * (1 + len(m)) + 1 + 2 + 2 * len(m) for m in MODES.values())


def _reference(bundle: str, rng) -> dict[str, np.ndarray]:
    """x86-64 raw outputs: 360 samples, 10 classes; float, int8 (1/256) and int16 (1/32768)."""
    probs = rng.dirichlet(np.full(10, 0.3), 360)
    raw = {}
    for mode in MODES[bundle]:
        if mode == "int8":
            raw[mode] = np.clip(np.rint(probs * 256) - 128, -128, 127).astype(np.int8)
            raw[mode][:10] = -128
            raw[mode][:10, :2] = (100, 98)  # near ties, for top-1 flips
        elif mode == "int16x8":
            raw[mode] = np.clip(np.rint(probs * 32768), 0, 32767).astype(np.int16)
        else:
            raw[mode] = probs.astype(np.float32)
    return raw


def _as_measured(bundle: str, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A CPU's raw outputs as make test-arm64 measured them (summary.py's RAW_BOUNDS comment)."""
    arm = {mode: values.copy() for mode, values in raw.items()}
    for mode in ("float32", "dynamic", "float16"):
        arm[mode][5, 2] += np.float32(7e-7)
    if bundle == "digits":  # 7 of 3,600 values, up to 6 quanta, one top-1 flip
        arm["int8"][0, 1] += 6
        for row in range(10, 16):
            column = int(np.argmin(arm["int8"][row]))
            arm["int8"][row, column] += 1
    return arm


def _write_results(out: pathlib.Path, edit=None) -> pathlib.Path:
    """A results folder like test-arm64's; `edit(machine, bundle, raw, report)` breaks it."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for bundle, modes in MODES.items():
        reference = _reference(bundle, rng)
        for machine in ("x86-64", *CPUS):
            raw = reference if machine == "x86-64" else _as_measured(bundle, reference)
            raw = {mode: values.copy() for mode, values in raw.items()}
            report = {
                "modes": {
                    mode: {
                        "passed": True,
                        "skipped": False,
                        "accuracy": 0.9583,
                        "agreement": 1.0,
                        "max_abs_diff": 0.01,
                    }
                    for mode in modes
                }
            }
            if edit is not None:
                edit(machine, bundle, raw, report)
            np.savez(out / f"{machine}-{bundle}-raw.npz", **raw)
            (out / f"{machine}-{bundle}.json").write_text(json.dumps(report))
    return out


def _summary(out: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    return _run(
        sys.executable,
        str(ARM64 / "summary.py"),
        str(out),
        *CPUS,
        "--tables",
        str(out / "tables.md"),
        "--json",
        str(out / "summary.json"),
        *extra,
    )


def test_summary_passes_the_measured_figures_and_writes_tables_and_json(tmp_path):
    out = _write_results(tmp_path / "results")
    proc = _summary(out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text()) == {
        "suite": "arm64",
        "passed": CHECKS,
        "failed": 0,
        "skipped": 0,
    }
    assert (out / "tables.md").read_text() == proc.stdout
    lines = proc.stdout.splitlines()
    cell = "7 of 3600; max 6 quanta; top-1 same 0.9972"
    assert f"| int8 | {cell} | {cell} |" in lines
    assert "| int16x8 | 0 of 3600; max 0 quanta; top-1 same 1.0000 | " in proc.stdout
    assert "| float32 | 1 of 3600; max 7e-07; top-1 same 1.0000 | " in proc.stdout
    row = "| int8 | " + " | ".join(["0.9583 / 1.0000 / 0.01 PASS"] * 3) + " |"
    assert row in lines
    assert proc.stderr.strip() == f"test-arm64: PASS: {CHECKS} of {CHECKS} checks passed"


def _int16_one_quantum(machine, bundle, raw, report):
    if machine == "cortex-a72" and bundle == "digits":
        raw["int16x8"][3, 4] += 1


def _float_5e_6(machine, bundle, raw, report):
    if machine == "cortex-a76" and bundle == "text":
        raw["float16"][9, 9] += np.float32(5e-6)


def _dynamic_past_a_quantum(machine, bundle, raw, report):  # 1/256 + a little: a quantized mode
    if machine == "cortex-a72" and bundle == "digits":
        raw["dynamic"][9, 9] += np.float32(0.0045)


def _int8_share(machine, bundle, raw, report):  # 37 of 3,600 values: over 1 %
    if machine == "cortex-a72" and bundle == "text":
        rows = np.arange(100, 137)
        raw["int8"][rows, np.argmin(raw["int8"][rows], axis=-1)] += 1


def _int8_quanta(machine, bundle, raw, report):  # 25 quanta
    if machine == "cortex-a72" and bundle == "text":
        raw["int8"][7, int(np.argmin(raw["int8"][7]))] += 25


def _int8_flips(machine, bundle, raw, report):  # 4 top-1 flips of 360, 3 quanta each
    if machine == "cortex-a76" and bundle == "text":
        raw["int8"][1:5, 1] += 3


def _int8_nan(machine, bundle, raw, report):
    if machine == "cortex-a76" and bundle == "digits":
        raw["float16"][0, 0] = np.nan


def _mode_failed(machine, bundle, raw, report):
    if machine == "cortex-a76" and bundle == "digits":
        report["modes"]["int8"]["passed"] = False


def _mode_skipped(machine, bundle, raw, report):
    if machine == "cortex-a72" and bundle == "digits":
        report["modes"]["int16x8"].update(passed=None, skipped=True, reason="no kernel")


def _mode_missing(machine, bundle, raw, report):
    if machine == "cortex-a72" and bundle == "text":
        del report["modes"]["float16"]
        del raw["float16"]


@pytest.mark.parametrize(
    "edit, failed, message",
    [
        (_int16_one_quantum, 1, "digits int16x8 on cortex-a72 vs x86-64: 0.03% of values differ"),
        (_float_5e_6, 1, "text float16 on cortex-a76 vs x86-64: max |Δ| 5.01e-06 (at most 4e-06)"),
        (
            _dynamic_past_a_quantum,
            1,
            "digits dynamic on cortex-a72 vs x86-64: max |Δ| 0.0045 (at most 0.00390625)",
        ),
        (
            _int8_share,
            1,
            "text int8 on cortex-a72 vs x86-64: 1.03% of values differ (at most 1.00%)",
        ),
        (
            _int8_quanta,
            1,
            "text int8 on cortex-a72 vs x86-64: max |Δ| 25 quanta (at most 24 quanta)",
        ),
        (_int8_flips, 1, "text int8 on cortex-a76 vs x86-64: top-1 the same on 0.9889"),
        (_int8_nan, 1, "digits float16 on cortex-a76 vs x86-64: max |Δ| inf"),
        (_mode_failed, 1, "digits int8 on cortex-a76: missed the manifest's thresholds"),
        (_mode_skipped, 1, "digits int16x8 on cortex-a72: skipped (no kernel)"),
        (_mode_missing, 2, "text float16 on cortex-a72: not in the report"),
    ],
)
def test_summary_fails_beyond_a_bound(tmp_path, edit, failed, message):
    out = _write_results(tmp_path / "results", edit)
    proc = _summary(out)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == failed and summary["skipped"] == 0, (summary, proc.stderr)
    assert summary["passed"] + failed == CHECKS
    assert f"test-arm64: FAIL: {message}" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("test-arm64: FAIL: ")


def test_summary_passes_at_the_bounds(tmp_path):
    """1 % of the int8 values 24 quanta off with 3 top-1 flips, floats 4e-6 off: still a pass."""

    def at_the_bounds(machine, bundle, raw, report):
        if machine == "cortex-a72" and bundle == "text":
            raw["int8"][1:4, 1] += 3  # 3 top-1 flips
            for row in range(20, 53):  # and 33 more values: 36 of 3,600
                raw["int8"][row, int(np.argmin(raw["int8"][row]))] += 24
            raw["float32"][1, 1] += np.float32(3.9e-6)
            raw["dynamic"][2, 2] += np.float32(4.33e-6)  # as measured on an Intel Xeon host

    out = _write_results(tmp_path / "results", at_the_bounds)
    proc = _summary(out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["failed"] == 0


def test_summary_counts_a_failed_run_and_missing_files(tmp_path):
    out = _write_results(tmp_path / "results")
    for path in out.glob("cortex-a76-*"):
        path.unlink()  # test.sh failed on the second CPU: nothing of it was copied
    proc = _summary(out, "--run-status", "1")
    assert proc.returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    # The run status, a76's two reports and two raw files: 5 failed checks; the
    # per-mode checks a76 would have had are not counted.
    assert summary["failed"] == 5, proc.stderr
    assert summary["passed"] == CHECKS - 5 - 2 * (len(MODES["digits"]) + len(MODES["text"]))
    assert "the runs exited 1" in proc.stderr
    assert "digits on cortex-a76: no raw outputs cortex-a76-digits-raw.npz" in proc.stderr
    assert "| float32 | 1.0000" not in proc.stdout and "missing" in proc.stdout


def test_summary_usage_is_exit_2(tmp_path):
    proc = _run(sys.executable, str(ARM64 / "summary.py"))
    assert proc.returncode == 2 and "usage" in proc.stderr


# --- make test-arm64's recipe, with the emulated run and the edge demo stood in for -------

_FAKE_EDGE_PY = """#!/bin/sh
# The edge venv's python: the edge demo and raw_outputs.py do nothing (the stand-in
# test.sh writes every result); summary.py runs for real.
case "$1" in
    -m|*raw_outputs.py) exit 0 ;;
esac
exec {python} "$@"
"""
_FAKE_TEST_SH = """#!/bin/sh
# Stands in for .ci/arm64/test.sh: copies made-up results into OUT_DIR, exits as told.
cp "$FAKE_RESULTS"/* "$1"/
exit "${{FAKE_STATUS:-0}}"
"""


def _make_test_arm64(tmp_path, results: pathlib.Path, status: int = 0):
    if os.geteuid() != 0:
        missing("root (make test-arm64's recipe refuses to start without it)")
    if shutil.which("make") is None:
        missing("GNU make")
    work, venv, edge = tmp_path / "work", tmp_path / "venv", tmp_path / "edge"
    for path in (
        venv / ".installed",
        edge / ".installed",
        work / "digits" / "bundle" / "manifest.json",
        work / "pronouns" / "bundle" / "manifest.json",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    fake_python, fake_test = tmp_path / "python", tmp_path / "test.sh"
    fake_python.write_text(_FAKE_EDGE_PY.format(python=sys.executable))
    fake_test.write_text(_FAKE_TEST_SH.format())
    for path in (fake_python, fake_test):
        path.chmod(0o755)
    command = [
        "make", "--no-print-directory", "-f", "mk/arm64.mk", "test-arm64",
        f"VENV={venv}", f"EDGE_VENV={edge}", f"PY={sys.executable}", f"EDGE_PY={fake_python}",
        f"ARM64_WORK={work}", f"ARM64_TEST_SH={fake_test}", f"ARM64_CPUS={' '.join(CPUS)}",
    ]  # fmt: skip
    env = {**os.environ, "FAKE_RESULTS": str(results), "FAKE_STATUS": str(status)}
    # As root, the real test.sh installs packages and mounts: run only what the stand-ins cover.
    dry = subprocess.run([*command, "-n"], cwd=REPO, env=env, capture_output=True, text=True)
    assert dry.returncode == 0 and str(fake_test) in dry.stdout, dry.stdout + dry.stderr
    assert ".ci/arm64/test.sh" not in dry.stdout and "keras_mha.train" not in dry.stdout, dry.stdout
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def test_make_test_arm64_passes_and_writes_summary_json(tmp_path):
    results = _write_results(tmp_path / "made_up")
    proc = _make_test_arm64(tmp_path, results)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / "work" / "results"
    assert json.loads((out / "summary.json").read_text()) == {
        "suite": "arm64",
        "passed": CHECKS,
        "failed": 0,
        "skipped": 0,
    }
    assert "| int8 | 7 of 3600; max 6 quanta" in (out / "tables.md").read_text()


def test_make_test_arm64_fails_when_a_raw_output_gate_fails(tmp_path):
    """The gate's exit status reaches make (it was piped through tee, which hid it)."""
    results = _write_results(tmp_path / "made_up", _int16_one_quantum)
    proc = _make_test_arm64(tmp_path, results)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "test-arm64: FAIL: digits int16x8 on cortex-a72" in proc.stderr
    summary = json.loads((tmp_path / "work" / "results" / "summary.json").read_text())
    assert summary["failed"] == 1 and summary["passed"] == CHECKS - 1


def test_make_test_arm64_fails_when_the_emulated_run_fails_and_still_writes_json(tmp_path):
    results = _write_results(tmp_path / "made_up")
    proc = _make_test_arm64(tmp_path, results, status=1)
    assert proc.returncode != 0, proc.stdout[-2000:]
    summary = json.loads((tmp_path / "work" / "results" / "summary.json").read_text())
    assert summary["failed"] == 1 and summary["passed"] == CHECKS - 1
