"""Export a trained model as a verified bundle (docs/artifacts.md).

`export_bundle(source, out, modes)` runs these steps, each a function below:

1. `_target`: `out` checked (writable, not the source, empty unless
   `overwrite`); `source.load_source` reads and checks the run (its task's
   reader, keras_mha.rundir.tasks), its ranges.json and its best coreference
   head: everything export takes from keras_mha, in one place;
2. `_add_data`: in a staging directory beside `out`, eval.npz, the task's own
   files (labels.json; an encoder's texts.json and tokenizer.json),
   vocab.json and the float model's attention weights (attention.npz);
3. `_convert`: each mode converted at batch 1 (convert.py) and its graph
   checked (entry.py);
4. `_verify`: the staged bundle opened with the device's loader and each mode
   scored with the device's code (`verify.verify_staged`), the task's
   thresholds (`Task.thresholds`); failed modes dropped unless
   `allow_parity_failure`; a mode whose predictions hold and whose attention
   view misses its bounds is kept, verified, its view marked not faithful
   (`entry.judge`);
5. `_compile_npu`, when asked (`npu`): each verified full-integer mode's
   deploy file compiled with Arm's Vela for Ethos-U NPUs (npu.py), Vela's
   estimates in the entry's `npu` and the compiled files in the bundle;
6. the manifest of what passed written, the bundle read back with
   `open_bundle`, and the staging directory renamed into place
   (`files.building`).

The path goes one way: export calls keras_mha (source, convert) and the
contract, never the other way round.

`out` is either the old bundle or the complete new one, never something in
between; Ctrl-C or any error removes the staging directory.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence

from bundle_contract import attention
from bundle_contract.attention import AttentionReference
from bundle_contract.bundle import add_file, open_bundle
from bundle_contract.entries import EvalSpec, FileRef, ModeFailure, ModelEntry
from bundle_contract.errors import UsageError
from bundle_contract.files import building, sha256_file
from bundle_contract.manifest import MODES, Manifest
from bundle_contract.npu import NpuReport

from . import verify
from .common import ExportFailed, check_target, tool_versions
from .convert import attention_weights, saved_models, token_ids
from .devices import add_devices
from .entry import convert_mode, judge
from .graph import INTEGER_IO
from .npu import Accelerator, compile_for, compiled_name, npu_request, require_vela
from .source import Source, SourcePaths, check_length, load_source, run_files
from .summary import mode_line

# Newton steps on every LayerNorm's inverse std in the int16x8 graph of a
# token-id model (keras_mha.layers.newton_refined; docs/quantization.md):
# MiniLM's worst attention row moves 0.247 with none, 0.066 with two.
INT16_NEWTON_STEPS = 2


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


def names_modes(modes: str | Iterable[str]) -> bool:
    """Whether `modes` names modes (`"int8"`, `"float32,int8"`) rather than `"all"`:
    a named mode must verify, `all` keeps those that do (keras-mha-export's exit status)."""
    names = modes.split(",") if isinstance(modes, str) else list(modes)
    return "all" not in [str(name).strip() for name in names]


def export_bundle(
    source: str | os.PathLike | SourcePaths,
    out: str | os.PathLike | None = None,
    modes: str | Iterable[str] = "all",
    *,
    overwrite: bool = False,
    allow_parity_failure: bool = False,
    dataset: str | None = None,
    import_modules: Sequence[str] = (),
    npu: str | Sequence[str] | None = None,
    length: int | None = None,
    context: int | None = None,
    prefill: int | None = None,
    log: Callable[[str], None] | None = None,
) -> Manifest:
    """Convert, verify and bundle a model; return the manifest written.

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
        npu: `"all"` or a comma list of `npu.ACCELERATORS` names: compile
            each verified full-integer mode for them with Vela (needs
            ethos-u-vela); None or empty: no NPU compile.
        length: export a token-id model of dynamic length (an encoder) at
            this fixed sequence length: eval and calibration ids padded to
            it, every file `(1, length)` (`source.at_length`); what an NPU
            and TFLite Micro need. None: as the model is.
        context, prefill: a language model's run (its task generates): the
            positions its file's cache holds and the prompt tokens a prefill
            call takes (export/decoder_bundle.py); refused for any other run.
        log: called with progress lines (nothing is printed otherwise).

    Returns:
        The `Manifest` written to `out/manifest.json`.

    Raises:
        UsageError: bad input (files, arrays, modes, `out`); nothing is written.
        ExportFailed: no model is left to bundle; nothing is written.
    """
    log = log or (lambda line: None)
    if not isinstance(source, SourcePaths) and _generates(source):  # a language model's run
        for flag, given in (("--length", length is not None), ("--npu", bool(npu)),
                            ("--dataset", dataset), ("--import-module", import_modules)):  # fmt: skip
            if given:
                raise UsageError("does not apply to a language model's run", flag)
        from .decoder_bundle import export_language_model

        return export_language_model(source, out, modes, context=context, prefill=prefill,
                                     overwrite=overwrite,
                                     allow_parity_failure=allow_parity_failure, log=log)  # fmt: skip
    for flag, given in (("--context", context), ("--prefill", prefill)):
        if given is not None:
            raise UsageError("applies to a language model's run (keras-mha-import)", flag)
    started = time.perf_counter()
    selected = parse_modes(modes)
    if length is not None:
        check_length(length)
    accelerators = npu_request(npu, selected)
    vela = require_vela() if accelerators else None
    out = _target(source, out, overwrite)
    loaded = load_source(source, tuple(import_modules), length)  # 1. read and check the source
    _describe(loaded, log)
    with building(out) as staging:
        draft = _Draft(loaded, selected, dataset or loaded.dataset, started)
        _add_data(staging, loaded, draft, log)  # 2. eval.npz, the task's files, attention.npz
        _convert(staging, loaded, selected, draft, log)  # 3. each mode converted, its graph checked
        kept = _verify(staging, loaded, draft, allow_parity_failure, log)  # 4. the device's checks
        if accelerators:  # 5. Vela for Ethos-U
            kept = _compile_npu(staging, kept, accelerators, vela, allow_parity_failure, log)
        final = draft.manifest(_sized(kept))
        if not kept:
            raise ExportFailed(
                "no mode passed verification ("
                + "; ".join(f"{mode}: {info.reasons[0]}" for mode, info in draft.failed.items())
                + "); no bundle written",
                final,
            )
        final.write(staging)  # 6. the manifest of what passed; renamed into place on return
        open_bundle(staging)  # the bundle as written reads back on the device
    return final


def _generates(source) -> bool:
    """Whether the run directory `source` is of a task whose file generates."""
    from keras_mha.rundir.tasks import task_of

    return pathlib.Path(source).is_dir() and task_of(source).generates


def _target(source, out, overwrite: bool) -> pathlib.Path:
    """`out` (default RUN_DIR/bundle), checked before anything is loaded."""
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
    return out


def _describe(loaded: Source, log) -> None:
    spec = loaded.model.inputs[0]
    what = loaded.task.describe(
        loaded.num_classes, loaded.task.float_accuracy(loaded.eval), loaded.max_length
    )
    shape = ", ".join(str(d) for d in spec.shape[1:])
    if loaded.length is not None:
        shape += f" -> {loaded.length}, fixed by --length"
    log(
        f"{loaded.files['model']}: input (1, {shape}), "
        f"{what}; {len(loaded.eval.x)} eval / {len(loaded.calibration)} calibration samples"
    )
    if len(loaded.calibration) < 200:
        log(f"  note: only {len(loaded.calibration)} calibration samples (docs ask for >= 200)")


@dataclasses.dataclass
class _Draft:
    """What the manifest will say, filled in step by step."""

    loaded: Source
    selected: tuple[str, ...]
    dataset: str | None
    started: float
    refs: dict = dataclasses.field(default_factory=dict)  # Manifest field -> FileRef
    entries: dict[str, ModelEntry] = dataclasses.field(default_factory=dict)
    problems: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    failed: dict[str, ModeFailure] = dataclasses.field(default_factory=dict)

    def manifest(self, models: dict[str, ModelEntry]) -> Manifest:
        loaded = self.loaded
        return Manifest(
            eval=EvalSpec(
                file=self.refs["eval"].file,
                sha256=self.refs["eval"].sha256,
                samples=int(loaded.eval.x.shape[0]),
                x_shape=tuple(int(d) for d in loaded.eval.x.shape),
                x_dtype=loaded.eval.x.dtype.name,
                num_classes=loaded.num_classes,
                float_accuracy=loaded.task.float_accuracy(loaded.eval),
                task=loaded.task.name,
            ),
            files={k: v for k, v in self.refs.items() if k not in ("eval", "attention")},
            attention=self.refs.get("attention"),
            max_length=loaded.max_length,
            pad_id=loaded.pad_id,
            models=models,
            created_by=tool_versions("int16x8" in models and token_ids(loaded.calibration)),
            created_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            source_model=FileRef(loaded.files["model"].name, sha256_file(loaded.files["model"])),
            dataset=self.dataset,
            requested=self.selected,
            failed=self.failed,
            export_seconds=round(time.perf_counter() - self.started, 2),
            coref_head=loaded.coref_head,
        )


def _add_data(staging: pathlib.Path, loaded: Source, draft: _Draft, log) -> None:
    """eval.npz, the task's own files, vocab.json and the float attention reference."""
    draft.refs["eval"] = add_file(staging, "eval.npz", loaded.eval_file())
    for field, (name, data) in loaded.own_files.items():  # labels.json, or texts and tokenizer
        draft.refs[field] = add_file(staging, name, data)
    if loaded.vocab is not None:
        loaded.vocab.save(staging / "vocab.json")
        draft.refs["vocab"] = FileRef("vocab.json", sha256_file(staging / "vocab.json"))
    if loaded.coref_note is not None:
        log(f"  note: {loaded.coref_note}")
    elif loaded.coref_head is not None:
        log(f"  {loaded.coref_head.caption()}")
    if loaded.attention_note is not None:
        log(f"  note: {loaded.attention_note}")
    if not loaded.has_attention:
        log(
            f"  note: {loaded.attention_problem}, so the bundle has no attention "
            "signature (the device's --view and attention parity need one)"
        )
        return
    # The float model's own attention weights of the first eval samples, in float32
    # (keras_mha.model.attention_model, dropout off; docs/artifacts.md).
    x = loaded.eval.x[: loaded.task.attention_samples]
    weights = attention_weights(loaded.model, x)
    ref = add_file(staging, attention.FILE, attention.reference_bytes(weights))
    draft.refs["attention"] = AttentionReference(
        ref.file, ref.sha256, int(x.shape[0]), len(weights)
    )


def saved_model_kinds(selected, has_ranges: bool, token_model: bool) -> dict[str, str]:
    """The SavedModel pair (`saved_models`) each selected mode converts: "ranges"
    for int8 of a run with ranges.json (keras_mha.qat), "newton" for int16x8 of a
    token-id model (ai-edge-quantizer's graph, its LayerNorms refined), "plain"
    for the rest. Only the kinds named are written: an int16x8-only export of
    MiniLM writes one pair, not two (about 25 s)."""
    kinds = {}
    for mode in selected:
        if mode == "int8" and has_ranges:
            kinds[mode] = "ranges"
        elif mode == "int16x8" and token_model:
            kinds[mode] = "newton"
        else:
            kinds[mode] = "plain"
    return kinds


def _convert(staging: pathlib.Path, loaded: Source, selected, draft: _Draft, log) -> None:
    """Each mode converted at batch 1 into `staging`, its graph checked (`convert_mode`)."""
    with tempfile.TemporaryDirectory(prefix="keras-mha-export-") as scratch:
        scratch = pathlib.Path(scratch)
        kinds = saved_model_kinds(
            selected, loaded.ranges is not None, token_ids(loaded.calibration)
        )
        made = {}
        for kind in dict.fromkeys(kinds.values()):  # each pair written once, none unused
            made[kind] = saved_models(
                loaded.model, scratch, loaded.has_attention,
                ranges=loaded.ranges if kind == "ranges" else None, length=loaded.length,
                newton_steps=INT16_NEWTON_STEPS if kind == "newton" else 0,
            )  # fmt: skip
            if kind == "ranges":
                log(f"  int8 takes {len(loaded.ranges)} ranges from ranges.json (keras_mha.qat)")
        for mode in selected:
            model, view = made[kinds[mode]]
            entry, found = convert_mode(
                model,
                mode,
                loaded.calibration,
                staging,
                view,
                eval_samples=int(loaded.eval.x.shape[0]),
                task=loaded.task,
                sequence_length=int(loaded.eval.x.shape[1]) if loaded.dynamic else None,
                pad_id=loaded.pad_id,
            )
            if entry is None:
                draft.failed[mode] = ModeFailure("convert", tuple(found))
                log(f"  {mode:<8} FAILED  {'; '.join(found)}")
            else:
                draft.entries[mode], draft.problems[mode] = entry, found


def _verify(staging: pathlib.Path, loaded: Source, draft: _Draft, keep_failed: bool, log) -> dict:
    """The device's checks on the staged bundle; returns the entries kept.

    A fixed-shape model also gets its deploy file for TFLite Micro
    (devices.py); a dynamic-length one cannot (TFLM needs fixed shapes)."""
    entries = draft.entries
    if not entries:
        return {}
    if loaded.dynamic:
        draft.manifest(entries).write(staging)
    else:
        entries = add_devices(staging, entries, loaded.eval.x, draft.manifest, log)
    runtime = verify.verification_runtime()  # looked up here: tests replace it
    results = verify.verify_staged(staging, runtime)
    kept: dict[str, ModelEntry] = {}
    float_accuracy = loaded.task.float_accuracy(loaded.eval)
    for mode, entry in entries.items():
        entry, failure = judge(entry, draft.problems[mode], results[mode], runtime.name)
        log(mode_line(entry, loaded.task, float_accuracy))
        log("           ops: " + ", ".join(f"{k} {v}" for k, v in entry.ops.items()))
        if entry.note:
            log(f"           note: {entry.note}")
        if failure is not None:
            draft.failed[mode] = failure
        if failure is None or keep_failed:
            kept[mode] = entry
        else:
            (staging / entry.file).unlink()
            if entry.deploy is not None:
                (staging / entry.deploy.file).unlink()
    return kept


def _compile_npu(
    staging: pathlib.Path,
    kept: dict[str, ModelEntry],
    accelerators: Sequence[Accelerator],
    vela: str,
    unverified: bool,
    log,
) -> dict[str, ModelEntry]:
    """Each verified full-integer mode's deploy file compiled for each accelerator (npu.py).

    The deploy file is what a microcontroller flashes (one subgraph, no
    strings; bit-identical to the named model), so it is what Vela gets. A
    model without one (a dynamic sequence length: an NPU needs fixed shapes)
    is left out, with a note. `unverified` (--allow-parity-failure): modes
    kept unverified are compiled too (what maps to the NPU does not depend on
    parity); their entries say `verified: false` and the table marks them.
    """
    from .summary import npu_line

    done = dict(kept)
    for mode, entry in kept.items():
        if mode not in INTEGER_IO or not (entry.verified or unverified):
            continue
        if entry.deploy is None:
            log(
                f"  {mode:<8} npu: not compiled ("
                + (
                    "a dynamic sequence length; an NPU needs fixed shapes"
                    if entry.dynamic_length
                    else "no deploy file"
                )
                + ")"
            )
            continue
        model = (staging / entry.deploy.file).read_bytes()
        targets = []
        with tempfile.TemporaryDirectory(prefix="keras-mha-vela-") as scratch:
            for accelerator in accelerators:
                found = compile_for(model, accelerator, pathlib.Path(scratch) / accelerator.name)
                if found.file is not None:
                    compiled = pathlib.Path(scratch) / accelerator.name / found.file
                    ref = add_file(staging, compiled_name(mode, accelerator), compiled.read_bytes())
                    found = dataclasses.replace(found, file=ref.file, sha256=ref.sha256)
                log(npu_line(mode, found))
                targets.append(found)
        report = NpuReport(vela=vela, source=entry.deploy.file, targets=tuple(targets))
        done[mode] = dataclasses.replace(entry, npu=report)
    return done


def _sized(kept: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
    """Each entry's size against float32's, when float32 is kept."""
    if "float32" not in kept:
        return kept
    base = kept["float32"].bytes
    return {
        m: dataclasses.replace(e, size_vs_float32=round(e.bytes / base, 4)) for m, e in kept.items()
    }
