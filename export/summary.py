"""What keras-mha-export prints: a line per mode while it works, a table at the end."""

from __future__ import annotations

import math

from edge_demo.contract.attention_parity import share_cell
from edge_demo.contract.entries import ModelEntry
from edge_demo.contract.manifest import Manifest
from edge_demo.contract.npu import NpuTarget
from edge_demo.contract.tasks import Column, Task


def mode_line(entry: ModelEntry, task: Task, float_accuracy: float | None) -> str:
    """One mode after verification: size, ops, the task's figures, attention, verdict."""
    status = "verified" if entry.verified else "FAILED  " + "; ".join(entry.failures)
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
    header = (
        "mode", "bytes", "vs float32", "ops", *(c.header for c in figures_of),
        "attn max|Δ|", "attn tail", "attn agree", "verified",
    )  # fmt: skip
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
                *_attention_cells(entry),
                "yes" if mode in manifest.verified else "NO",
            )
        )
    return _render(rows, left=(0, len(header) - 1))


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
