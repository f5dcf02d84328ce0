"""What keras-mha-export prints: a line per mode while it works, a table at the end,
then a line for each mode left out and each view marked not faithful (`left_out`,
`unfaithful_views`), with the command that would make it hold (`remedy`)."""

from __future__ import annotations

import json
import math
import pathlib

from bundle_contract.attention_parity import share_cell
from bundle_contract.entries import ModelEntry
from bundle_contract.manifest import Manifest
from bundle_contract.npu import NpuTarget
from bundle_contract.tasks import Column, Task


def mode_line(entry: ModelEntry, task: Task, float_accuracy: float | None) -> str:
    """One mode after verification: size, ops, the task's figures, attention, verdict."""
    status = "verified" if entry.verified else "FAILED  " + "; ".join(entry.failures)
    if entry.verified and view_misses(entry):
        status += "; attention view not faithful: " + "; ".join(view_misses(entry))
    if entry.parity is None:
        return f"  {entry.mode:<8} {entry.bytes:>9,} B  {entry.op_count:>3} ops  {status}"
    attention = ""
    if entry.attention is not None and entry.attention.parity is not None:
        a = entry.attention.parity
        tail = "" if math.isnan(a.tail_share) else f" tail {share_cell(a.tail_share)}"
        attention = f"  attn max|Δ| {a.max_abs_diff:.2g}{tail} agree {a.argmax_agreement:.4f}"
    return (
        f"  {entry.mode:<8} {entry.bytes:>9,} B  {entry.op_count:>3} ops  "
        f"{task.figures(entry.parity, float_accuracy)}{attention}  {status}"
    )


def _attention_cells(entry) -> tuple[str, str, str]:
    """attn max|Δ|, the share of rows beyond the tail bound (int8), attn agree."""
    check = getattr(entry, "attention", None)
    if check is None or check.parity is None:
        return "-", "-", "-"
    a = check.parity
    return f"{a.max_abs_diff:.2g}", share_cell(a.tail_share), f"{a.argmax_agreement:.4f}"


def _figures(manifest: Manifest) -> tuple[Column, ...]:
    """The task's figures; accuracy first when the eval has labels the task does
    not always have (a fine-tuned text classifier's held-out split)."""
    columns = manifest.task.summary
    if manifest.eval.float_accuracy is not None and all(c.field != "accuracy" for c in columns):
        columns = (Column("accuracy", "accuracy", ".4f"), *columns)
    return columns


def summary_table(manifest: Manifest) -> str:
    """Mode, bytes, size vs float32, ops, the task's figures, attention, verified."""
    figures_of = _figures(manifest)
    # attention columns where a mode has a view (a language model's file has none)
    viewed = manifest.attention is not None or any(
        e.attention is not None for e in manifest.models.values()
    )
    attention = ("attn max|Δ|", "attn tail", "attn agree") if viewed else ()
    header = ("mode", "bytes", "vs float32", "ops", *(c.header for c in figures_of),
              *attention, "verified")  # fmt: skip
    rows = [header]
    models, failed = manifest.models, manifest.failed
    base = models.get("float32") or failed.get("float32")
    float32_bytes = base.bytes if base is not None else None
    for mode in manifest.requested or tuple(models):
        entry = models.get(mode) or failed.get(mode)
        figures = None if entry is None else entry.parity
        if entry is None or figures is None:
            rows.append((mode, *["-"] * (len(header) - 2), "no: " + _why(manifest, mode)))
            continue
        ops = sum(entry.ops.values())
        rows.append(
            (
                mode,
                f"{entry.bytes:,}",
                f"{entry.bytes / float32_bytes:.2f}x" if float32_bytes else "-",
                str(ops),
                *(format(getattr(figures, c.field), c.fmt) for c in figures_of),
                *(_attention_cells(entry) if viewed else ()),
                _verified_cell(manifest, mode, entry),
            )
        )
    return _render(rows, left=(0, len(header) - 1))


def _verified_cell(manifest: Manifest, mode: str, entry) -> str:
    if mode not in manifest.verified:
        return "NO"
    return "yes, view not faithful" if view_misses(entry) else "yes"


def view_misses(entry) -> list[str]:
    """What a mode's attention view misses when export marked it not faithful
    (`AttentionCheck.faithful` false), one line each with its figure; else []."""
    check = getattr(entry, "attention", None)
    if check is None or check.faithful is not False:
        return []
    return check.misses() or ["attention not faithful"]


# docs/quantization.md: an encoder's full-integer mode holds once its residual
# stream is rescaled at alpha 0.5 and its activations are int16 (int16x8).
RESCALE_ALPHA = 0.5


def rescale_alpha(run_dir: pathlib.Path | None) -> float | None:
    """The alpha `keras-mha-rescale` made the run with (its metrics.json), or None."""
    if run_dir is None:
        return None
    try:
        metrics = json.loads((pathlib.Path(run_dir) / "metrics.json").read_text("utf-8"))
        alpha = metrics["rescale"]["alpha"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(alpha) if isinstance(alpha, (int, float)) else None


def remedy(mode: str, manifest: Manifest, run_dir: pathlib.Path | None, view: bool = False) -> str:
    """The command that would make `mode` hold (`view`: its attention view), or keep it.

    A pretrained sentence encoder's int8 and int16x8 (an embedding bundle) hold
    once rescaled at alpha 0.5 and exported in int16x8 (docs/quantization.md);
    a classifier's int8 view, in int16x8. Otherwise
    --allow-parity-failure keeps a left-out mode, marked unverified.
    """
    run = str(run_dir) if run_dir is not None else "RUN"
    int16x8 = (
        f"keras-mha-export {run} --out {run}/bundle_int16x8 --quant int16x8 "
        "(int16 activations; docs/quantization.md)"
    )
    held = manifest.models.get("int16x8")
    if held is not None and held.verified and not view_misses(held):
        int16x8 = "its int16x8 (int16 activations), verified in this bundle" + (
            " with a faithful view: the head view opens on it" if view else ""
        )
    # keras-mha-rescale takes a sentence encoder's run only (an embedding bundle), not
    # a classifier or cross-encoder built on one (fine-tuned or imported)
    encoder = manifest.file("tokenizer") is not None and manifest.task.rescalable
    alpha = rescale_alpha(run_dir) if encoder else None
    if mode in ("int8", "int16x8") and encoder and alpha is None:
        return (
            f"keras-mha-rescale {run} --out {run}_rescaled --alpha {RESCALE_ALPHA}, then "
            f"keras-mha-export {run}_rescaled --quant int16x8 (docs/quantization.md)"
        )
    if mode in ("int8", "int16x8") and encoder and alpha != RESCALE_ALPHA:
        return (
            f"rescale the imported run at --alpha {RESCALE_ALPHA} (this one has alpha "
            f"{alpha:g}), then keras-mha-export it with --quant int16x8 (docs/quantization.md)"
        )
    # an encoder rescaled at 0.5 already, a model built on a pretrained encoder, or a view
    held_unfaithful = held is not None and held.verified and bool(view_misses(held))
    if (
        mode == "int8"
        and (manifest.file("tokenizer") is not None or view)
        and not (
            view and held_unfaithful  # its int16x8 is in this bundle, its view no better
        )
    ):
        return int16x8
    if view:
        return "read its maps as approximate, or view another mode (--quant float32)"
    return f"--quant {mode} --allow-parity-failure keeps it in the bundle, marked unverified"


def left_out(
    manifest: Manifest, run_dir: pathlib.Path | None = None, converted_only: bool = False
) -> list[str]:
    """One line per mode export left out (not verified, not kept): why, with the
    figures it missed, and what would make it hold (`remedy`). `converted_only`:
    not the modes that did not convert (nothing to keep; the reason says why)."""
    lines = []
    for mode, failure in manifest.failed.items():
        if mode in manifest.models:  # kept unverified (--allow-parity-failure)
            continue
        why = "; ".join(failure.reasons) or failure.stage
        if failure.stage == "convert":
            if not converted_only:
                lines.append(f"left out {mode}: {why}")
            continue
        lines.append(f"left out {mode}: {why}; to make it hold: {remedy(mode, manifest, run_dir)}")
    return lines


def unfaithful_views(manifest: Manifest, run_dir: pathlib.Path | None = None) -> list[str]:
    """One line per verified mode whose attention view export marked not faithful."""
    lines = []
    for mode, entry in manifest.models.items():
        misses = view_misses(entry)
        if misses and entry.verified:  # an unverified one's failures already say it
            lines.append(
                f"{mode}: kept (its predictions hold), but its attention view is not faithful: "
                f"{'; '.join(misses)}; the device's head view says so. For a faithful view: "
                f"{remedy(mode, manifest, run_dir, view=True)}"
            )
    return lines


def _render(rows: list[tuple[str, ...]], left: tuple[int, ...]) -> str:
    """A plain-text table: the header row, a rule, the rows; `left` columns left-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        cells = [
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _cpu_cell(target: NpuTarget) -> str:
    if not target.cpu_ops:
        return "none"
    return ", ".join(f"{name} {count}" for name, count in target.cpu_ops.items())


def npu_line(mode: str, target: NpuTarget) -> str:
    """One mode on one accelerator while export works: operators, SRAM, speed (Vela's estimate)."""
    head = f"  {mode:<8} {target.accelerator}:"
    if target.reason is not None:
        return f"{head} {target.reason}"
    return (
        f"{head} {target.get('npu_tflite_operators')}/{target.get('tflite_operators')} ops on "
        f"the NPU in {target.get('npu_partitions')} partition(s) (CPU: {_cpu_cell(target)}); "
        f"SRAM {target.get('sram_kib')} KiB; {target.get('inferences_per_second'):,.0f} "
        "inferences/s (Vela's estimate)"
    )


def npu_rows(name: str, manifest: Manifest) -> list[tuple[str, ...]]:
    """`npu_table`'s rows for one bundle (`name` in the first column)."""
    rows = []
    for mode, entry in manifest.models.items():
        report = entry.npu
        mode = mode if entry.verified else f"{mode} (unverified)"
        for target in () if report is None else report.targets:
            if target.reason is not None:
                rows.append((name, mode, target.accelerator, *["-"] * 7, target.reason))
                continue
            fraction, macs = target.npu_fraction, target.mac_fraction
            rows.append(
                (
                    name,
                    mode,
                    target.accelerator,
                    f"{target.get('npu_tflite_operators')}/{target.get('tflite_operators')}",
                    "-" if fraction is None else f"{fraction:.1%}",
                    "-" if macs is None else f"{macs:.1%}",
                    str(target.get("npu_partitions")),
                    f"{target.get('sram_kib'):.1f}",
                    f"{_off_chip_kib(target):.1f}",
                    f"{target.get('inferences_per_second'):,.0f}",
                    _cpu_cell(target),
                )
            )
    return rows


def _off_chip_kib(target: NpuTarget) -> float:
    """Off-chip traffic per inference (flash or DRAM, wherever the system keeps weights)."""
    moved = sum(
        target.get(f"{area}_bytes_per_inference", 0)
        for area in ("dram", "off_chip_flash", "on_chip_flash")
    )
    return moved / 1024


NPU_HEADER = (
    "model", "mode", "accelerator", "TFLite ops on NPU", "ops", "MACs", "partitions",
    "SRAM KiB", "off-chip KiB/inf", "inf/s", "on the CPU",
)  # fmt: skip


def npu_table(bundles: dict[str, Manifest]) -> str:
    """Per bundle, mode and accelerator: what Vela maps to the NPU and its estimates."""
    rows = [NPU_HEADER]
    for name, manifest in bundles.items():
        rows.extend(npu_rows(name, manifest))
    return _render(rows, left=(0, 1, 2, len(NPU_HEADER) - 1))


def _why(manifest: Manifest, mode: str) -> str:
    failure = manifest.failed.get(mode)
    if failure is not None and failure.stage == "convert":
        return "conversion failed"
    return "could not run"
