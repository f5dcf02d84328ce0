"""What the app prints: the parity table, sample pictures, prediction tables."""

from __future__ import annotations

import math

import numpy as np

from bundle_contract.attention_parity import share_cell
from bundle_contract.tasks import DEFAULT, Task

from ..runtimes.score import ModeResult
from ..tables import format_table

_RAMP = " .:-=+*#%@"  # darkest last: a digit's ink


def _fmt(value: float, spec: str) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and not math.isfinite(value))
        else format(value, spec)
    )


def _attention(r: ModeResult, cell: str) -> str:
    """An attention column's cell; "n/a" where the runtime cannot run the view."""
    return "n/a" if r.attention_status == "n/a" else cell


def _thresholds(r: ModeResult) -> str:
    return "; ".join(t.describe() for t in (r.thresholds, r.attention_thresholds) if t is not None)


# (header, cell of a mode that ran, in the default narrow table): the narrow
# table is what a reader judges a mode by; --wide adds the rest. Failures are
# spelled out below the table either way, so the thresholds column is wide-only.
_COLUMNS = [
    ("accuracy", lambda r: _fmt(r.accuracy, ".4f"), True),
    ("agreement", lambda r: _fmt(r.agreement, ".4f"), True),
    ("max|Δp|", lambda r: _fmt(r.max_abs_diff, ".2e"), True),
    ("mean|Δp|", lambda r: _fmt(r.mean_abs_diff, ".2e"), False),
    ("attn max|Δ|", lambda r: _attention(r, _fmt(r.attention_max_abs_diff, ".2e")), True),
    ("attn tail", lambda r: _attention(r, share_cell(r.attention_tail_share)), False),
    ("attn agree", lambda r: _attention(r, _fmt(r.attention_agreement, ".4f")), True),
    ("p50 µs", lambda r: _fmt(r.latency_us_p50, ".1f"), True),
    ("p90 µs", lambda r: _fmt(r.latency_us_p90, ".1f"), False),
    ("p99 µs", lambda r: _fmt(r.latency_us_p99, ".1f"), False),
    ("load ms", lambda r: _fmt(r.load_ms, ".1f"), False),
    ("peak MB", lambda r: _fmt(r.peak_rss_mb, ".1f"), False),
    ("size KB", lambda r: _fmt(r.model_bytes / 1024, ".1f"), True),
    ("thresholds", _thresholds, False),
]


def _columns(task: Task, labelled: bool = False) -> list:
    """The task's own figures first (tasks/: `Task.columns`), then the classifier's
    columns it has a figure for (`labelled`: the eval has labels, so accuracy too)."""
    own = [(c.header, _cell(c.field, c.fmt), c.narrow) for c in task.columns]
    drops = set(task.drops) - ({"accuracy"} if labelled else set())
    return own + [c for c in _COLUMNS if c[0] not in drops]


def _cell(field: str, fmt: str):
    return lambda r: _fmt(getattr(r, field), fmt)


def parity_table(
    results: list[ModeResult], wide: bool = False, task: Task = DEFAULT, labelled: bool = False
) -> str:
    """The per-mode parity table (`wide`: every column), then one line per skip or
    failure. `labelled`: the eval data has labels (a fine-tuned text classifier's)."""
    columns = _columns(task, labelled)
    columns = [c for c in columns if wide or c[2]]
    headers = ["mode", "result", *(header for header, _, _ in columns)]
    rows, notes = [], []
    for r in results:
        if r.status == "skipped":
            rows.append([r.mode, "SKIP", *["-"] * len(columns)])
            notes.append(f"{r.mode}: skipped: {r.reason}")
            continue
        result = "PASS" if r.passed else "FAIL"
        rows.append([r.mode, result, *(cell(r) for _, cell, _ in columns)])
        notes.extend(f"{r.mode}: FAIL: {failure}" for failure in r.failures)
        if r.view_excused:  # the manifest says so: the predictions are what is judged
            notes.append(
                f"{r.mode}: attention view not faithful (so marked at export; not a failure): "
                + "; ".join(r.attention_failures)
            )
        if r.attention_status == "n/a":
            notes.append(f"{r.mode}: attention n/a: {r.attention_note}")
    right = {i + 2 for i, (header, _, _) in enumerate(columns) if header != "thresholds"}
    return "\n".join([format_table(headers, rows, right=right), *notes])


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


def prediction_table(rows: list[tuple], labels: tuple[str, ...] | None = None) -> str:
    """(mode, prediction, confidence[, probs]) rows as a table; with `labels`, a column
    of every class's probability (a text classifier's `--text`)."""
    headers = ["mode", "prediction", "confidence"]
    if labels is None:
        return format_table(headers, [list(r[:3]) for r in rows], right={2})
    cells = []
    for row in rows:
        probs = row[3] if len(row) > 3 else None
        shown = (
            "-"
            if probs is None
            else "  ".join(f"{label} {p:.4f}" for label, p in zip(labels[:MAX_SHOWN], probs))
        )
        cells.append([*row[:3], shown + (" ..." if len(labels) > MAX_SHOWN else "")])
    return format_table([*headers, "probabilities"], cells, right={2})


MAX_SHOWN = 10  # classes whose probabilities a prediction row lists
