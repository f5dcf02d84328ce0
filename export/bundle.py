"""Export a trained classifier as a verified bundle (docs/artifacts.md).

`export_bundle(source, out, modes)`:

1. checks `out` (writable, not the source, empty unless `overwrite`) and
   loads the source (`source.load_source`: every array and file validated);
2. stages the bundle in a directory beside `out`: `eval.npz`, `labels.json`,
   `[vocab.json]`, and per mode the model converted at batch 1 and its graph
   checked; the manifest is written through `edge_demo.contract.manifest`
   (with `coref_head`, the best coreference head, when a run directory holds
   heads/coref.json from `keras-mha-heads coref` for this model.keras);
3. verifies: opens the staged bundle with the device's loader and scores each
   mode with the device's code (`verify.verify_staged`);
4. drops the modes that failed (unless `allow_parity_failure`), rewrites the
   manifest, and renames the staged directory into place (`files.building`).

`out` is either the old bundle or the complete new one, never something in
between; Ctrl-C or any error removes the staging directory.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import platform
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence

from edge_demo.contract import attention
from edge_demo.contract.attention import AttentionReference, CorefHead
from edge_demo.contract.bundle import add_file, labels_json, open_bundle, texts_json
from edge_demo.contract.entries import EvalSpec, FileRef, ModeFailure, ModelEntry
from edge_demo.contract.files import building, check_writable, sha256_file
from edge_demo.contract.manifest import MODES, Manifest
from edge_demo.errors import UsageError

from .devices import add_devices
from .entry import convert_mode, judge
from .source import SourcePaths, load_source, run_files
from .summary import mode_line

TOOL = "keras-mha-export"
ENCODER_ATTENTION_SAMPLES = 8


class ExportFailed(Exception):
    """No requested mode passed verification, so no bundle was written.

    `manifest` holds what was measured (`failed` says why each mode failed).
    """

    def __init__(self, message: str, manifest: Manifest):
        super().__init__(message)
        self.manifest = manifest


def parse_modes(modes: str | Iterable[str]) -> tuple[str, ...]:
    """`"all"`, `"int8,float32"` or a list -> modes in canonical order (UsageError if unknown)."""
    names = modes.split(",") if isinstance(modes, str) else list(modes)
    names = [str(name).strip() for name in names if str(name).strip()]
    if not names:
        raise UsageError(f"no mode given; choose 'all' or from {', '.join(MODES)}", "--quant")
    if "all" in names:
        return MODES
    unknown = [name for name in names if name not in MODES]
    if unknown:
        raise UsageError(
            f"unknown mode {unknown[0]!r}; choose 'all' or from {', '.join(MODES)}", "--quant"
        )
    return tuple(mode for mode in MODES if mode in names)


def _is_within(path: pathlib.Path, directory: pathlib.Path) -> bool:
    path, directory = path.resolve(), directory.resolve()
    return path == directory or directory in path.parents


def check_target(out: pathlib.Path, overwrite: bool, files: dict[str, pathlib.Path]) -> None:
    """Refuse an unwritable `out`, a file, a non-empty directory (unless `overwrite`),
    or a directory holding the source files."""
    check_writable(out, "--out")
    if out.exists() and not out.is_dir():
        raise UsageError("exists and is not a directory", f"--out {out}")
    for role, path in files.items():
        if _is_within(path, out):
            raise UsageError(f"holds the {role} file {path}; choose another --out", f"--out {out}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UsageError("exists and is not empty (use --overwrite)", f"--out {out}")


def _versions() -> dict[str, str]:
    import keras
    import numpy as np
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


def _add_attention_reference(staging: pathlib.Path, loaded) -> AttentionReference:
    """`attention.npz`: the Keras model's own attention weights of the first eval samples.

    Computed by `keras_mha.model.attention_model` (the weights
    `forward(..., return_attention_scores=True)` returns, dropout off), in
    float32, for at most `attention.MAX_SAMPLES` samples (docs/artifacts.md).
    """
    import numpy as np

    from keras_mha.model import attention_model

    # An encoder's eval sentences are long and padded to the longest: 8 of them
    # (about 16 MB for MiniLM) show its 72 heads on the device.
    x = loaded.eval.x[: ENCODER_ATTENTION_SAMPLES if loaded.embedding else attention.MAX_SAMPLES]
    outputs = attention_model(loaded.model, batch_size=None).predict(x, batch_size=64, verbose=0)
    weights = [
        np.asarray(outputs[attention.output_name(i)], np.float32) for i in range(len(outputs))
    ]
    ref = add_file(staging, attention.FILE, attention.reference_bytes(weights))
    return AttentionReference(ref.file, ref.sha256, int(x.shape[0]), len(weights))


def _coref_head(run_dir: pathlib.Path, loaded, log) -> CorefHead | None:
    """RUN_DIR/heads/coref.json's best head (keras-mha-heads coref) for the manifest, or None."""
    from keras_mha.heads.coref import read_best_head
    from keras_mha.heads.masks import heads_per_layer

    head, note = read_best_head(run_dir, heads_per_layer(loaded.model), loaded.files["model"])
    if note is not None:
        log(f"  note: {note}")
    elif head is not None:
        log(f"  {head.caption()}")
    return head


def _has_encoder_blocks(model) -> bool:
    """Whether `keras_mha.model.attention_model` can read the model's attention weights."""
    from keras_mha.layers import TransformerEncoderBlock

    return any(isinstance(layer, TransformerEncoderBlock) for layer in model.layers)


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
) -> Manifest:
    """Convert, verify and bundle a classifier; return the manifest written.

    Args:
        source: a run directory (docs/artifacts.md) or `SourcePaths` naming
            the `.keras` model, `calibration.npz`, `eval.npz` and optionally
            `labels.json` (class indices otherwise) and `vocab.json`.
        out: the bundle directory; defaults to `RUN_DIR/bundle`.
        modes: `"all"`, a comma list or an iterable of `MODES`.
        overwrite: replace an existing non-empty `out`.
        allow_parity_failure: keep models that fail a graph check or parity
            in the bundle (with `"verified": false`) instead of leaving them out.
        dataset: recorded in the manifest (default: the run's dataset).
        import_modules: modules to import before loading the model (custom
            layers other than keras_mha's).
        log: called with progress lines (nothing is printed otherwise).

    Returns:
        The `Manifest` written to `out/manifest.json`.

    Raises:
        UsageError: bad input (files, arrays, modes, `out`); nothing is written.
        ExportFailed: no model is left to bundle; nothing is written.
    """
    log = log or (lambda line: None)
    started = time.perf_counter()
    selected = parse_modes(modes)
    if isinstance(source, SourcePaths):
        files = source.files()
        if out is None:
            raise UsageError("an output directory is needed when exporting from explicit files")
    else:
        if not pathlib.Path(source).is_dir():
            raise UsageError(
                "does not exist" if not pathlib.Path(source).exists() else "is not a directory",
                f"run directory {source}",
            )
        files = run_files(pathlib.Path(source))
        out = pathlib.Path(source) / "bundle" if out is None else out
    out = pathlib.Path(out)
    check_target(out, overwrite, files)
    loaded = load_source(source, tuple(import_modules))
    dataset = dataset or loaded.dataset
    spec = loaded.model.inputs[0]
    what = (
        f"{loaded.num_classes}-dimensional embeddings"
        if loaded.embedding
        else f"{loaded.num_classes} classes"
    )
    log(
        f"{loaded.files['model']}: input (1, {', '.join(str(d) for d in spec.shape[1:])}), "
        f"{what}; {len(loaded.eval.x)} eval / {len(loaded.calibration)} calibration samples"
        + ("" if loaded.embedding else f"; float accuracy {loaded.eval.float_accuracy:.4f}")
    )
    if len(loaded.calibration) < 200:
        log(f"  note: only {len(loaded.calibration)} calibration samples (docs ask for >= 200)")

    from .convert import write_attention_saved_model, write_saved_model
    from .verify import verification_runtime, verify_staged

    with building(out) as staging:
        eval_ref = add_file(staging, "eval.npz", loaded.files["eval"].read_bytes())
        labels_ref = texts_ref = tokenizer_ref = attention_ref = None
        if loaded.embedding:
            texts_ref = add_file(staging, "texts.json", texts_json(loaded.texts))
            tokenizer_ref = add_file(staging, "tokenizer.json", loaded.tokenizer_bytes)
        else:
            labels_ref = add_file(staging, "labels.json", labels_json(loaded.labels))
        vocab_ref = None
        if loaded.vocab is not None:
            loaded.vocab.save(staging / "vocab.json")
            vocab_ref = FileRef("vocab.json", sha256_file(staging / "vocab.json"))
        view = _has_encoder_blocks(loaded.model)
        coref_head = None
        if view:
            attention_ref = _add_attention_reference(staging, loaded)
            if not isinstance(source, SourcePaths):
                coref_head = _coref_head(pathlib.Path(source), loaded, log)
        else:
            log(
                "  note: the model has no keras_mha TransformerEncoderBlock, so the bundle has "
                "no attention signature (the device's --view and attention parity need one)"
            )
        entries: dict[str, ModelEntry] = {}
        problems: dict[str, list[str]] = {}
        failed: dict[str, ModeFailure] = {}
        with tempfile.TemporaryDirectory(prefix="keras-mha-export-") as scratch:
            saved_model = pathlib.Path(scratch) / "saved_model"
            write_saved_model(loaded.model, saved_model)
            view_model = None
            if view:
                view_model = pathlib.Path(scratch) / "attention_saved_model"
                write_attention_saved_model(loaded.model, view_model)
            int8_models = None
            if loaded.ranges is not None and "int8" in selected:
                int8_models = _with_ranges_saved(loaded, pathlib.Path(scratch), view)
                log(f"  int8 takes {len(loaded.ranges)} ranges from ranges.json (keras_mha.qat)")
            for mode in selected:
                models = (
                    int8_models if mode == "int8" and int8_models else (saved_model, view_model)
                )
                entry, found = convert_mode(
                    models[0],
                    mode,
                    loaded.calibration,
                    staging,
                    models[1],
                    eval_samples=int(loaded.eval.x.shape[0]),
                    task=loaded.task,
                    sequence_length=int(loaded.eval.x.shape[1]) if loaded.embedding else None,
                )
                if entry is None:
                    failed[mode] = ModeFailure("convert", tuple(found))
                    log(f"  {mode:<8} FAILED  {'; '.join(found)}")
                else:
                    entries[mode], problems[mode] = entry, found

        def manifest(models: dict[str, ModelEntry]) -> Manifest:
            return Manifest(
                eval=EvalSpec(
                    file=eval_ref.file,
                    sha256=eval_ref.sha256,
                    samples=int(loaded.eval.x.shape[0]),
                    x_shape=tuple(int(d) for d in loaded.eval.x.shape),
                    x_dtype=loaded.eval.x.dtype.name,
                    num_classes=loaded.num_classes,
                    float_accuracy=None if loaded.embedding else loaded.eval.float_accuracy,
                    task=loaded.task,
                ),
                labels=labels_ref,
                texts=texts_ref,
                tokenizer=tokenizer_ref,
                max_length=loaded.max_length,
                vocab=vocab_ref,
                models=models,
                created_by=_versions(),
                created_at=datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                source_model=FileRef(
                    loaded.files["model"].name, sha256_file(loaded.files["model"])
                ),
                dataset=dataset,
                requested=selected,
                failed=failed,
                export_seconds=round(time.perf_counter() - started, 2),
                attention=attention_ref,
                coref_head=coref_head,
            )

        kept: dict[str, ModelEntry] = {}
        if entries:
            if loaded.embedding:  # no deploy file: TFLM needs fixed shapes (docs/pretrained.md)
                manifest(entries).write(staging)
            else:
                entries = add_devices(staging, entries, loaded.eval.x, manifest, log)
            runtime = verification_runtime()
            results = verify_staged(staging, runtime)
            for mode, entry in entries.items():
                entry, failure = judge(entry, problems[mode], results[mode], runtime.name)
                log(mode_line(entry, loaded.eval.float_accuracy))
                log("           ops: " + ", ".join(f"{k} {v}" for k, v in entry.ops.items()))
                if entry.note:
                    log(f"           note: {entry.note}")
                if failure is not None:
                    failed[mode] = failure
                if failure is None or allow_parity_failure:
                    kept[mode] = entry
                else:
                    (staging / entry.file).unlink()
                    if entry.deploy is not None:
                        (staging / entry.deploy.file).unlink()
        if "float32" in kept:
            base = kept["float32"].bytes
            kept = {
                m: dataclasses.replace(e, size_vs_float32=round(e.bytes / base, 4))
                for m, e in kept.items()
            }
        final = manifest(kept)
        if not kept:
            raise ExportFailed(
                "no mode passed verification ("
                + "; ".join(f"{mode}: {info.reasons[0]}" for mode, info in failed.items())
                + "); no bundle written",
                final,
            )
        final.write(staging)
        open_bundle(staging)  # the bundle as written reads back on the device
    return final


def _with_ranges_saved(loaded, scratch: pathlib.Path, view: bool) -> tuple:
    """The SavedModels of the int8 conversion: every point of keras_mha.qat rounds
    to its range (FakeQuant ops, which the converter takes as the tensors' ranges)."""
    from keras_mha import qat

    from .convert import write_attention_saved_model, write_saved_model

    qat.attach(loaded.model, loaded.ranges)
    try:
        model_dir = scratch / "saved_model_ranges"
        write_saved_model(loaded.model, model_dir)
        view_dir = None
        if view:
            view_dir = scratch / "attention_saved_model_ranges"
            write_attention_saved_model(loaded.model, view_dir)
    finally:
        qat.detach(loaded.model)
    return model_dir, view_dir
