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

import gc
import math
import sys

import numpy as np

from bundle_contract import attention_parity
from bundle_contract.attention import output_name
from bundle_contract.bundle import Bundle
from bundle_contract.errors import UsageError

from .model import EdgeModel, InferenceError
from .policy import runtime_content, runtime_entry, uses_deploy
from .result import ModeResult, PeakMemory
from .runtime import Runtime


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
    A task whose file generates (`Task.generates`) is scored by
    generate.score_mode (its cache carried between calls; `repeat` unused).
    """
    if bundle.task.generates:
        from .generate import score_mode

        return score_mode(bundle, mode, runtime, threads, keep_raw)
    entry = runtime_entry(bundle.manifest.models[mode], runtime)  # deploy file for TFLM
    evaluation = bundle.eval
    content = runtime_content(bundle, mode, runtime)
    gc.collect()
    memory = PeakMemory()
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
