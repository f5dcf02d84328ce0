"""A mode's outcome on the device (`ModeResult`) and the memory it peaked at (`PeakMemory`).

score.py (a classifier's, an encoder's) and generate.py (a language model's)
fill them; the report, the JSON and export's verdict read them.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np

from bundle_contract.attention_parity import AttentionParity, AttentionThresholds
from bundle_contract.parity import Parity, Thresholds


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
    # An embedding model's figures (tasks/embedding.py, measure_embeddings).
    min_cosine: float = math.nan
    mean_cosine: float = math.nan
    top1: float = math.nan
    top5: float = math.nan
    # A language model's figures (tasks/language_model.py, measure_language).
    decided_agreement: float = math.nan
    perplexity_ratio: float = math.nan
    greedy_prefix: float = math.nan
    prefill_tokens_per_s: float = math.nan  # prompt tokens a second, in prefill calls
    decode_tokens_per_s: float = math.nan  # new tokens a second, one decode call each
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
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    failures: list[str] = dataclasses.field(default_factory=list)
    # The attention signature: "passed", "failed", "n/a" (this runtime cannot
    # run it; `attention_note` says why) or "" (the bundle has none).
    attention_status: str = ""
    attention_max_abs_diff: float = math.nan
    attention_mean_abs_diff: float = math.nan
    attention_agreement: float = math.nan
    attention_rows: int = 0
    attention_tail_share: float = math.nan  # rows beyond the mode's tail |Δ| (int8)
    attention_thresholds: AttentionThresholds | None = None
    attention_note: str = ""
    # The attention thresholds missed here, whether or not they fail the mode:
    # they are in `failures` too unless the manifest marks the view not faithful.
    attention_failures: list[str] = dataclasses.field(default_factory=list)
    attention_faithful: bool | None = None  # the manifest's `attention.faithful`
    # The outputs as the runtime gave them (int8, int16 or float32), kept only when
    # asked (`run_mode(keep_raw=True)`: the device's --raw); never in the JSON.
    raw: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def view_excused(self) -> bool:
        """The view misses its thresholds, as the manifest says it does: not a failure."""
        return bool(self.attention_failures) and self.attention_faithful is False

    @property
    def task_failures(self) -> list[str]:
        """`failures` without the attention view's: what the task's outputs miss
        (and a model that would not run)."""
        view = set(self.attention_failures)
        return [f for f in self.failures if f not in view]

    @property
    def parity(self) -> Parity:
        return Parity(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Parity)})

    @property
    def attention_parity(self) -> AttentionParity:
        return AttentionParity(
            self.attention_max_abs_diff,
            self.attention_mean_abs_diff,
            self.attention_agreement,
            self.attention_rows,
            self.attention_tail_share,
        )

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
            if field.name in ("mode", "status", "reason", "raw"):
                continue
            value = getattr(self, field.name)
            if isinstance(value, (Thresholds, AttentionThresholds)):
                value = value.to_json()
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            data[field.name] = value
        return data


class PeakMemory:
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
