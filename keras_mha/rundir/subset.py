"""A run cut to its first eval rows: export verifies it in a fraction of the time.

    first_rows(RUN, OUT, eval_rows, calibration_rows=None)

OUT is RUN with only the first N rows of eval.npz (and of each per-row JSON
file: texts.json, pairs.json) and, with calibration_rows, the first M rows of
calibration.npz; every other file (the model, tokenizer, vocabulary, metrics)
is a symbolic link to RUN's (directories made from RUN, its bundle or heads/,
are left out). Rows keep their order, so a cross-encoder's
groups of passages stay whole when N is a multiple of their size. OUT is read
back with its task's reader before it is renamed into place, and a bad request
leaves nothing behind.

What it is for: the emulated ARM run (mk/arm64.mk, .ci/arm64/first_rows.py) and tests, where each eval
row costs a device run of every mode, and what they show (a kernel's outputs
against another CPU's, a graph Vela maps) a few hundred rows show as well as
thousands. The run's own figures (test accuracy, training history) stay RUN's.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

from bundle_contract.errors import UsageError

ROW_JSON = ("texts.json", "pairs.json")  # one entry per eval row (or {"texts": [...]})


def _rows(path: pathlib.Path, rows: int, what: str, out: pathlib.Path) -> int:
    with np.load(path) as arrays:
        data = {key: arrays[key] for key in arrays.files}
    total = {len(a) for a in data.values() if a.ndim}
    if len(total) != 1:
        raise UsageError(f"{path}: its arrays disagree on the number of rows ({sorted(total)})")
    (total,) = total
    if not 1 <= rows <= total:
        raise UsageError(
            f"{what}: {rows} rows asked for; {path} has {total} (expected 1 to {total})"
        )
    np.savez(out / path.name, **{k: a[:rows] if a.ndim else a for k, a in data.items()})
    return total


def _json_rows(path: pathlib.Path, rows: int, total: int, out: pathlib.Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    inner = data.get("texts") if isinstance(data, dict) else data
    if not isinstance(inner, list) or len(inner) != total:
        raise UsageError(f"{path}: expected one entry per eval row ({total})")
    cut = inner[:rows]
    data = {**data, "texts": cut} if isinstance(data, dict) else cut
    (out / path.name).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def first_rows(
    run: str | os.PathLike,
    out: str | os.PathLike,
    eval_rows: int,
    calibration_rows: int | None = None,
) -> pathlib.Path:
    """Write OUT: RUN with its first `eval_rows` eval rows (and `calibration_rows`
    calibration rows); the rest linked. Returns OUT. UsageError (one line) on a
    RUN that is not a run, an OUT that exists, or more rows than RUN has."""
    from keras_mha.rundir.tasks import read_any

    run, out = pathlib.Path(run).resolve(), pathlib.Path(out)
    if not (run / "eval.npz").is_file():
        raise UsageError(f"{run}: not a run directory (no eval.npz)")
    if out.exists():
        raise UsageError(f"{out}: exists; expected a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        total = _rows(run / "eval.npz", eval_rows, "eval_rows", staging)
        if calibration_rows is not None:
            _rows(run / "calibration.npz", calibration_rows, "calibration_rows", staging)
        for name in ROW_JSON:
            if (run / name).is_file():
                _json_rows(run / name, eval_rows, total, staging)
        for path in run.iterdir():  # files only: a bundle or heads/ made from RUN is not OUT's
            if path.is_file() and not (staging / path.name).exists():
                (staging / path.name).symlink_to(path)
        read_any(staging)  # a run its task's reader takes, before it has OUT's name
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
