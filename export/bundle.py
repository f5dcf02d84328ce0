"""Export a trained classifier as a verified bundle (docs/artifacts.md).

`export_bundle(source, out, modes)` loads and checks the source, converts the
model once per mode at batch 1, checks each graph, runs each model over
eval.npz with LiteRT and compares it with the float Keras model, then writes
the bundle: `model_<mode>.tflite`, `eval.npz`, `labels.json`, `[vocab.json]`
and `manifest.json`. The bundle is built in a temporary directory beside
`out` and renamed into place at the end, so `out` is either the old bundle or
the complete new one, never something in between.

A mode that fails (the converter cannot produce it, a graph check, or
parity) is reported in the manifest's `failed` with its reasons and figures,
and is never in `verified`. Its model is left out of the bundle, unless
`allow_parity_failure` keeps it in `models` with `"verified": false`. When no
model is left to bundle, nothing is written and `ExportFailed` is raised.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .convert import MODES, ConversionError
from .source import InputError, Source, SourcePaths, load_source

FORMAT = "keras-mha-bundle"
FORMAT_VERSION = 1
TOOL = "keras-mha-export"


class ExportFailed(Exception):
    """No requested mode passed verification, so no bundle was written.

    `manifest` holds what was measured (`failed` says why each mode failed).
    """

    def __init__(self, message: str, manifest: dict):
        super().__init__(message)
        self.manifest = manifest


def parse_modes(modes: str | Iterable[str]) -> tuple[str, ...]:
    """`"all"`, `"int8,float32"` or a list -> modes in canonical order.

    Raises `InputError` for an unknown or empty selection.
    """
    names = modes.split(",") if isinstance(modes, str) else list(modes)
    names = [str(name).strip() for name in names if str(name).strip()]
    if not names:
        raise InputError(f"no mode given; choose 'all' or from {', '.join(MODES)}")
    if "all" in names:
        return MODES
    unknown = [name for name in names if name not in MODES]
    if unknown:
        raise InputError(f"unknown mode {unknown[0]!r}; choose 'all' or from {', '.join(MODES)}")
    return tuple(mode for mode in MODES if mode in names)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_within(path: pathlib.Path, directory: pathlib.Path) -> bool:
    path, directory = path.resolve(), directory.resolve()
    return path == directory or directory in path.parents


def _check_target(out: pathlib.Path, overwrite: bool, paths: SourcePaths) -> None:
    """Refuse a target that is a file, a non-empty directory (unless
    `overwrite`), or a directory holding the source files."""
    if out.exists() and not out.is_dir():
        raise InputError(f"bundle path {out} exists and is not a directory")
    for role, path in paths.required().items():
        if _is_within(path, out):
            raise InputError(
                f"bundle directory {out} holds the {role} file {path}; choose another --out"
            )
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InputError(f"bundle directory {out} exists and is not empty (use --overwrite)")


def _versions() -> dict[str, str]:
    import keras
    import tensorflow as tf

    import keras_mha

    versions = {
        "keras_mha": keras_mha.__version__,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "tool": TOOL,
    }
    try:
        from importlib.metadata import version

        versions["ai_edge_litert"] = version("ai-edge-litert")
    except Exception:  # not installed: verification fell back to TensorFlow
        pass
    return versions


def _export_mode(
    source: Source, saved_model: pathlib.Path, mode: str
) -> tuple[bytes | None, dict | None, list[str], str]:
    """Convert, check and verify one mode.

    Returns `(model bytes or None, manifest entry or None, failure reasons,
    failure stage)`.
    """
    from .convert import convert
    from .graph import (
        check_graph,
        op_histogram,
        read_graph,
        tflite_runtime_214_can_load,
        weight_dtypes,
    )
    from .verify import THRESHOLDS, failures, parity, run_model

    start = time.perf_counter()
    try:
        model = convert(saved_model, mode, source.calibration)
    except ConversionError as error:
        return None, None, [f"the converter cannot produce {mode}: {error}"], "convert"
    convert_seconds = time.perf_counter() - start
    graph = read_graph(model)
    problems = check_graph(graph, mode)
    try:
        probs, in_spec, out_spec, runtime = run_model(model, source.x)
    except Exception as error:  # the runtime refused the model
        text = str(error).strip().splitlines()
        return None, None, [f"LiteRT cannot run it: {text[0] if text else error!r}"], "verify"
    figures = parity(probs, source.probs, source.y)
    thresholds = dict(THRESHOLDS[mode])
    reasons = [f"{check}: {'; '.join(found)}" for check, found in problems.items() if found]
    stage = "graph" if reasons else ""
    parity_reasons = failures(figures, thresholds, source.float_accuracy)
    if parity_reasons and not stage:
        stage = "parity"
    reasons += parity_reasons
    histogram = op_histogram(graph)
    entry = {
        "file": f"model_{mode}.tflite",
        "sha256": sha256_bytes(model),
        "bytes": len(model),
        "input": in_spec.to_json(),
        "output": out_spec.to_json(),
        "ops": histogram,
        "parity": figures,
        "thresholds": thresholds,
        "verified": not reasons,
        "runtimes": {
            "ai-edge-litert": runtime == "ai-edge-litert",
            "tflite-runtime": tflite_runtime_214_can_load(graph),
        },
        # Extensions beyond docs/artifacts.md.
        "op_count": sum(histogram.values()),
        "checks": {check: not found for check, found in problems.items()},
        "failures": reasons,
        "weights": weight_dtypes(graph),
        "verified_with": runtime,
        "convert_seconds": round(convert_seconds, 3),
    }
    if mode == "dynamic" and "int8" not in entry["weights"]:
        entry["note"] = (
            "no weight tensor has the 1024 elements TFLite's dynamic-range quantizer "
            "needs, so this is the float32 graph"
        )
    return model, entry, reasons, stage


def _mode_line(mode: str, entry: dict | None, reasons: list[str], float_accuracy: float) -> str:
    if entry is None:
        return f"  {mode:<8} FAILED  {'; '.join(reasons)}"
    figures = entry["parity"]
    status = "verified" if entry["verified"] else "FAILED  " + "; ".join(reasons)
    return (
        f"  {mode:<8} {entry['bytes']:>9,} B  {entry['op_count']:>3} ops  "
        f"agreement {figures['agreement']:.4f}  accuracy {figures['accuracy']:.4f} "
        f"(float {float_accuracy:.4f})  max|Δ| {figures['max_abs_diff']:.2g}  {status}"
    )


def _make_parents(directory: pathlib.Path) -> list[pathlib.Path]:
    """mkdir -p; return the directories created (deepest last)."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    directory.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


def export_bundle(
    source: str | os.PathLike | SourcePaths,
    out: str | os.PathLike | None = None,
    modes: str | Iterable[str] = "all",
    *,
    overwrite: bool = False,
    allow_parity_failure: bool = False,
    dataset: str | None = None,
    import_modules: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
) -> dict:
    """Convert, verify and bundle a classifier; return the manifest written.

    Args:
        source: a run directory (docs/artifacts.md) or `SourcePaths` naming
            the `.keras` model, `calibration.npz`, `eval.npz` and optionally
            `labels.json` (class indices otherwise), `vocab.json`, `metrics.json`.
        out: the bundle directory; defaults to `RUN_DIR/bundle`.
        modes: `"all"`, a comma list or an iterable of `export.MODES`.
        overwrite: replace an existing non-empty `out`.
        allow_parity_failure: keep models that fail a graph check or parity
            in the bundle (with `"verified": false`) instead of leaving them out.
        dataset: recorded in the manifest (default: metrics.json's `dataset`).
        import_modules: modules to import before loading the model (custom
            layers other than keras_mha's).
        log: called with progress lines (nothing is printed otherwise).

    Returns:
        The manifest (as in `out/manifest.json`). Modes that failed are not
        in `manifest["verified"]`; `manifest["failed"]` says why.

    Raises:
        InputError: bad input (missing/corrupt files, mismatched arrays,
            unknown mode, existing bundle); nothing is written.
        ExportFailed: no model is left to bundle; nothing is written.
    """
    log = log or (lambda line: None)
    started = time.perf_counter()
    selected = parse_modes(modes)
    if isinstance(source, SourcePaths):
        paths = source
        if out is None:
            raise InputError("an output directory is needed when exporting from explicit files")
    else:
        paths = SourcePaths.from_run_dir(source)
        out = pathlib.Path(source) / "bundle" if out is None else out
    out = pathlib.Path(out)
    _check_target(out, overwrite, paths)
    loaded = load_source(paths, dataset=dataset, import_modules=tuple(import_modules))
    spec = loaded.model.inputs[0]
    log(
        f"{paths.model}: input (1, {', '.join(str(d) for d in spec.shape[1:])}) "
        f"{np.dtype(spec.dtype).name}, {loaded.num_classes} classes; "
        f"{len(loaded.x)} eval / {len(loaded.calibration)} calibration samples; "
        f"float accuracy {loaded.float_accuracy:.4f}"
    )
    if len(loaded.calibration) < 200:
        log(f"  note: only {len(loaded.calibration)} calibration samples (docs ask for >= 200)")

    from .convert import write_saved_model

    created = _make_parents(out.parent)
    built = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        models: dict[str, dict] = {}
        failed: dict[str, dict] = {}
        with tempfile.TemporaryDirectory(prefix="keras-mha-export-") as scratch:
            saved_model = pathlib.Path(scratch) / "saved_model"
            write_saved_model(loaded.model, saved_model)
            for mode in selected:
                model, entry, reasons, stage = _export_mode(loaded, saved_model, mode)
                log(_mode_line(mode, entry, reasons, loaded.float_accuracy))
                if entry is not None:
                    log(
                        "           ops: "
                        + ", ".join(f"{name} {count}" for name, count in entry["ops"].items())
                    )
                    if "note" in entry:
                        log(f"           note: {entry['note']}")
                if reasons:
                    failed[mode] = {"stage": stage, "reasons": reasons}
                    if entry is not None:
                        for key in ("parity", "bytes", "op_count", "ops"):
                            failed[mode][key] = entry[key]
                if entry is not None and (entry["verified"] or allow_parity_failure):
                    (built / entry["file"]).write_bytes(model)
                    models[mode] = entry
        if "float32" in models:
            for entry in models.values():
                entry["size_vs_float32"] = round(entry["bytes"] / models["float32"]["bytes"], 4)
        manifest = _manifest(loaded, built, models, failed, selected, started)
        if not models:
            raise ExportFailed(
                "no mode passed verification ("
                + "; ".join(f"{mode}: {info['reasons'][0]}" for mode, info in failed.items())
                + "); no bundle written",
                manifest,
            )
        (built / "manifest.json").write_text(
            json.dumps(manifest, indent=2) + "\n", encoding="utf-8"
        )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(built, 0o777 & ~umask)  # mkdtemp made it private
        from keras_mha.fsutil import swap_into_place  # keeps `import export` cheap

        swap_into_place(built, out)
    except BaseException:
        shutil.rmtree(built, ignore_errors=True)
        for directory in reversed(created):
            try:
                directory.rmdir()
            except OSError:
                break
        raise
    return manifest


def _manifest(
    loaded: Source,
    built: pathlib.Path,
    models: dict[str, dict],
    failed: dict[str, dict],
    selected: tuple[str, ...],
    started: float,
) -> dict:
    """Copy eval/labels/vocab into `built`; return the manifest for it."""
    paths = loaded.paths
    shutil.copyfile(paths.eval, built / "eval.npz")
    if loaded.labels_generated:
        (built / "labels.json").write_text(json.dumps(loaded.labels) + "\n", encoding="utf-8")
    else:
        shutil.copyfile(paths.labels, built / "labels.json")
    vocab = None
    if paths.vocab is not None:
        shutil.copyfile(paths.vocab, built / "vocab.json")
        vocab = {"file": "vocab.json", "sha256": sha256_file(built / "vocab.json")}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_by": _versions(),
        "created_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source_model": {
            "file": paths.model.name,
            "sha256": sha256_file(paths.model),
            "dataset": loaded.dataset,
        },
        "eval": {
            "file": "eval.npz",
            "sha256": sha256_file(built / "eval.npz"),
            "samples": int(loaded.x.shape[0]),
            "x_shape": [int(d) for d in loaded.x.shape],
            "x_dtype": loaded.x.dtype.name,
            "num_classes": loaded.num_classes,
            "float_accuracy": loaded.float_accuracy,
        },
        "labels": {"file": "labels.json", "sha256": sha256_file(built / "labels.json")},
        "vocab": vocab,
        "verified": [mode for mode in selected if models.get(mode, {}).get("verified")],
        "models": models,
        # Extensions beyond docs/artifacts.md.
        "requested": list(selected),
        "failed": failed,
        "export_seconds": round(time.perf_counter() - started, 2),
    }
    return manifest


def summary_table(manifest: dict) -> str:
    """Mode, bytes, size vs float32, ops, agreement, accuracy, max |Δ|, verified."""
    header = ("mode", "bytes", "vs float32", "ops", "agreement", "accuracy", "max|Δ|", "verified")
    rows = [header]
    models, failed = manifest["models"], manifest.get("failed", {})
    float32_bytes = (models.get("float32") or failed.get("float32") or {}).get("bytes")
    for mode in manifest.get("requested", list(models)):
        entry = models.get(mode) or failed.get(mode) or {}
        figures = entry.get("parity")
        if figures is None:
            rows.append((mode, "-", "-", "-", "-", "-", "-", "no: conversion failed"))
            continue
        size = entry["bytes"]
        ops = entry.get("op_count") or (sum(entry["ops"].values()) if "ops" in entry else None)
        rows.append(
            (
                mode,
                f"{size:,}",
                f"{size / float32_bytes:.2f}x" if float32_bytes else "-",
                "-" if ops is None else str(ops),
                f"{figures['agreement']:.4f}",
                f"{figures['accuracy']:.4f}",
                f"{figures['max_abs_diff']:.2g}",
                "yes" if mode in manifest["verified"] else "NO",
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
