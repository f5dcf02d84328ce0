"""Parity of one mode against the float Keras reference, and its thresholds.

Metrics (per mode, every eval sample at batch 1): accuracy against the
labels, top-1 agreement with `eval.npz` `probs`, max and mean |Δprob|,
latency p50/p90/p99, load time, peak memory. Thresholds come from the
manifest: `max_abs_diff` (float modes), `min_agreement` and
`max_accuracy_drop` (drop = eval.float_accuracy - accuracy).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys

import numpy as np

from .bundle import Bundle
from .runtime import EdgeModel, InferenceError, Runtime

_EPS = 1e-9  # float slack when comparing ratios of sample counts


@dataclasses.dataclass
class ModeResult:
    """One mode's outcome: `status` is "passed", "failed" or "skipped"."""

    mode: str
    status: str
    reason: str = ""  # why it was skipped
    accuracy: float = math.nan
    agreement: float = math.nan
    max_abs_diff: float = math.nan
    mean_abs_diff: float = math.nan
    latency_us_p50: float = math.nan
    latency_us_p90: float = math.nan
    latency_us_p99: float = math.nan
    load_ms: float = math.nan
    peak_rss_mb: float = math.nan
    rss_increase_mb: float = math.nan
    memory_scope: str = ""  # "mode" (peak reset per mode) or "process" (ru_maxrss)
    model_bytes: int = 0
    samples: int = 0
    timed_invocations: int = 0
    thresholds: dict = dataclasses.field(default_factory=dict)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        """True/False once run; None when skipped."""
        return None if self.status == "skipped" else self.status == "passed"

    def to_json(self) -> dict:
        """The JSON entry (non-finite numbers as null)."""
        data = {"passed": self.passed, "skipped": self.status == "skipped"}
        if self.status == "skipped":
            data["reason"] = self.reason
            return data
        for field in dataclasses.fields(self):
            if field.name in ("mode", "status", "reason"):
                continue
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            data[field.name] = value
        return data


def check_thresholds(
    thresholds: dict[str, float],
    accuracy: float,
    agreement: float,
    max_abs_diff: float,
    float_accuracy: float,
) -> list[str]:
    """The thresholds a mode misses, each as a readable line (empty = passed).

    NaN metrics fail every threshold they are compared with.
    """
    failures = []
    if "max_abs_diff" in thresholds:
        limit = thresholds["max_abs_diff"]
        if not max_abs_diff <= limit:
            failures.append(f"max |Δprob| {max_abs_diff:.3g} > {limit:.3g}")
    if "min_agreement" in thresholds:
        limit = thresholds["min_agreement"]
        if not agreement >= limit - _EPS:
            failures.append(f"agreement {agreement:.4f} < {limit:.4f}")
    if "max_accuracy_drop" in thresholds:
        limit = thresholds["max_accuracy_drop"]
        drop = float_accuracy - accuracy
        if not drop <= limit + _EPS:
            failures.append(
                f"accuracy {accuracy:.4f} is {drop:.4f} below the float {float_accuracy:.4f} (> {limit:.4f})"
            )
    return failures


def describe_thresholds(thresholds: dict[str, float]) -> str:
    """Thresholds as a short table cell."""
    parts = []
    if "max_abs_diff" in thresholds:
        parts.append(f"|Δp|≤{thresholds['max_abs_diff']:.0e}")
    if "min_agreement" in thresholds:
        parts.append(f"agree≥{thresholds['min_agreement']:g}")
    if "max_accuracy_drop" in thresholds:
        parts.append(f"drop≤{thresholds['max_accuracy_drop']:g}")
    return ", ".join(parts)


class _PeakMemory:
    """Peak resident memory of this process while one mode runs.

    On Linux, writing 5 to /proc/self/clear_refs resets the VmHWM high-water
    mark, so each mode gets its own peak. Elsewhere, falls back to
    `ru_maxrss`, the process's peak so far.
    """

    def __init__(self) -> None:
        self.scope = "process"
        self.start_kb = math.nan
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.start_kb = self._status_kb("VmRSS")
            self.scope = "mode"
        except OSError:
            pass

    @staticmethod
    def _status_kb(key: str) -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
        raise OSError(f"{key} not in /proc/self/status")

    def peak_mb(self) -> tuple[float, float]:
        """(peak MB, increase over the start in MB; NaN when unknown)."""
        if self.scope == "mode":
            try:
                peak = self._status_kb("VmHWM")
                return peak / 1024, (peak - self.start_kb) / 1024
            except OSError:
                pass
        try:
            import resource  # Unix only
        except ImportError:
            return math.nan, math.nan
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kb = maxrss / 1024 if sys.platform == "darwin" else maxrss  # bytes on macOS
        return kb / 1024, math.nan


def run_mode(
    bundle: Bundle, mode: str, runtime: Runtime, threads: int = 1, repeat: int = 1
) -> ModeResult:
    """Run every eval sample through one mode and compare with the reference."""
    spec = bundle.manifest.models[mode]
    evaluation = bundle.eval
    gc.collect()
    memory = _PeakMemory()
    model = EdgeModel(runtime, bundle.model_bytes[mode], threads, str(bundle.path(spec.file)))
    try:
        model.check_manifest(spec)
        raw, latencies_ns = model.run(model.prepare(evaluation.x), repeat)
    except InferenceError as exc:
        return ModeResult(mode, "failed", load_ms=model.load_ms, failures=[str(exc)])
    finally:
        model.close()
    probs = model.finish(raw)
    load_ms = model.load_ms
    peak_mb, increase_mb = memory.peak_mb()
    predicted = probs.argmax(-1)
    diff = np.abs(probs.astype(np.float64) - evaluation.probs)
    accuracy = float((predicted == evaluation.y).mean())
    agreement = float((predicted == evaluation.probs.argmax(-1)).mean())
    max_abs_diff = float(diff.max()) if np.isfinite(diff).all() else math.nan
    mean_abs_diff = float(diff.mean()) if np.isfinite(diff).all() else math.nan
    failures = check_thresholds(
        spec.thresholds, accuracy, agreement, max_abs_diff, bundle.manifest.eval.float_accuracy
    )
    p50, p90, p99 = np.percentile(latencies_ns / 1e3, [50, 90, 99])
    return ModeResult(
        mode=mode,
        status="failed" if failures else "passed",
        accuracy=accuracy,
        agreement=agreement,
        max_abs_diff=max_abs_diff,
        mean_abs_diff=mean_abs_diff,
        latency_us_p50=round(float(p50), 2),
        latency_us_p90=round(float(p90), 2),
        latency_us_p99=round(float(p99), 2),
        load_ms=round(load_ms, 3),
        peak_rss_mb=round(peak_mb, 1),
        rss_increase_mb=round(increase_mb, 2) if math.isfinite(increase_mb) else math.nan,
        memory_scope=memory.scope,
        model_bytes=spec.bytes,
        samples=int(evaluation.x.shape[0]),
        timed_invocations=int(latencies_ns.size),
        thresholds=dict(spec.thresholds),
        failures=failures,
    )
