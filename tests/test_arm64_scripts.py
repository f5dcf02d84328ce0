"""The parts of `make test-arm64` that run without root or an emulated CPU.

The emulated run itself (.ci/arm64/test.sh) needs root and minutes; here:
the fake /proc/cpuinfo, the refusals that must come before anything is
mounted or built, and the summary tables on made-up results.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ARM64 = pathlib.Path(__file__).resolve().parents[1] / ".ci" / "arm64"


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


def test_summary_counts_raw_differences_in_quanta(tmp_path):
    raw = {"int8": np.zeros((4, 5), np.int8), "float32": np.zeros((4, 5), np.float32)}
    off = {"int8": raw["int8"].copy(), "float32": raw["float32"].copy()}
    off["int8"][2, 3] = 1  # one value one quantum off
    report = {
        "modes": {
            "float32": {"passed": True, "accuracy": 0.5, "agreement": 1.0, "max_abs_diff": 1e-7},
            "int8": {"passed": True, "accuracy": 0.5, "agreement": 1.0, "max_abs_diff": 0.01},
        }
    }
    for machine, arrays in (("x86-64", raw), ("cortex-a72", off)):
        for bundle in ("digits", "text"):
            np.savez(tmp_path / f"{machine}-{bundle}-raw.npz", **arrays)
            (tmp_path / f"{machine}-{bundle}.json").write_text(json.dumps(report))
    proc = _run(sys.executable, str(ARM64 / "summary.py"), str(tmp_path), "cortex-a72")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "| int8 | 1 of 20; max 1 quanta; top-1 same 0.7500 |" in lines
    assert "| float32 | 0 of 20; max 0; top-1 same 1.0000 |" in lines
    assert "| int8 | 0.5000 / 1.0000 / 0.01 PASS | 0.5000 / 1.0000 / 0.01 PASS |" in lines
