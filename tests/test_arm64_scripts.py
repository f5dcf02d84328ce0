"""The parts of `make test-arm64` that run without root or an emulated CPU.

The emulated run itself (.ci/arm64/test.sh) needs root and minutes; here:
the fake /proc/cpuinfo, the refusals that must come before anything is
mounted or built, the gate and tables of .ci/arm64/summary.py on
made-up results shaped like the measured ones, alone and through make
test-arm64's recipe (with the emulated run and the edge demo stood in for),
and the device's run of two tiny converted models (a dynamic sequence axis,
as the encoder's, and a fixed one), which gives the raw outputs compared.
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


def _test_sh(tmp_path, *args: str, cpus: str | None = None) -> subprocess.CompletedProcess:
    """.ci/arm64/test.sh OUT_DIR ARGS..., with its cache in tmp_path."""
    env = {"ARM64_CACHE": str(tmp_path / "cache")}
    if cpus is not None:
        env["ARM64_CPUS"] = cpus
    return _run("bash", str(ARM64 / "test.sh"), str(tmp_path / "out"), *args, env=env)


@pytest.mark.parametrize(
    "cpus, message",
    [("max", "QEMU_CPU=max"), ("", "ARM64_CPUS is empty"), ("cortex-a53", "no /proc/cpuinfo")],
)
def test_test_sh_refuses_a_cpu_before_touching_anything(tmp_path, cpus, message):
    bundles = (str(tmp_path),) * 4  # digits, text, encoder, reranker
    proc = _test_sh(tmp_path, *bundles, "a sentence", "a query", cpus=cpus)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "given, message",
    [
        (0, "usage: test.sh OUT_DIR DIGITS_BUNDLE TEXT_BUNDLE ENCODER_BUNDLE RERANKER_BUNDLE"),
        (3, "encoder bundle"),
        (4, "reranker bundle"),
        (5, "a sentence for --text"),
        (6, "a query for the encoder"),
    ],
)
def test_test_sh_refuses_fewer_than_seven_arguments(tmp_path, given, message):
    """OUT_DIR DIGITS_BUNDLE TEXT_BUNDLE ENCODER_BUNDLE RERANKER_BUNDLE "TEXT" "QUERY": each
    one is required."""
    args = [str(tmp_path / "out"), *[str(tmp_path)] * 4, "a sentence"]
    proc = _run("bash", str(ARM64 / "test.sh"), *args[:given], env={"ARM64_CPUS": "max"})
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert "QEMU_CPU=max" not in proc.stderr  # refused before the CPUs are looked at
    assert not (tmp_path / "out").exists()


def test_test_sh_refuses_an_encoder_bundle_without_a_manifest(tmp_path):
    for name in ("digits", "text", "encoder", "reranker"):
        (tmp_path / name).mkdir()
    for name in ("digits", "text", "reranker"):
        (tmp_path / name / "manifest.json").write_text("{}")
    bundles = [str(tmp_path / name) for name in ("digits", "text", "encoder", "reranker")]
    proc = _test_sh(tmp_path, *bundles, "a sentence", "a query")  # the default CPUs
    assert proc.returncode == 2, proc.stderr
    assert f"test-arm64: {bundles[2]} is not a bundle (no manifest.json)" in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


CPUS = ("cortex-a72", "cortex-a76")
MODES = {
    "digits": ("float32", "dynamic", "float16", "int8", "int16x8"),
    "text": ("float32", "dynamic", "float16", "int8", "int16x8"),  # int16x8: AEQ's
    "encoder": ("dynamic",),  # all-MiniLM-L6-v2: dynamic range only on ARM
    "reranker": ("float32", "dynamic", "float16", "int8"),  # a small cross-encoder
}
# Checks summary.py counts for two CPUs: the run status; per bundle, a report per machine
# and a parity check per machine and mode; the x86-64 raw file, one per CPU, and a raw
# check per CPU and mode: 1 + 12 reports + 45 parity + 4 x86-64 raw files + 8 CPU raw
# files + 30 raw checks = 100 (58 before the encoder, 69 before the reranker, 95
# before the pronouns' int16x8).
CHECKS = 1 + sum(3 * (1 + len(m)) + 1 + 2 + 2 * len(m) for m in MODES.values())
# A stand-in encoder's eval set: 389 corpus sentences (keras_mha.pretrained.corpus.split()),
# one 384-element unit vector each (make test-arm64's own bundle keeps 50: mk/arm64.mk).
SENTENCES, WIDTH = 389, 384
# The edge demo's figures for the dynamic encoder on x86-64 (docs/pretrained.md).
ENCODER_REPORT = {
    "passed": True,
    "skipped": False,
    "accuracy": None,
    "agreement": 0.982005,
    "max_abs_diff": 0.0213,
    "mean_abs_diff": 0.0019,
    "min_cosine": 0.992629,
    "mean_cosine": 0.998563,
    "top1": 0.982005,
    "top5": 1.0,
}


# The edge demo's figures for the reranker's modes on x86-64 (its int8 row, make test-arm64).
RERANKER_REPORT = {
    "passed": True,
    "skipped": False,
    "accuracy": None,
    "agreement": 0.8,
    "max_abs_diff": 0.084,
    "mean_abs_diff": 0.016,
    "top1": 0.8,
    "top5": 1.0,
}


def _reference(bundle: str, rng) -> dict[str, np.ndarray]:
    """x86-64 raw outputs: 360 samples, 10 classes; float, int8 (1/256) and int16 (1/32768).

    The encoder: 389 unit vectors of 384 float32 elements. The reranker: 600 pair scores
    (30 queries x 20 passages), float32, and int8 (1/256) in int8 mode."""
    if bundle == "reranker":
        scores = rng.uniform(0.05, 0.95, (600, 1))
        scores[::20] = 0.99  # each query's best passage, well ahead
        return {
            mode: np.clip(np.rint(scores * 256) - 128, -128, 127).astype(np.int8)
            if mode == "int8"
            else scores.astype(np.float32)
            for mode in MODES[bundle]
        }
    if bundle == "encoder":
        vectors = rng.standard_normal((SENTENCES, WIDTH))
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return {"dynamic": vectors.astype(np.float32)}
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
    """A CPU's raw outputs as make test-arm64 measured them (summary.py's RAW_BOUNDS comment).

    The encoder: every tenth sentence's vector (rows 0, 10, ..., 380: 39 of 389)
    moves by up to 5e-4 per element (cosine to x86-64's about 0.99998); the
    bound is the reports' own error against the float model (min cosine
    0.992629, max |Δ| 0.0213), which make test-arm64 met with 0.997020 and
    0.0131 on an Intel Xeon host.
    """
    arm = {mode: values.copy() for mode, values in raw.items()}
    if bundle == "reranker":  # a float score 7e-7 off, an int8 score one quantum
        for mode in ("float32", "dynamic", "float16"):
            arm[mode][5, 0] += np.float32(7e-7)
        arm["int8"][7, 0] += 1
        return arm
    if bundle == "encoder":
        noise = np.random.default_rng(1).uniform(-5e-4, 5e-4, arm["dynamic"][::10].shape)
        arm["dynamic"][::10] += noise.astype(np.float32)
        return arm
    for mode in ("float32", "dynamic", "float16"):
        arm[mode][5, 2] += np.float32(7e-7)
    if bundle == "digits":  # 7 of 3,600 values, up to 6 quanta, one top-1 flip
        arm["int8"][0, 1] += 6
        for row in range(10, 16):
            column = int(np.argmin(arm["int8"][row]))
            arm["int8"][row, column] += 1
    return arm


def _turned(row: np.ndarray, cosine: float) -> np.ndarray:
    """`row` turned to `cosine` with itself, its length kept, the turn spread over every element."""
    v = row.astype(np.float64)
    length = np.linalg.norm(v)
    v = v / length
    signs = np.where(np.arange(v.size) % 2 == 0, 1.0, -1.0)
    u = signs - (signs @ v) * v  # orthogonal to v
    u /= np.linalg.norm(u)
    return (length * (cosine * v + np.sqrt(1 - cosine**2) * u)).astype(np.float32)


def _write_results(out: pathlib.Path, edit=None) -> pathlib.Path:
    """A results folder like test-arm64's; `edit(machine, bundle, raw, report)` breaks it."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for bundle, modes in MODES.items():
        reference = _reference(bundle, rng)
        for machine in ("x86-64", *CPUS):
            raw = reference if machine == "x86-64" else _as_measured(bundle, reference)
            raw = {mode: values.copy() for mode, values in raw.items()}
            if bundle == "encoder":
                report = {"modes": {mode: dict(ENCODER_REPORT) for mode in modes}}
            elif bundle == "reranker":
                report = {"modes": {mode: dict(RERANKER_REPORT) for mode in modes}}
            else:
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


def test_summary_keeps_the_runs_time_for_make_tests_table(tmp_path):
    out = _write_results(tmp_path / "results")
    proc = _summary(out, "--seconds", "431")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["seconds"] == 431.0


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
    # The encoder: cosine figures in place of accuracy, and cosine in place of top-1.
    assert "**encoder**: min / mean cosine to the float model / top-5 neighbour agreement" in lines
    row = "| dynamic | " + " | ".join(["0.992629 / 0.998563 / 1.000 PASS"] * 3) + " |"
    assert row in lines
    cell = "14976 of 149376; max 0.0005; min cosine 0.999982"  # 39 vectors of 384 moved
    assert f"| dynamic | {cell} | {cell} |" in lines
    encoder_raw = proc.stdout.split("**encoder**: raw outputs")[1].split("**reranker**")[0]
    assert "top-1 same" not in encoder_raw
    # The reranker: its ranking figures, and "top-1" meaning a query's best of 20 passages.
    assert "**reranker**: top-1 / top-5 of the float model's ranking / max |Δscore|" in lines
    row = "| int8 | " + " | ".join(["0.800 / 1.000 / 0.084 PASS"] * 3) + " |"
    assert row in lines
    cell = "1 of 600; max 1 quanta; top-1 same 1.0000"
    assert f"| int8 | {cell} | {cell} |" in proc.stdout.split("**reranker**: raw outputs")[1]
    assert CHECKS == 100 and proc.stderr.strip() == "test-arm64: PASS: 100 of 100 checks passed"


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


def _mode_missing(machine, bundle, raw, report):  # on the CPU that runs float16 (float_cpu)
    if machine == "cortex-a76" and bundle == "text":
        del report["modes"]["float16"]
        del raw["float16"]


def _encoder_turned(machine, bundle, raw, report):  # cosine 0.99, every element within 0.0213
    if machine == "cortex-a76" and bundle == "encoder":
        raw["dynamic"][17] = _turned(raw["dynamic"][17], 0.99)  # elements up to ~0.009 off


def _encoder_past_the_float_error(machine, bundle, raw, report):  # one element 0.025 off
    if machine == "cortex-a72" and bundle == "encoder":
        raw["dynamic"][23, 5] += np.float32(0.025)


def _encoder_worse_report(machine, bundle, raw, report):  # a76 says it is closer to float...
    if machine == "cortex-a76" and bundle == "encoder":
        report["modes"]["dynamic"].update(min_cosine=0.99999, max_abs_diff=0.0002)
    if machine == "x86-64" and bundle == "encoder":  # ...and so does x86-64: the bound tightens
        report["modes"]["dynamic"].update(min_cosine=0.999995, max_abs_diff=0.0001)


def _encoder_nan(machine, bundle, raw, report):
    if machine == "cortex-a76" and bundle == "encoder":
        raw["dynamic"][3, 3] = np.nan


def _encoder_failed(machine, bundle, raw, report):  # below the manifest's min cosine 0.98
    if machine == "cortex-a72" and bundle == "encoder":
        report["modes"]["dynamic"].update(passed=False, min_cosine=0.9712)


def _encoder_missing(machine, bundle, raw, report):
    if machine == "cortex-a76" and bundle == "encoder":
        del report["modes"]["dynamic"]
        del raw["dynamic"]


def _encoder_padded(machine, bundle, raw, report):  # a vector per sentence, one too few
    if machine == "cortex-a72" and bundle == "encoder":
        raw["dynamic"] = raw["dynamic"][:-1]


def _reranker_flip(machine, bundle, raw, report):  # query 1's best passage changes on a76
    if machine == "cortex-a76" and bundle == "reranker":
        raw["int8"][23, 0] = 127  # passage 3 of query 1 above its best (0.99: 125)


def _reranker_reordered(machine, bundle, raw, report):  # 8 queries' best passages changed
    if machine == "cortex-a72" and bundle == "reranker":
        changed = 0
        for query in range(30):  # the best lowered below a runner-up within 20 quanta
            rows = raw["int8"][query * 20 : (query + 1) * 20, 0]
            if changed < 8 and rows[0] - rows[1:].max() < 20:
                rows[0] = rows[1:].max() - 1
                changed += 1
        assert changed == 8


def _reranker_dynamic_off(machine, bundle, raw, report):  # past the reports' own 0.084
    if machine == "cortex-a72" and bundle == "reranker":
        raw["dynamic"][11, 0] += np.float32(0.09)


def _reranker_float_off(machine, bundle, raw, report):  # a float mode keeps the float bound
    if machine == "cortex-a76" and bundle == "reranker":
        raw["float32"][12, 0] += np.float32(5e-6)


@pytest.mark.parametrize(
    "edit, failed, message",
    [
        (
            _reranker_flip,
            1,
            "reranker int8 on cortex-a76 vs x86-64: max |Δ| 188 quanta (at most 21.5 quanta, "
            "the worse machine's against the float model)\n",
        ),
        (
            _reranker_reordered,
            1,
            "reranker int8 on cortex-a72 vs x86-64: top-1 the same on 0.7333 (at least 0.8000, "
            "the worse machine's against the float model)\n",
        ),
        (
            _reranker_dynamic_off,
            1,
            "reranker dynamic on cortex-a72 vs x86-64: max |Δ| 0.09 (at most 0.084, the worse "
            "machine's against the float model)\n",
        ),
        (
            _reranker_float_off,
            1,
            "reranker float32 on cortex-a76 vs x86-64: max |Δ| 5.01e-06 (at most 4e-06)\n",
        ),
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
        (_mode_missing, 2, "text float16 on cortex-a76: not in the report"),
        # A trailing newline: the whole line, so nothing else (max |Δ|) failed with it.
        (
            _encoder_turned,
            1,
            "encoder dynamic on cortex-a76 vs x86-64: min cosine 0.990000 (at least 0.992629, "
            "the worse machine's against the float model)\n",
        ),
        (
            _encoder_past_the_float_error,
            1,
            "encoder dynamic on cortex-a72 vs x86-64: max |Δ| 0.025 (at most 0.0213, "
            "the worse machine's against the float model)\n",
        ),
        (
            _encoder_worse_report,
            1,
            "encoder dynamic on cortex-a76 vs x86-64: min cosine 0.999982 (at least 0.999990, "
            "the worse machine's against the float model); max |Δ| 0.0005 (at most 0.0002, ",
        ),
        (
            _encoder_nan,
            1,
            "encoder dynamic on cortex-a76 vs x86-64: min cosine nan (at least 0.992629, the "
            "worse machine's against the float model); max |Δ| inf (at most 0.0213, the worse "
            "machine's against the float model)\n",
        ),
        (_encoder_failed, 1, "encoder dynamic on cortex-a72: missed the manifest's thresholds"),
        (_encoder_missing, 2, "encoder dynamic on cortex-a76: not in the report"),
        (
            _encoder_padded,
            1,
            "encoder dynamic on cortex-a72 vs x86-64: raw output float32[388, 384], "
            "x86-64 float32[389, 384]\n",
        ),
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
    """1 % of the int8 values 24 quanta off with 3 top-1 flips, floats 4e-6 off: still a pass.

    The encoder: a vector at cosine 0.99263 to x86-64's and an element 0.0212 off, within
    the reports' own error against the float model (0.992629, 0.0213).
    """

    def at_the_bounds(machine, bundle, raw, report):
        if machine == "cortex-a72" and bundle == "text":
            raw["int8"][1:4, 1] += 3  # 3 top-1 flips
            for row in range(20, 53):  # and 33 more values: 36 of 3,600
                raw["int8"][row, int(np.argmin(raw["int8"][row]))] += 24
            raw["float32"][1, 1] += np.float32(3.9e-6)
            raw["dynamic"][2, 2] += np.float32(4.33e-6)  # as measured on an Intel Xeon host
        if machine == "cortex-a72" and bundle == "encoder":  # rows 31 and 42: x86-64's so far
            vectors = raw["dynamic"]
            vectors[31] = _turned(vectors[31], 0.99263)  # the reports' min cosine: 0.992629
            vectors[42, 7] += np.float32(0.0212)  # their max |Δ|: 0.0213

    out = _write_results(tmp_path / "results", at_the_bounds)
    proc = _summary(out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["failed"] == 0
    with (
        np.load(out / "x86-64-encoder-raw.npz") as x86,
        np.load(out / "cortex-a72-encoder-raw.npz") as arm,
    ):
        delta = np.abs(arm["dynamic"].astype(np.float64) - x86["dynamic"])
    assert 0.0211 < delta.max() <= 0.0213
    assert "min cosine 0.992630" in proc.stdout


def _float_modes_once(machine, bundle, raw, report):  # what test.sh now writes
    for mode, owner in (("float32", "cortex-a72"), ("float16", "cortex-a76")):
        if machine in CPUS and machine != owner and mode in report["modes"]:
            del report["modes"][mode]
            del raw[mode]


def test_each_float_mode_runs_on_one_cpu_and_every_integer_mode_on_each(tmp_path):
    """Float arithmetic is the same on both cores (within 4e-6 of x86-64), the integer
    kernels are not: test.sh runs float32 on the first CPU, float16 on the second, and
    the integer modes on both; the gate requires exactly that."""
    out = _write_results(tmp_path / "results", _float_modes_once)
    proc = _summary(out)
    assert proc.returncode == 0, proc.stderr
    float_runs = sum(m in ("float32", "float16") for modes in MODES.values() for m in modes)
    assert json.loads((out / "summary.json").read_text())["passed"] == CHECKS - 2 * float_runs
    lines = proc.stdout.splitlines()
    row = "| float16 | 0.9583 / 1.0000 / 0.01 PASS | on cortex-a76 | 0.9583 / 1.0000 / 0.01 PASS |"
    assert row in lines
    cell = "1 of 3600; max 7e-07; top-1 same 1.0000"
    assert f"| float32 | {cell} | on cortex-a72 |" in lines

    # the CPU a float mode is given must run it
    def also_missing(machine, bundle, raw, report):
        _float_modes_once(machine, bundle, raw, report)
        if machine == "cortex-a72" and bundle == "digits":
            del report["modes"]["float32"], raw["float32"]

    out = _write_results(tmp_path / "broken", also_missing)
    proc = _summary(out)
    assert proc.returncode == 1
    assert "digits float32 on cortex-a72: not in the report" in proc.stderr
    assert "digits float32 on cortex-a72: no raw outputs for the mode" in proc.stderr


def test_modes_for_names_what_each_cpu_runs(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    models = {m: {} for m in ("float32", "dynamic", "float16", "int8", "int16x8")}
    (bundle / "manifest.json").write_text(json.dumps({"models": models}))
    script = str(ARM64 / "summary.py")
    answers = {
        cpu: _run(sys.executable, script, "--modes-for", cpu, str(bundle), *CPUS).stdout.strip()
        for cpu in CPUS
    }
    assert answers == {
        "cortex-a72": "float32,dynamic,int8,int16x8",
        "cortex-a76": "dynamic,float16,int8,int16x8",
    }
    one = _run(sys.executable, script, "--modes-for", "cortex-a72", str(bundle), "cortex-a72")
    assert one.stdout.strip() == ",".join(models)  # one CPU runs everything
    assert _run(sys.executable, script, "--modes-for", "cortex-a72").returncode == 2


def test_summary_counts_a_failed_run_and_missing_files(tmp_path):
    out = _write_results(tmp_path / "results")
    for path in out.glob("cortex-a76-*"):
        path.unlink()  # test.sh failed on the second CPU: nothing of it was copied
    proc = _summary(out, "--run-status", "1")
    assert proc.returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    # The run status, a76's four reports and four raw files: 9 failed checks; the
    # per-mode checks a76 would have had are not counted.
    assert summary["failed"] == 9, proc.stderr
    assert summary["passed"] == CHECKS - 9 - 2 * sum(len(m) for m in MODES.values())
    assert "the runs exited 1" in proc.stderr
    assert "digits on cortex-a76: no raw outputs cortex-a76-digits-raw.npz" in proc.stderr
    assert "encoder on cortex-a76: no edge demo report cortex-a76-encoder.json" in proc.stderr
    assert "encoder on cortex-a76: no raw outputs cortex-a76-encoder-raw.npz" in proc.stderr
    assert "| float32 | 1.0000" not in proc.stdout and "missing" in proc.stdout


def test_summary_usage_is_exit_2(tmp_path):
    proc = _run(sys.executable, str(ARM64 / "summary.py"))
    assert proc.returncode == 2 and "usage" in proc.stderr


def _ids_model(length: int | None) -> bytes:
    """A LiteRT model of ids `[1, length]` (None: a dynamic sequence axis, as the encoder's)
    that outputs `[sum of the ids, the length it ran at, the last id]`."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, length], tf.int32)])
    def model(ids):
        x = tf.cast(ids, tf.float32)
        ran_at = tf.cast(tf.shape(ids)[1], tf.float32)
        return tf.concat(
            [tf.reduce_sum(x, 1, keepdims=True), tf.fill([1, 1], ran_at), x[:, -1:]], 1
        )

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [model.get_concrete_function()], model
    )
    return converter.convert()


@pytest.mark.slow  # converts two (tiny) models
def test_the_device_runs_a_dynamic_length_model_at_each_samples_own_length():
    """The raw outputs test.sh compares (the edge demo's --raw) come from
    `EdgeModel.run`: a dynamic sequence axis runs each sentence at its own
    length (the sentences grouped by length: one re-plan a length), a fixed one
    at the full width."""
    from edge_demo.runtimes.model import EdgeModel
    from edge_demo.runtimes.runtime import select_runtime

    runtime = select_runtime("litert")
    ids = np.array(
        [[5, 3, 9, 0, 0, 0], [7, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6], [0] * 6, [4, 0, 2, 0, 0, 0]],
        np.int32,
    )
    dynamic = EdgeModel(runtime, _ids_model(None), where="dynamic.tflite")
    fixed = EdgeModel(runtime, _ids_model(6), where="fixed.tflite")
    assert dynamic.dynamic_length and not fixed.dynamic_length
    # Each sentence without its trailing padding (an id 0 inside stays; an empty one
    # runs at length 1), as the device runs it; a fixed model at the full 6.
    replans, resize = [], dynamic._resize
    dynamic._resize = lambda n: (n != dynamic._length and replans.append(n), resize(n))
    raw, _ = dynamic.run(ids)  # int32 ids: the input tensor takes them as they are
    assert raw.dtype == np.float32
    assert raw.tolist() == [[17, 3, 9], [7, 1, 7], [21, 6, 6], [0, 1, 0], [6, 3, 2]]
    # grouped by length (lengths 3 1 6 1 3): one re-plan a length, outputs in ids' order
    assert replans == [1, 3, 6], replans
    raw, _ = fixed.run(fixed.prepare(ids))
    assert raw.tolist() == [[17, 6, 0], [7, 6, 0], [21, 6, 6], [0, 6, 0], [6, 6, 0]]


# --- make test-arm64's recipe, with the emulated run and the edge demo stood in for -------

_FAKE_EDGE_PY = """#!/bin/sh
# The edge venv's python: the edge demo does nothing (the stand-in test.sh writes
# every result); summary.py runs for real.
case "$1" in
    -m) exit 0 ;;
esac
exec {python} "$@"
"""
_FAKE_TEST_SH = """#!/bin/sh
# Stands in for .ci/arm64/test.sh: keeps its arguments (one a line), refuses any number
# but test.sh's seven, copies made-up results into OUT_DIR, exits as told.
printf '%s\\n' "$@" >"$FAKE_ARGS"
[ $# -eq 7 ] || {{ echo "fake test.sh: $# arguments, not 7" >&2; exit 2; }}
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
        work / "encoder" / "bundle" / "manifest.json",
        work / "reranker" / "bundle" / "manifest.json",
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
    env = {
        **os.environ,
        "FAKE_RESULTS": str(results),
        "FAKE_STATUS": str(status),
        "FAKE_ARGS": str(tmp_path / "test-sh-args.txt"),
    }
    # As root, the real test.sh installs packages and mounts: run only what the stand-ins cover
    # (and nothing that trains, imports or exports a model).
    dry = subprocess.run([*command, "-n"], cwd=REPO, env=env, capture_output=True, text=True)
    assert dry.returncode == 0 and str(fake_test) in dry.stdout, dry.stdout + dry.stderr
    for never in (
        ".ci/arm64/test.sh",
        "keras_mha.train",
        "keras_mha.pretrained",
        "keras_mha_export",
    ):
        assert never not in dry.stdout, dry.stdout
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def test_make_test_arm64_passes_and_writes_summary_json(tmp_path):
    results = _write_results(tmp_path / "made_up")
    proc = _make_test_arm64(tmp_path, results)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / "work" / "results"
    counts = json.loads((out / "summary.json").read_text())
    assert counts.pop("seconds") >= 0  # the recipe's time, for make test's table
    assert counts == {"suite": "arm64", "passed": CHECKS, "failed": 0, "skipped": 0}
    tables = (out / "tables.md").read_text()
    assert "| int8 | 7 of 3600; max 6 quanta" in tables
    assert "| dynamic | 14976 of 149376; max 0.0005; min cosine 0.999982 | " in tables
    # test.sh got its seven arguments: the results, the four bundles, the sentence, the query.
    work = tmp_path / "work"
    assert (tmp_path / "test-sh-args.txt").read_text().splitlines() == [
        str(out),
        str(work / "digits" / "bundle"),
        str(work / "pronouns" / "bundle"),
        str(work / "encoder" / "bundle"),
        str(work / "reranker" / "bundle"),
        "the model didn't work with the laptop because it was too complex",
        "Will it rain in the hills tomorrow?",
    ]


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
