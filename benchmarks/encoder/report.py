"""The report: the ratios and goals, the table printed, the JSON written.

The ratios the project's goals are about, each measured in the same run:
(a) LiteRT float32 p50 / ONNX Runtime fp32 p50, goal <= 1.0 (GOAL_FLOAT32);
(b) the fastest mode the manifest marks verified, p50 / the p50 of the fastest
    ONNX Runtime engine whose mean cosine is no better than that mode's
    (within COSINE_TIE, so float ties count), goal <= 0.5 (GOAL_VERIFIED);
(c) each LiteRT mode's p50 / LiteRT float32's (full int8's goal: GOAL_INT8).
The numbers (`ratios`, `over_float32`, `goals`, `fastest`, `comparable_peer`)
are pure; `build_report` gathers a run into the JSON's dict, `print_report`
prints it, `write_json` writes it (NaN and infinity as null).
"""

from __future__ import annotations

import math
import os
import pathlib
import platform

import numpy as np

from bundle_contract.files import write_json_atomic

from .engines import litert_name
from .peers import ORT_FP32, PEER_PACKAGES, package_version

MODEL = "all-MiniLM-L6-v2"
GOAL_FLOAT32 = 1.0  # (a) LiteRT float32 / ORT fp32
GOAL_VERIFIED = 0.5  # (b) fastest verified mode / fastest ORT engine no better than it
GOAL_INT8 = 0.5  # full int8 / LiteRT float32 (docs/quantization.md)
COSINE_TIE = 1e-5  # mean cosines this close count as equal ("no better than")


def fastest(names, p50: dict[str, float]) -> str | None:
    """The name of `names` with the least p50; None for none."""
    names = [n for n in names if n in p50]
    return min(names, key=lambda n: p50[n]) if names else None


def comparable_peer(
    cosine: float, peers, p50: dict[str, float], mean_cosine: dict[str, float]
) -> str | None:
    """The fastest of `peers` whose mean cosine is no better than `cosine` (ties within
    COSINE_TIE count as no better); None when every peer is better."""
    eligible = [p for p in peers if p in mean_cosine and mean_cosine[p] <= cosine + COSINE_TIE]
    return fastest(eligible, p50)


def _met(ratio: float | None, goal: float) -> bool | None:
    return None if ratio is None else ratio <= goal


def ratios(
    p50: dict[str, float],
    mean_cosine: dict[str, float],
    modes: dict[str, str],
    verified: list[str],
    ort: list[str],
) -> dict:
    """Goals (a) and (b) at one thread count.

    p50: engine -> ms; mean_cosine: engine -> mean cosine to the reference;
    modes: mode -> its LiteRT engine's name; verified: the modes the manifest
    marks verified; ort: the ONNX Runtime engines (the peers of (b)).
    """
    device = modes.get("float32")
    a = None
    if device in p50 and ORT_FP32 in p50:
        a = p50[device] / p50[ORT_FP32]
    result_a = {
        "what": "LiteRT float32 p50 / ORT fp32 p50",
        "engine": device if device in p50 else None,
        "peer": ORT_FP32 if ORT_FP32 in p50 else None,
        "ratio": a,
        "goal": GOAL_FLOAT32,
        "met": _met(a, GOAL_FLOAT32),
    }
    best = fastest([modes[m] for m in verified if m in modes], p50)
    mode = next((m for m in verified if modes.get(m) == best), None)
    peer = None
    if best is not None and best in mean_cosine:
        peer = comparable_peer(mean_cosine[best], ort, p50, mean_cosine)
    b = p50[best] / p50[peer] if best is not None and peer is not None else None
    result_b = {
        "what": "fastest verified mode p50 / fastest ORT engine no better than it, p50",
        "mode": mode,
        "engine": best,
        "engine_mean_cosine": mean_cosine.get(best) if best else None,
        "peer": peer,
        "peer_mean_cosine": mean_cosine.get(peer) if peer else None,
        "ratio": b,
        "goal": GOAL_VERIFIED,
        "met": _met(b, GOAL_VERIFIED),
        "why_none": (
            None
            if b is not None
            else "no verified mode"
            if best is None
            else "every ONNX Runtime engine is more faithful than it"
        ),
    }
    return {"a": result_a, "b": result_b}


def over_float32(p50: dict[str, float], modes: dict[str, str]) -> dict[str, float]:
    """Each LiteRT mode's p50 over LiteRT float32's, this run (full int8's goal:
    GOAL_INT8); empty without float32."""
    anchor = p50.get(modes.get("float32"))
    if anchor is None:
        return {}
    return {m: p50[e] / anchor for m, e in modes.items() if m != "float32" and e in p50}


def goals(per_threads: dict[str, dict]) -> dict:
    """Each goal over every thread count: met when met at each, None when any is unknown."""
    out = {}
    for key in ("a", "b"):
        flags = [r[key]["met"] for r in per_threads.values()]
        out[key] = None if not flags or None in flags else all(flags)
    return out


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else "met" if met else "NOT met"


def json_ready(value):
    """`value` with every NaN or infinity as None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fmt(value, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def print_report(report: dict) -> None:
    s = report["settings"]
    lengths = s["lengths"]
    print(
        f"\n{MODEL} on {report['machine']['cpu']} ({report['machine']['cpus']} CPUs, load "
        f"{report['machine']['load_before'][0]:.2f} before): {s['sentences']} sentences of "
        f"{lengths['min']}-{lengths['max']} tokens (median {lengths['median']}), batch 1, no padding"
    )
    print(
        f"p50/p90 over sentences of each one's median of {s['repeats']} rounds, engines in turns, "
        f"{s['pause_ms']:g} ms pause before each call at threads > 1; fidelity: {report['reference']}"
    )
    threads = [str(t) for t in s["threads"]]
    head = (
        f"{'engine':30} {'verif.':>6} {'file MB':>8} {'peak MB':>8} {'+model':>7} "
        f"{'min cos':>8} {'mean cos':>9} {'top5':>5}"
    )
    for t in threads:
        head += f" {'p50@' + t:>8} {'p90@' + t:>8}"
    print("\n" + head + "   (ms)")
    for name, e in report["engines"].items():
        mem = e["memory"] or {}
        fid = e["fidelity"]
        verified = {True: "yes", False: "no", None: ""}[e["verified"]]
        line = (
            f"{name:30} {verified:>6} {e['bytes'] / 1e6:8.1f} {_fmt(mem.get('peak_mb'), '.0f', 8)} "
            f"{_fmt(mem.get('model_mb'), '.0f', 7)} {fid['min_cosine']:8.5f} {fid['mean_cosine']:9.6f} "
            f"{fid['top5']:5.3f}"
        )
        for t in threads:
            lat = e["latency"][t]
            line += f" {lat['p50_ms']:8.2f} {lat['p90_ms']:8.2f}"
        print(line)
    if report["settings"]["memory_threads"] is not None:
        print(
            f"peak MB: VmHWM of a fresh process per engine (its runtime, model, every sentence "
            f"once, {s['memory_threads']} thread(s)); +model: that minus VmRSS after the imports"
        )
    print("\nratios, this run:")
    for key, goal in (("a", GOAL_FLOAT32), ("b", GOAL_VERIFIED)):
        parts = []
        for t in threads:
            r = report["ratios"][t][key]
            if key == "a":
                what = ""
            else:
                what = (
                    f" ({r['engine']}, mean cos {r['engine_mean_cosine']:.6f} vs {r['peer']}, "
                    f"{r['peer_mean_cosine']:.6f})"
                    if r["ratio"] is not None
                    else f" ({r['why_none']})"
                )
            parts.append(f"threads {t}: {_fmt(r['ratio'], '.3f', 0)}{what}")
        label = (
            "(a) LiteRT float32 p50 / ORT fp32 p50"
            if key == "a"
            else "(b) fastest verified mode p50 / fastest ORT engine no better than it"
        )
        print(f"  {label}, goal <= {goal}: {_verdict(report['goals'][key])}")
        for part in parts:
            print(f"      {part}")
    if any(report.get("over_float32", {}).values()):
        print(f"  (c) each LiteRT mode p50 / LiteRT float32 p50 (full int8's goal <= {GOAL_INT8})")
        for t in threads:
            cells = ", ".join(f"{m} {r:.3f}" for m, r in report["over_float32"][t].items())
            print(f"      threads {t}: {cells}")


def engine_rows(specs, modes: dict, fidelity: dict, memory: dict, latency: dict) -> dict:
    """Engine name -> its runtime, file, size, verified (LiteRT modes), fidelity, memory
    and latency per thread count."""
    engines = {}
    for spec in specs:
        name = spec["name"]
        path = pathlib.Path(spec["path"])
        size = (path / "model.safetensors").stat().st_size if path.is_dir() else path.stat().st_size
        engines[name] = {
            "runtime": {"litert": "ai-edge-litert", "onnx": "onnxruntime", "torch": "torch"}[
                spec["kind"]
            ],
            "file": str(path / "model.safetensors" if path.is_dir() else path),
            "bytes": size,
            "verified": modes[spec["mode"]]["verified"] if spec["kind"] == "litert" else None,
            "fidelity": fidelity[name],
            "memory": memory.get(name),
            "latency": {t: latency[t][name] for t in latency},
        }
    return engines


def run_settings(
    ids: list[np.ndarray],
    repeats: int,
    threads: list[int],
    pause_ms: float,
    memory_threads: int | None,
) -> dict:
    """The report's "settings": what was run and how (the sentences' lengths in tokens)."""
    lengths = [x.shape[1] for x in ids]
    return {
        "sentences": len(ids),
        "repeats": repeats,
        "threads": threads,
        "pause_ms": pause_ms,  # before each timed call, at threads > 1 only
        "memory_threads": memory_threads,
        "cosine_tie": COSINE_TIE,
        "lengths": {
            "min": min(lengths),
            "median": int(np.median(lengths)),
            "max": max(lengths),
        },
        "timed": "int32 ids (1, L) to the unit-norm vector, each sentence at its own length",
    }


def build_report(
    inputs: dict,
    ort: list[str],
    specs: list[dict],
    latency: dict,
    fidelity: dict,
    memory: dict,
    settings: dict,
    reference_file: pathlib.Path | None,
    load_before: list[float],
) -> dict:
    """The run as the JSON's dict: machine, versions, settings, engines, ratios, goals.

    inputs: `inputs.load_bundle` / `load_loose`'s; ort: the ONNX Runtime engines
    (the peers of (b)); latency: thread count -> engine -> p50/p90/mean and
    fidelity: engine -> figures (`timing.bench_all_threads`); memory: engine ->
    the child's JSON (`memory.measure_memory`), {} without; settings:
    `run_settings`; reference_file: --reference; load_before: the load average
    before the run."""
    modes = {m: litert_name(m) for m in inputs["modes"]}
    verified = [m for m, e in inputs["modes"].items() if e["verified"]]
    mean_cosine = {n: f["mean_cosine"] for n, f in fidelity.items()}
    per_threads = {
        t: ratios({n: v["p50_ms"] for n, v in lat.items()}, mean_cosine, modes, verified, ort)
        for t, lat in latency.items()
    }
    by_mode = {
        t: over_float32({n: v["p50_ms"] for n, v in lat.items()}, modes)
        for t, lat in latency.items()
    }
    engines = engine_rows(specs, inputs["modes"], fidelity, memory, latency)
    return {
        "benchmark": "encoder",
        "model": MODEL,
        "machine": {
            "cpu": cpu_name(),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": list(os.getloadavg()),
        },
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            **{pip: package_version(pip) for pip in PEER_PACKAGES.values()},
        },
        "source": inputs["source"],
        "reference": (
            "the bundle's float Keras model (eval.npz embeddings)"
            if "bundle" in inputs["source"]
            else f"--reference {reference_file}"
            if inputs["reference"] is not None
            else "PyTorch eager (no --reference given)"
        ),
        "settings": settings,
        "engines": engines,
        "ratios": per_threads,
        "over_float32": by_mode,
        "goals": {
            "a": {"goal": GOAL_FLOAT32, "met": goals(per_threads)["a"]},
            "b": {"goal": GOAL_VERIFIED, "met": goals(per_threads)["b"]},
        },
    }


def write_json(path: pathlib.Path, report: dict, protected) -> None:
    """The report as JSON (NaN and infinity as null) to --json, atomically; never a file
    of the bundle (`protected`: its root)."""
    write_json_atomic(path, json_ready(report), flag="--json", protected=protected)
    print(f"\nwrote {path}")
