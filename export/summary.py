"""What keras-mha-export prints: a line per mode while it works, a table at the end."""

from __future__ import annotations

import math

from edge_demo.contract.attention_parity import share_cell
from edge_demo.contract.entries import ModelEntry
from edge_demo.contract.manifest import Manifest
from edge_demo.contract.tasks import Task


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


def summary_table(manifest: Manifest) -> str:
    """Mode, bytes, size vs float32, ops, the task's figures, attention, verified."""
    task = manifest.task
    header = (
        "mode", "bytes", "vs float32", "ops", *(c.header for c in task.summary),
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
                *(format(getattr(figures, c.field), c.fmt) for c in task.summary),
                *_attention_cells(entry),
                "yes" if mode in manifest.verified else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for number, row in enumerate(rows):
        cells = [
            cell.ljust(width) if i in (0, len(header) - 1) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _why(manifest: Manifest, mode: str) -> str:
    failure = manifest.failed.get(mode)
    if failure is not None and failure.stage == "convert":
        return "conversion failed"
    return "could not run"
