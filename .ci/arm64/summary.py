"""The gate and the README tables of a test-arm64 results folder.

usage: python3 summary.py OUT_DIR [CPU ...] [--run-status N] [--seconds S] [--tables FILE]
                          [--json FILE]
       python3 summary.py --modes-for CPU BUNDLE CPU [CPU ...]   (the modes CPU runs)
(numpy only; prints Markdown tables, then one line per failed check on stderr)

OUT_DIR holds, per machine M (x86-64 and each CPU) and bundle B (digits,
text, encoder: all-MiniLM-L6-v2 in dynamic-range mode, reranker: a small
cross-encoder, reranker.py): M-B.json (the edge demo's --json report) and M-B-raw.npz
(the edge demo's --raw, from the same invocations). The checks, each counted once:

- `--run-status N`: the exit status of the runs that filled OUT_DIR
  (x86-64 references and test.sh); anything but 0 is a failed check.
- parity, per machine, bundle and mode: the edge demo's report says the
  mode ran and met the manifest's thresholds (and every CPU ran the modes
  x86-64 ran, but a float mode, which runs on one CPU: `float_cpu`).
- raw outputs, per CPU, bundle and mode, value by value against x86-64
  (`RAW_BOUNDS`, from the measured figures below).

A missing file fails the checks that need it. Exit 0 when every check
passes, 1 otherwise, 2 on bad usage. `--json FILE` writes
{"suite": "arm64", "passed": P, "failed": F, "skipped": 0} (and "seconds": S,
the run's time, when `--seconds` gives it: make test's table shows it);
`--tables FILE` writes the Markdown printed on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

import numpy as np

BUNDLES = ("digits", "text", "encoder", "reranker")
EMBEDDING_BUNDLES = ("encoder",)  # outputs are unit sentence vectors, not probabilities
# outputs are one score per (query, passage) pair, in groups of PASSAGES rows per query
RANKING_BUNDLES = ("reranker",)
PASSAGES = 20  # bundle_contract/parity.py's
REFERENCE = "x86-64"
FLOAT_MODES = ("float32", "float16")  # float arithmetic throughout


@dataclasses.dataclass(frozen=True)
class RawBound:
    """How far a CPU's raw outputs may be from x86-64's: quanta for integer outputs."""

    max_share_different: float  # of all output values
    max_abs: float  # quanta (integer outputs) or absolute (float outputs)
    min_top1_same: float  # share of samples whose top class is the same


# Measured by make test-arm64 on an AMD EPYC host and an Intel Xeon host, both
# CPUs (cortex-a72, cortex-a76) alike (docs/device.md, "64-bit ARM, emulated"):
# - float32, float16: within 1e-6 on the digits and pronouns bundles (7e-7 on
#   the Xeon). Bound 4e-6, 4x the 1e-6.
# - dynamic: float in and out, but it quantizes activations to int8 at run
#   time, so the host's and ARM's kernels may round a quantized activation
#   differently: within 1e-6 on the EPYC, 4.33e-6 on the Xeon (digits, both
#   CPUs; pronouns 6.6e-7). Bounded as a quantized mode, in probability quanta:
#   one int8 quantum of a probability (1/256; int8 itself may be 24 off) and
#   the top-1 the same on 99 % of samples, as for int8.
# - int16x8 (digits; pronouns, made by ai-edge-quantizer: 0 of 4,500 values
#   differ on either CPU, AMD EPYC host): bit-identical. No margin: XNNPACK
#   has no int16 kernels, so both machines run TFLite's builtin integer
#   kernels, integer arithmetic that no CPU rounds differently; a difference
#   is a bug, not rounding.
# - int8: XNNPACK's ARM and x86 int8 kernels round some requantizations
#   differently. Small digits bundle: 7 of 3,600 values (0.19 %), up to 6
#   quanta, one top-1 flip of 360; pronouns: identical; the default digits
#   model: 1 of 3,600 values, one quantum. Bounds: 1 % of the values (5x),
#   24 quanta (4x), top-1 the same on 99 % of samples (3 flips of 360, 3x).
#   The x86-64 reference is this host's (AVX2 or AVX-512 kernels), so int8
#   is bounded, never required identical.
# - encoder (all-MiniLM-L6-v2, dynamic): sentence vectors, not probabilities.
#   A first a-priori bound (cosine 0.999 between machines, elements within
#   1/256) failed on the Intel Xeon host: ARM's and x86-64's dynamic-range
#   kernels quantize each activation at run time and round differently, and
#   six layers carry it (min cosine between the machines 0.99702, an element
#   0.0131 off), while each machine alone met the manifest's thresholds
#   against the float model (min cosine 0.992629 on x86-64, 0.992360 on
#   cortex-a76). So the bound is the quantization's own error: two machines
#   may differ from each other by no more than the worse of them differs
#   from the float model (min cosine, max |Δ| of an element), figures read
#   from the two machines' edge demo reports. "Top-1 the same" has no meaning
#   for a vector and is not checked.
# - reranker (a small random cross-encoder, every mode): one score per pair,
#   "top-1" meaning a query's best passage of its 20 (the raw outputs grouped
#   by query). float32 and float16 keep the float bound (within 8.34e-7 on
#   an AMD EPYC host). The quantized modes do not keep the classifiers':
#   measured on the same host, dynamic differed by 0.0106 (1/256 is the
#   bound) and int8 in 64 % of the scores by up to 14 quanta, with 4 of 30
#   queries' best passage changed, while every machine met the manifest's
#   thresholds against the float model (dynamic max |Δ| 0.035, int8 0.084,
#   int8 top-1 0.800 to 0.833). A random model's scores sit close together
#   and two layers of requantization carry each kernel's rounding, as six
#   carry the encoder's. So the bound is the encoder's: two machines may
#   differ by no more than the worse of them differs from the float model,
#   max |Δscore| and top-1 from their reports (int8 in quanta of its sigmoid
#   output, whose scale TFLite fixes at 1/256); an ARM kernel bug (qemu's
#   "max" CPU gave accuracy 0.19) is far beyond it.
RAW_BOUNDS = {
    "float": RawBound(max_share_different=1.0, max_abs=4e-6, min_top1_same=1.0),
    "dynamic": RawBound(max_share_different=1.0, max_abs=1 / 256, min_top1_same=0.99),
    "int16x8": RawBound(max_share_different=0.0, max_abs=0, min_top1_same=1.0),
    "int8": RawBound(max_share_different=0.01, max_abs=24, min_top1_same=0.99),
}


def float_cpu(mode: str, cpus: list[str]) -> str | None:
    """The one CPU that runs a float mode, or None for a mode every CPU runs.

    Float arithmetic is the same on every ARM core LiteRT knows (within 4e-6 of
    x86-64 on both CPUs, measured above), so each float mode runs once, the
    modes spread over the CPUs (float32 on the first, float16 on the second);
    the integer modes, whose kernels differ per core, run on every CPU.
    test.sh asks `--modes-for`, this file's gate reads the same answer.
    """
    if mode not in FLOAT_MODES or not cpus:
        return None
    return cpus[FLOAT_MODES.index(mode) % len(cpus)]


def runs_on(mode: str, cpu: str, cpus: list[str]) -> bool:
    owner = float_cpu(mode, cpus)
    return owner is None or owner == cpu


def modes_for(bundle: pathlib.Path, cpu: str, cpus: list[str]) -> list[str]:
    """The bundle's modes (manifest order) that `cpu` runs."""
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    return [mode for mode in manifest["models"] if runs_on(mode, cpu, cpus)]


def raw_bound(mode: str) -> RawBound | None:
    return RAW_BOUNDS["float"] if mode in FLOAT_MODES else RAW_BOUNDS.get(mode)


@dataclasses.dataclass
class Gate:
    """Checks counted as they are made; the failures keep their reason."""

    passed: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)

    def check(self, ok: bool, what: str) -> bool:
        if ok:
            self.passed += 1
        else:
            self.failures.append(what)
        return ok

    def to_json(self) -> dict:
        return {"suite": "arm64", "passed": self.passed, "failed": len(self.failures), "skipped": 0}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _head(title: str, columns: list[str]) -> list[str]:
    return [
        title,
        "",
        "| mode | " + " | ".join(columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]


def _report(path: pathlib.Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("modes"), dict) else None


def _raw(path: pathlib.Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError):
        return None


def parity(out: pathlib.Path, machines: list[str], bundle: str, gate: Gate) -> list[str]:
    title = f"**{bundle}**: accuracy / top-1 agreement with the float model / max |Δprob|"
    if bundle in EMBEDDING_BUNDLES:
        title = f"**{bundle}**: min / mean cosine to the float model / top-5 neighbour agreement"
    if bundle in RANKING_BUNDLES:
        title = f"**{bundle}**: top-1 / top-5 of the float model's ranking / max |Δscore|"
    lines = _head(title, machines)
    reports = {m: _report(out / f"{m}-{bundle}.json") for m in machines}
    reference = reports[machines[0]]
    for m, report in reports.items():
        gate.check(report is not None, f"{bundle} on {m}: no edge demo report {m}-{bundle}.json")
    if reference is None:
        return lines + ["", f"({machines[0]}-{bundle}.json is missing)"]
    for mode in reference["modes"]:
        cells = []
        for m in machines:
            if reports[m] is None:
                cells.append("missing")
                continue
            r = reports[m]["modes"].get(mode)
            if r is None and m != REFERENCE and not runs_on(mode, m, machines[1:]):
                cells.append(f"on {float_cpu(mode, machines[1:])}")
                continue
            if not isinstance(r, dict):
                cells.append("missing")
                gate.check(False, f"{bundle} {mode} on {m}: not in the report")
                continue
            if r.get("skipped"):
                cells.append("skipped")
                gate.check(False, f"{bundle} {mode} on {m}: skipped ({r.get('reason')})")
                continue
            passed = r.get("passed") is True
            gate.check(passed, f"{bundle} {mode} on {m}: missed the manifest's thresholds {r}")
            verdict = "PASS" if passed else "FAIL"
            if bundle in EMBEDDING_BUNDLES:
                cells.append(
                    f"{_fmt(r.get('min_cosine'), '.6f')} / {_fmt(r.get('mean_cosine'), '.6f')} / "
                    f"{_fmt(r.get('top5'), '.3f')} {verdict}"
                )
                continue
            if bundle in RANKING_BUNDLES:
                cells.append(
                    f"{_fmt(r.get('top1'), '.3f')} / {_fmt(r.get('top5'), '.3f')} / "
                    f"{_fmt(r.get('max_abs_diff'), '.2g')} {verdict}"
                )
                continue
            cells.append(
                f"{_fmt(r.get('accuracy'), '.4f')} / {_fmt(r.get('agreement'), '.4f')} / "
                f"{_fmt(r.get('max_abs_diff'), '.2g')} {verdict}"
            )
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines


def _compare(
    got: np.ndarray,
    want: np.ndarray,
    bound: RawBound,
    embedding: tuple | None = None,
    ranking: tuple | None = None,
) -> tuple[str, list[str]]:
    """(table cell, what exceeds `bound`).

    `embedding`: rows are vectors, bounded by (min cosine, max |Δ|) instead
    (`embedding_bound`). `ranking`: a reranker's quantized scores, bounded by
    (max |Δ| in raw units, min top-1 the same) instead (`ranking_bound`)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return (
            f"{got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}",
            [f"raw output {got.dtype}{list(got.shape)}, x86-64 {want.dtype}{list(want.shape)}"],
        )
    delta = np.abs(got.astype(np.float64) - want.astype(np.float64))
    delta[~np.isfinite(delta)] = np.inf
    unit = " quanta" if want.dtype.kind in "iu" else ""
    share = float((delta > 0).mean())
    problems = []
    if embedding is not None:
        min_cosine, max_abs = embedding
        g, w = got.astype(np.float64), want.astype(np.float64)
        norms = np.linalg.norm(g, axis=-1) * np.linalg.norm(w, axis=-1)
        cosine = float(((g * w).sum(-1) / np.maximum(norms, 1e-12)).min())
        cell = f"{int((delta > 0).sum())} of {delta.size}; max {delta.max():.3g}; min cosine {cosine:.6f}"
        if not cosine >= min_cosine:
            problems.append(
                f"min cosine {cosine:.6f} (at least {min_cosine:.6f}, the worse machine's "
                "against the float model)"
            )
        if not delta.max() <= max_abs:
            problems.append(
                f"max |Δ| {delta.max():.3g} (at most {max_abs:.3g}, the worse machine's "
                "against the float model)"
            )
        return cell, problems
    top = float((got.argmax(-1) == want.argmax(-1)).mean())
    cell = f"{int((delta > 0).sum())} of {delta.size}; max {delta.max():.3g}{unit}; top-1 same {top:.4f}"
    if ranking is not None:
        max_abs, min_top = ranking
        if not delta.max() <= max_abs:
            problems.append(
                f"max |Δ| {delta.max():.3g}{unit} (at most {max_abs:.3g}{unit}, the worse "
                "machine's against the float model)"
            )
        if not top >= min_top:
            problems.append(
                f"top-1 the same on {top:.4f} (at least {min_top:.4f}, the worse machine's "
                "against the float model)"
            )
        return cell, problems
    if share > bound.max_share_different:
        problems.append(f"{share:.2%} of values differ (at most {bound.max_share_different:.2%})")
    if delta.max() > bound.max_abs:
        problems.append(f"max |Δ| {delta.max():.3g}{unit} (at most {bound.max_abs:g}{unit})")
    if top < bound.min_top1_same:
        problems.append(f"top-1 the same on {top:.4f} (at least {bound.min_top1_same})")
    return cell, problems


def embedding_bound(
    out: pathlib.Path, bundle: str, mode: str, machines: tuple[str, ...]
) -> tuple[float, float] | None:
    """(min cosine, max |Δ|) two machines' vectors may differ by: the worse of their
    reports' figures against the float model; None if a report lacks them."""
    cosines, diffs = [], []
    for machine in machines:
        report = _report(out / f"{machine}-{bundle}.json")
        entry = None if report is None else report["modes"].get(mode)
        if not isinstance(entry, dict):
            return None
        cosine, diff = entry.get("min_cosine"), entry.get("max_abs_diff")
        if not all(isinstance(v, (int, float)) and np.isfinite(v) for v in (cosine, diff)):
            return None
        cosines.append(float(cosine))
        diffs.append(float(diff))
    return min(cosines), max(diffs)


SIGMOID_QUANTUM = 1 / 256  # TFLite's int8 LOGISTIC output: scale 1/256, zero point -128


def ranking_bound(
    out: pathlib.Path, bundle: str, mode: str, machines: tuple[str, ...], integer: bool
) -> tuple[float, float] | None:
    """(max |Δ| in raw units, min top-1 the same) two machines' quantized scores may
    differ by: the worse of their reports' figures against the float model."""
    diffs, tops = [], []
    for machine in machines:
        report = _report(out / f"{machine}-{bundle}.json")
        entry = None if report is None else report["modes"].get(mode)
        if not isinstance(entry, dict):
            return None
        diff, top = entry.get("max_abs_diff"), entry.get("top1")
        if not all(isinstance(v, (int, float)) and np.isfinite(v) for v in (diff, top)):
            return None
        diffs.append(float(diff))
        tops.append(float(top))
    return max(diffs) / (SIGMOID_QUANTUM if integer else 1), min(tops)


def raw_diff(out: pathlib.Path, cpus: list[str], bundle: str, gate: Gate) -> list[str]:
    title = f"**{bundle}**: raw outputs vs x86-64 (values that differ, of all; largest difference)"
    lines = _head(title, cpus)
    ref = _raw(out / f"{REFERENCE}-{bundle}-raw.npz")
    other = {cpu: _raw(out / f"{cpu}-{bundle}-raw.npz") for cpu in cpus}
    gate.check(ref is not None, f"{bundle}: no x86-64 raw outputs {REFERENCE}-{bundle}-raw.npz")
    for cpu in cpus:
        gate.check(
            other[cpu] is not None, f"{bundle} on {cpu}: no raw outputs {cpu}-{bundle}-raw.npz"
        )
    if ref is None:
        return lines + ["", f"({REFERENCE}-{bundle}-raw.npz is missing)"]
    for mode, want in ref.items():
        cells = []
        for cpu in cpus:
            if other[cpu] is None:
                cells.append("missing")
                continue
            if mode not in other[cpu] and not runs_on(mode, cpu, cpus):
                cells.append(f"on {float_cpu(mode, cpus)}")
                continue
            if mode not in other[cpu]:
                cells.append("missing")
                gate.check(False, f"{bundle} {mode} on {cpu}: no raw outputs for the mode")
                continue
            bound = raw_bound(mode)
            if bound is None:
                cells.append("no bound")
                gate.check(False, f"{bundle} {mode}: no raw-output bound for this mode")
                continue
            embedding = None
            if bundle in EMBEDDING_BUNDLES:
                embedding = embedding_bound(out, bundle, mode, (REFERENCE, cpu))
                if embedding is None:
                    cells.append("no figures")
                    gate.check(False, f"{bundle} {mode} on {cpu}: no cosine figures in the reports")
                    continue
            got, expected, ranking = other[cpu][mode], want, None
            if bundle in RANKING_BUNDLES and got.shape == want.shape and got.size % PASSAGES == 0:
                got, expected = got.reshape(-1, PASSAGES), want.reshape(-1, PASSAGES)  # per query
            if bundle in RANKING_BUNDLES and mode not in FLOAT_MODES:
                integer = want.dtype.kind in "iu"
                ranking = ranking_bound(out, bundle, mode, (REFERENCE, cpu), integer)
                if ranking is None:
                    cells.append("no figures")
                    gate.check(
                        False, f"{bundle} {mode} on {cpu}: no ranking figures in the reports"
                    )
                    continue
            cell, problems = _compare(got, expected, bound, embedding, ranking)
            cells.append(cell)
            gate.check(not problems, f"{bundle} {mode} on {cpu} vs x86-64: {'; '.join(problems)}")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--modes-for"]:  # test.sh: --modes-for CPU BUNDLE CPU...
        if len(argv) < 4:
            print("usage: summary.py --modes-for CPU BUNDLE CPU [CPU ...]", file=sys.stderr)
            return 2
        print(",".join(modes_for(pathlib.Path(argv[2]), argv[1], argv[3:])))
        return 0
    parser = argparse.ArgumentParser(prog="summary.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="the results folder")
    parser.add_argument("cpus", nargs="*", default=["cortex-a72", "cortex-a76"])
    parser.add_argument("--run-status", type=int, default=0, metavar="N")
    parser.add_argument("--seconds", type=float, metavar="S", help="the run's time, for the table")
    parser.add_argument("--tables", type=pathlib.Path, metavar="FILE")
    parser.add_argument("--json", type=pathlib.Path, metavar="FILE")
    args = parser.parse_intermixed_args(argv)
    gate = Gate()
    gate.check(args.run_status == 0, f"the runs exited {args.run_status} (test.sh or x86-64)")
    blocks = []
    for bundle in BUNDLES:
        blocks += parity(args.out, [REFERENCE, *args.cpus], bundle, gate) + [""]
    for bundle in BUNDLES:
        blocks += raw_diff(args.out, args.cpus, bundle, gate) + [""]
    tables = "\n".join(blocks)
    print(tables)
    if args.tables is not None:
        _write(args.tables, tables + "\n")
    if args.json is not None:
        counts = gate.to_json() | ({} if args.seconds is None else {"seconds": args.seconds})
        _write(args.json, json.dumps(counts) + "\n")
    total = gate.passed + len(gate.failures)
    for failure in gate.failures:
        print(f"test-arm64: FAIL: {failure}", file=sys.stderr)
    verdict = "PASS" if not gate.failures else "FAIL"
    print(f"test-arm64: {verdict}: {gate.passed} of {total} checks passed", file=sys.stderr)
    return 0 if not gate.failures else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
