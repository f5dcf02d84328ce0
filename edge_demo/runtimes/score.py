"""Score one mode of a bundle: every eval sample through `EdgeModel`, against the reference.

`run_mode` is what the device's parity run and export's verification both
call: the figures come from `parity.measure`, the verdict from the
manifest's `Thresholds.failures`. Also measured: latency p50/p90/p99, load
time and peak memory.

The attention view is checked too (`attention_parity`); its misses are
`attention_failures`, and they fail the mode unless the manifest marks the
view not faithful (`AttentionCheck.faithful` false: export kept a model
whose predictions hold and whose view does not; docs/artifacts.md).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys

import numpy as np

from bundle_contract import attention_parity
from bundle_contract.attention import output_name
from bundle_contract.attention_parity import AttentionParity, AttentionThresholds
from bundle_contract.bundle import Bundle
from bundle_contract.errors import UsageError
from bundle_contract.parity import Parity, Thresholds

from .model import EdgeModel, InferenceError
from .policy import runtime_content, runtime_entry, uses_deploy
from .runtime import Runtime


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
        return Parity(
            self.accuracy,
            self.agreement,
            self.max_abs_diff,
            self.mean_abs_diff,
            self.min_cosine,
            self.mean_cosine,
            self.top1,
            self.top5,
        )

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


class Progress:
    """A long timing loop's progress on stderr: a line every `every` seconds, then
    one at the end (after a first line, so short runs print nothing)."""

    def __init__(self, mode: str, every: float = 10.0, stream=None):
        self.mode, self.every, self.stream, self.next = mode, every, stream, every

    def __call__(self, done: int, total: int, seconds: float) -> None:
        if seconds < self.next and not (done == total and self.next > self.every):
            return
        self.next = seconds + self.every
        left = seconds / done * (total - done)
        print(
            f"{self.mode}: pass {done} of {total}, {seconds:.0f} s, about {left:.0f} s left",
            file=self.stream or sys.stderr,
            flush=True,
        )


def run_mode(
    bundle: Bundle,
    mode: str,
    runtime: Runtime,
    threads: int = 1,
    repeat: int = 1,
    keep_raw: bool = False,
) -> ModeResult:
    """Run every eval sample through one mode and compare with the reference
    (`keep_raw`: the result keeps the raw outputs).

    Raises UsageError if the runtime cannot load the model or its tensors
    differ from the manifest; a failure while running is a failed result.
    """
    entry = runtime_entry(bundle.manifest.models[mode], runtime)  # deploy file for TFLM
    evaluation = bundle.eval
    content = runtime_content(bundle, mode, runtime)
    gc.collect()
    memory = _PeakMemory()
    model = EdgeModel(runtime, content, threads, str(bundle.path(entry.file)), bundle.pad_id)
    try:
        model.check_manifest(entry)
        raw, latencies_ns = model.run(
            model.prepare(evaluation.x), repeat, Progress(mode) if repeat > 1 else None
        )
    except InferenceError as exc:
        return ModeResult(
            mode, "failed", load_ms=model.load_ms, thresholds=entry.thresholds, failures=[str(exc)]
        )
    finally:
        model.close()
    probs = model.finish(raw)
    peak_mb, increase_mb = memory.peak_mb()
    parity = bundle.task.measure(probs, evaluation)
    float_accuracy = bundle.manifest.eval.float_accuracy
    failures = entry.thresholds.failures(
        parity, math.nan if float_accuracy is None else float_accuracy
    )
    bad = int((~np.isfinite(probs)).sum())
    if bad:
        failures.insert(0, f"{bad} output value(s) are NaN or infinite")
    p50, p90, p99 = np.percentile(latencies_ns / 1e3, [50, 90, 99])
    figures = {} if uses_deploy(runtime) else _attention(bundle, mode, runtime, threads)
    check = bundle.manifest.models[mode].attention
    faithful = None if check is None else check.faithful
    if faithful is not False:  # a view marked not faithful misses without failing
        failures.extend(figures.get("attention_failures", []))
    return ModeResult(
        mode=mode,
        status="failed" if failures else "passed",
        accuracy=parity.accuracy,
        agreement=parity.agreement,
        max_abs_diff=parity.max_abs_diff,
        mean_abs_diff=parity.mean_abs_diff,
        min_cosine=parity.min_cosine,
        mean_cosine=parity.mean_cosine,
        top1=parity.top1,
        top5=parity.top5,
        latency_us_p50=round(float(p50), 2),
        latency_us_p90=round(float(p90), 2),
        latency_us_p99=round(float(p99), 2),
        load_ms=round(model.load_ms, 3),
        peak_rss_mb=round(peak_mb, 1),
        rss_increase_mb=round(increase_mb, 2) if math.isfinite(increase_mb) else math.nan,
        memory_scope=memory.scope,
        model_bytes=len(content),
        samples=int(evaluation.x.shape[0]),
        timed_invocations=int(latencies_ns.size),
        thresholds=entry.thresholds,
        failures=failures,
        attention_faithful=faithful,
        raw=raw if keep_raw else None,
        **figures,
    )


def _attention(bundle: Bundle, mode: str, runtime: Runtime, threads: int) -> dict:
    """The mode's attention against `attention.npz`: ModeResult fields (its misses in
    `attention_failures`).

    Runs the first `attention.samples` eval samples through the entry's
    attention signature in a fresh interpreter (the classifier's latency
    figures are measured without it). A runtime that cannot run the
    signature gives status "n/a" and a note, not a failure: the device
    still classifies; export's verification fails such a mode itself.
    """
    entry = bundle.manifest.models[mode]
    check, reference = entry.attention, bundle.attention
    if check is None or reference is None:
        return {}
    found: dict = {"attention_thresholds": check.thresholds}
    samples = reference[0].shape[0]
    model = EdgeModel(
        runtime, bundle.model_bytes[mode], threads, str(bundle.path(entry.file)), bundle.pad_id
    )
    try:
        model.check_manifest(entry)
        outputs = model.run_signature(check.signature, bundle.eval.x[:samples])
    except InferenceError as exc:
        return found | {"attention_status": "n/a", "attention_note": str(exc)}
    finally:
        model.close()
    names = [output_name(i) for i in range(len(reference))]
    missing = [n for n in names if n not in outputs]
    if missing:
        raise UsageError(
            f"signature {check.signature!r} has no output {missing[0]} "
            f"(attention.npz has {len(names)} layers)",
            bundle.path(entry.file),
        )
    pad_id = None if bundle.vocab is None else bundle.vocab.pad_id
    parity = attention_parity.measure(
        [outputs[n] for n in names],
        reference,
        attention_parity.valid_rows(bundle.eval.x[:samples], pad_id),
        check.thresholds.argmax_tie,
        check.thresholds.tail_abs_diff,
    )
    failures = check.thresholds.failures(parity)
    return {
        "attention_thresholds": check.thresholds,
        "attention_status": "failed" if failures else "passed",
        "attention_max_abs_diff": parity.max_abs_diff,
        "attention_mean_abs_diff": parity.mean_abs_diff,
        "attention_agreement": parity.argmax_agreement,
        "attention_rows": parity.rows,
        "attention_tail_share": parity.tail_share,
        "attention_failures": failures,
    }
