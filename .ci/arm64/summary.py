"""Tables for the README from a test-arm64 results folder: parity per machine, raw outputs vs x86-64.

usage: python3 summary.py OUT_DIR [CPU ...]   (numpy only; prints Markdown)

OUT_DIR holds, per machine M (x86-64 and each CPU) and bundle B (digits,
text): M-B.json (the edge demo's --json report) and M-B-raw.npz
(raw_outputs.py). Raw outputs are compared value by value with x86-64's:
integer modes in quanta, float modes in absolute difference. Informational:
the gate is the edge demo's exit code (test.sh).
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

BUNDLES = ("digits", "text")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _head(title: str, columns: list[str]) -> list[str]:
    return [
        title,
        "",
        "| mode | " + " | ".join(columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]


def parity(out: pathlib.Path, machines: list[str], bundle: str) -> list[str]:
    title = f"**{bundle}**: accuracy / top-1 agreement with the float model / max |Δprob|"
    lines = _head(title, machines)
    reports = {m: json.loads((out / f"{m}-{bundle}.json").read_text()) for m in machines}
    for mode in reports[machines[0]]["modes"]:
        cells = []
        for m in machines:
            r = reports[m]["modes"].get(mode, {})
            if r.get("skipped"):
                cells.append("skipped")
                continue
            verdict = "PASS" if r.get("passed") else "FAIL"
            cells.append(
                f"{_fmt(r.get('accuracy'), '.4f')} / {_fmt(r.get('agreement'), '.4f')} / "
                f"{_fmt(r.get('max_abs_diff'), '.2g')} {verdict}"
            )
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines


def raw_diff(out: pathlib.Path, cpus: list[str], bundle: str) -> list[str]:
    title = f"**{bundle}**: raw outputs vs x86-64 (values that differ, of all; largest difference)"
    lines = _head(title, cpus)
    with np.load(out / f"x86-64-{bundle}-raw.npz") as npz:
        ref = {k: npz[k] for k in npz.files}
    other = {}
    for cpu in cpus:
        with np.load(out / f"{cpu}-{bundle}-raw.npz") as npz:
            other[cpu] = {k: npz[k] for k in npz.files}
    for mode, want in ref.items():
        cells = []
        for cpu in cpus:
            got = other[cpu][mode]
            delta = np.abs(got.astype(np.float64) - want.astype(np.float64))
            unit = " quanta" if want.dtype.kind in "iu" else ""
            top = (got.argmax(-1) == want.argmax(-1)).mean()
            cells.append(
                f"{int((delta > 0).sum())} of {delta.size}; max {delta.max():.3g}{unit}; top-1 same {top:.4f}"
            )
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: summary.py OUT_DIR [CPU ...]", file=sys.stderr)
        return 2
    out = pathlib.Path(argv[0])
    cpus = argv[1:] or ["cortex-a72", "cortex-a76"]
    blocks = []
    for bundle in BUNDLES:
        blocks += parity(out, ["x86-64", *cpus], bundle) + [""]
    for bundle in BUNDLES:
        blocks += raw_diff(out, cpus, bundle) + [""]
    print("\n".join(blocks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
