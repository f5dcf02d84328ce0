"""What the app prints: the parity table, sample pictures, prediction tables."""

from __future__ import annotations

import math

import numpy as np

from .attention import share_cell
from .score import ModeResult

_RAMP = " .:-=+*#%@"  # darkest last: a digit's ink


def _fmt(value: float, spec: str) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and not math.isfinite(value))
        else format(value, spec)
    )


def format_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """A plain text table, columns padded; `right` = indices of right-aligned columns."""
    right = right or set()
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        padded = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def attention_cells(r: ModeResult) -> list[str]:
    """The attention columns: max |Δ|, the share of rows beyond the tail bound
    (int8's), agreement; "n/a" where the runtime cannot run it."""
    if r.attention_status == "n/a":
        return ["n/a", "n/a", "n/a"]
    return [
        _fmt(r.attention_max_abs_diff, ".2e"),
        share_cell(r.attention_tail_share),
        _fmt(r.attention_agreement, ".4f"),
    ]


def parity_table(results: list[ModeResult]) -> str:
    """The per-mode parity table, then one line per skip or failure."""
    headers = [
        "mode", "result", "accuracy", "agreement", "max|Δp|", "mean|Δp|",
        "attn max|Δ|", "attn tail", "attn agree",
        "p50 µs", "p90 µs", "p99 µs", "load ms", "peak MB", "size KB", "thresholds",
    ]  # fmt: skip
    rows, notes = [], []
    for r in results:
        if r.status == "skipped":
            rows.append([r.mode, "SKIP", *["-"] * 13, ""])
            notes.append(f"{r.mode}: skipped: {r.reason}")
            continue
        rows.append(
            [
                r.mode,
                "PASS" if r.passed else "FAIL",
                _fmt(r.accuracy, ".4f"),
                _fmt(r.agreement, ".4f"),
                _fmt(r.max_abs_diff, ".2e"),
                _fmt(r.mean_abs_diff, ".2e"),
                *attention_cells(r),
                _fmt(r.latency_us_p50, ".1f"),
                _fmt(r.latency_us_p90, ".1f"),
                _fmt(r.latency_us_p99, ".1f"),
                _fmt(r.load_ms, ".1f"),
                _fmt(r.peak_rss_mb, ".1f"),
                _fmt(r.model_bytes / 1024, ".1f"),
                "; ".join(
                    t.describe() for t in (r.thresholds, r.attention_thresholds) if t is not None
                ),
            ]
        )
        notes.extend(f"{r.mode}: FAIL: {failure}" for failure in r.failures)
        if r.attention_status == "n/a":
            notes.append(f"{r.mode}: attention n/a: {r.attention_note}")
    table = format_table(headers, rows, right=set(range(2, 15)))
    return "\n".join([table, *notes])


def render_features(x: np.ndarray) -> str:
    """A feature sample as a small text picture (a digit's 8x8 ink), or its stats."""
    x = np.asarray(x, np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[0] > 64 or x.shape[1] > 64:
        return f"(input of shape {list(x.shape)}: min {x.min():.3g}, max {x.max():.3g})"
    lo, hi = min(0.0, float(x.min())), float(x.max())
    scaled = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
    levels = np.rint(scaled * (len(_RAMP) - 1)).astype(int)
    border = "+" + "-" * (2 * x.shape[1]) + "+"
    rows = ["|" + "".join(_RAMP[v] * 2 for v in row) + "|" for row in levels]
    return "\n".join([border, *rows, border])


def prediction_table(rows: list[tuple[str, str, str]]) -> str:
    """(mode, prediction, confidence) rows as a table."""
    return format_table(["mode", "prediction", "confidence"], [list(r) for r in rows], right={2})
