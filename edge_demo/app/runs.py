"""What `keras-mha-edge` runs once the bundle is open and the runtime imported.

`plan_modes` probes each selected mode (skipped, or runnable); then the
parity run (`run_parity`: the table, optional JSON), `--sample N`
(`run_sample`) or `--text "..."` (`run_text`). cli.py parses the command
line and chooses; report.py formats.
"""

from __future__ import annotations

import numpy as np

from bundle_contract.bundle import Bundle
from bundle_contract.entries import ModelEntry
from bundle_contract.errors import UsageError, safe, shown
from bundle_contract.files import write_bytes_atomic, write_json_atomic

from ..runtimes.model import EdgeModel, InferenceError
from ..runtimes.policy import runtime_content, runtime_entry
from ..runtimes.probe import probe_models
from ..runtimes.runtime import MICRO_RUNTIME, Runtime
from ..runtimes.score import ModeResult, run_mode
from .options import DemoOptions
from .report import parity_table, prediction_table, render_features


def plan_modes(bundle: Bundle, runtime: Runtime) -> dict[str, ModeResult | None]:
    """Each selected mode -> None (runnable) or a skipped ModeResult.

    Skips a mode the manifest says this runtime cannot load, or one the runtime
    refuses in the child-process probe for lack of an op or kernel, unless the
    manifest says this runtime ran the mode at export: then the model is not
    the one export made, and the mode fails (a "failed" ModeResult, exit 1).
    A model that crashes or is rejected otherwise raises UsageError.
    """
    plan: dict[str, ModeResult | None] = dict.fromkeys(bundle.modes)
    # What each mode to probe needs, in order; a problem is raised in its turn,
    # after the modes before it were probed, as if each were probed in turn.
    todo: list[tuple[str, ModelEntry, bytes, np.ndarray | None, UsageError | None]] = []
    for mode in bundle.modes:
        entry = bundle.manifest.models[mode]
        if entry.runtimes.get(runtime.name) is False:
            reason = f"manifest.json says {runtime.name} cannot run {entry.file}"
            why = entry.micro.get("reason") if runtime.name == MICRO_RUNTIME else None
            plan[mode] = ModeResult(mode, "skipped", reason=f"{reason}: {why}" if why else reason)
            continue
        entry = runtime_entry(entry, runtime)  # TFLM: the deploy file
        try:
            sample = None  # a file that generates: zero ids, an empty cache (its
            if not bundle.task.generates:  # signatures are checked when it runs)
                try:  # the first eval sample, as the manifest says the model takes it
                    sample = entry.input.quantize(bundle.eval.x[:1])
                except ValueError as exc:
                    raise UsageError(
                        f"models.{mode}.input: {exc}", bundle.path("manifest.json")
                    ) from None
            todo.append((mode, entry, runtime_content(bundle, mode, runtime), sample, None))
        except UsageError as exc:
            todo.append((mode, entry, b"", None, exc))
            break
    probes = probe_models(
        runtime,
        [
            (content, bundle.path(entry.file), sample)
            for _, entry, content, sample, bad in todo
            if not bad
        ],
    )
    for mode, entry, _, sample, problem in todo:
        if problem is not None:
            raise problem
        probe = next(probes)
        if probe.ok and sample is not None:
            probe.check_manifest(entry, bundle.path(entry.file))
        if probe.ok:
            plan[mode] = None
        elif entry.runtimes.get(runtime.name) is True:
            plan[mode] = ModeResult(
                mode,
                "failed",
                thresholds=entry.thresholds,
                failures=[
                    f"{bundle.path(entry.file)}: {probe.reason}, although manifest.json says "
                    f"{runtime.name} ran it at export (models.{mode}.runtimes): a corrupted model"
                ],
            )
        else:
            plan[mode] = ModeResult(mode, "skipped", reason=probe.reason)
    if all(result is not None and result.status == "skipped" for result in plan.values()):
        reasons = "; ".join(f"{m}: {r.reason}" for m, r in plan.items() if r is not None)
        raise UsageError(f"none of the selected modes can run here ({reasons})", runtime.name)
    return plan


def header(bundle: Bundle, runtime: Runtime, options: DemoOptions) -> str:
    m = bundle.manifest
    info = runtime.info()
    what = m.task.describe(m.eval.num_classes, m.eval.float_accuracy, m.max_length)
    return (
        f"bundle   {shown(bundle.root)} (dataset {m.dataset or '?'}, {m.eval.samples} eval samples, "
        f"{what})\n"
        f"runtime  {info['name']} {info['version']} ({info['module']}), numpy {info['numpy']}, "
        f"Python {info['python']} {info['machine']}; threads {options.threads}, repeat {options.repeat}"
    )


def run_parity(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """The default run: the table, optional JSON; 0 all pass, 1 a failure."""
    results = [
        skipped
        or run_mode(bundle, mode, runtime, options.threads, options.repeat, options.raw is not None)
        for mode, skipped in plan.items()
    ]
    print()
    print(parity_table(results, wide=options.wide, task=bundle.task, labelled=bundle.eval.labelled))
    ran = [r for r in results if r.status != "skipped"]
    failed = [r.mode for r in ran if not r.passed]
    skipped = len(results) - len(ran)
    tail = f", {skipped} skipped" if skipped else ""
    print()
    if failed:
        print(
            f"FAIL: {', '.join(failed)} miss(es) the manifest's thresholds ({len(ran)} run{tail})"
        )
    else:
        print(f"PASS: {len(ran)} of {len(ran)} modes run meet the manifest's thresholds{tail}")
    code = 1 if failed else 0
    if options.json_path is not None:
        info = runtime.info() | {"threads": options.threads, "repeat": options.repeat}
        write_json_atomic(
            options.json_path,
            flag="--json",
            protected=bundle.root,
            data={
                "runtime": info,
                "bundle": {
                    "path": str(bundle.root.resolve()),
                    "dataset": bundle.manifest.dataset,
                    "samples": bundle.manifest.eval.samples,
                    "float_accuracy": bundle.manifest.eval.float_accuracy,
                    "created_by": bundle.manifest.created_by,
                },
                "modes": {r.mode: r.to_json() for r in results},
                "passed": not failed,
                "exit_code": code,
            },
        )
        print(f"wrote {shown(options.json_path)}")
    if options.raw is not None:
        write_raw(options.raw, results, bundle)
    return code


def write_raw(path, results: list[ModeResult], bundle: Bundle) -> None:
    """--raw: each mode run's outputs as the runtime gave them, one array per mode
    (a mode that failed while running has none), written whole or not at all."""
    import io

    import numpy as np

    arrays = {r.mode: r.raw for r in results if r.raw is not None}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(path, buffer.getvalue(), "--raw", protected=bundle.root)
    print(f"wrote {shown(path)}: raw outputs of {', '.join(arrays) or 'no mode'}")


def _classify(
    bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict, x
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(mode, prediction, confidence) rows for one input `x`, and notes on errors."""
    rows, errors = [], []
    for mode, skipped in plan.items():
        if skipped is not None and skipped.status == "failed":
            rows.append((mode, "error", "-"))
            errors.extend(f"{mode}: error: {failure}" for failure in skipped.failures)
            continue
        if skipped is not None:
            rows.append((mode, "skipped", "-"))
            continue
        entry = runtime_entry(bundle.manifest.models[mode], runtime)
        model = EdgeModel(
            runtime,
            runtime_content(bundle, mode, runtime),
            options.threads,
            str(bundle.path(entry.file)),
            bundle.pad_id,
        )
        try:
            model.check_manifest(entry)
            probs = model.predict(x[None])[0]
        except InferenceError as exc:
            rows.append((mode, "error", "-"))
            errors.append(f"{mode}: error: {exc}")
            continue
        finally:
            model.close()
        best = int(probs.argmax())
        rows.append((mode, bundle.labels[best], f"{probs[best]:.4f}", probs))
    return rows, errors


def _labels_shown(bundle: Bundle) -> tuple[str, ...] | None:
    """A text classifier's labels, whose probabilities its prediction rows list."""
    return bundle.labels if bundle.tokenizer is not None else None


def _skip_notes(plan: dict) -> list[str]:
    return [
        f"{mode}: skipped: {r.reason}"
        for mode, r in plan.items()
        if r is not None and r.status == "skipped"
    ]


def run_sample(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """`--sample N`: show eval sample N, its label and each mode's prediction."""
    i = options.sample
    x, reference = bundle.eval.x[i], bundle.eval.probs[i]
    label = f": label {bundle.labels[int(bundle.eval.y[i])]!r}" if bundle.eval.labelled else ""
    print(f"\nsample {i} of {bundle.manifest.eval.samples} in eval.npz{label}")
    if bundle.tokenizer is not None:  # the eval sentence, at its own length
        print(f'text: "{shown(bundle.texts[i], 500)}"')
        x = x[: int(EdgeModel.own_lengths(x[None], bundle.pad_id)[0])]
    elif bundle.vocab is not None:
        print(f'text: "{" ".join(bundle.vocab.decode(x))}"')
    elif x.ndim == 1 and x.dtype.kind in "iu":  # token ids without a vocabulary
        print(f"token ids: {' '.join(str(int(i)) for i in x)}")
    else:
        print(render_features(x))
    best = int(reference.argmax())
    rows = [("keras (float reference)", bundle.labels[best], f"{reference[best]:.4f}", reference)]
    predictions, errors = _classify(bundle, runtime, options, plan, x)
    print(prediction_table(rows + predictions, _labels_shown(bundle)))
    for note in _skip_notes(plan) + errors:
        print(note)
    return 1 if errors else 0


def run_text(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> tuple:
    """`--text "..."`: tokenize with vocab.json (or the bundle's tokenizer.json) and
    classify in each mode.

    Returns (exit code, the model input ids, the words cut off by max_length).
    """
    if bundle.tokenizer is not None:
        return _run_subword_text(bundle, runtime, options, plan)
    vocab = bundle.vocab
    try:
        encoded = vocab.analyze(options.text)
    except UsageError as exc:
        raise UsageError(exc.problem, "--text") from None
    if not encoded.words:
        raise UsageError(
            f"no words found in {safe(options.text, 200)!r} (token_pattern {vocab.token_pattern!r})",
            "--text",
        )
    print(f'\ntext: "{shown(options.text, 500)}"')
    notes = []
    if encoded.unknown:
        notes.append(f"unknown to the vocabulary: {', '.join(sorted(set(encoded.unknown)))}")
    if encoded.truncated:
        notes.append(f"truncated to max_length {vocab.max_length} of {len(encoded.words)} tokens")
    print(
        f"model input: {' '.join(vocab.decode(encoded.ids))!r} = {encoded.ids.tolist()}"
        + (f" ({'; '.join(notes)})" if notes else "")
    )
    predictions, errors = _classify(bundle, runtime, options, plan, encoded.ids)
    print(prediction_table(predictions))
    if len(encoded.unknown) == len(encoded.words):
        print(
            "note: every word is unknown to the vocabulary, so the model saw only "
            f"{vocab.tokens[vocab.unk_id]!r} tokens: the prediction says nothing about this text"
        )
    for note in _skip_notes(plan) + errors:
        print(note)
    dropped = tuple(encoded.words[vocab.max_length :])
    return (1 if errors else 0), encoded.ids, dropped


def _run_subword_text(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict):
    """`--text` for a text classifier: the checkpoint's tokenizer, the label and every
    class's probability in each mode."""
    tokenizer = bundle.tokenizer
    try:
        ids, lengths = tokenizer.encode([options.text])
    except UsageError as exc:
        raise UsageError(exc.problem, "--text") from None
    pieces, _ = tokenizer.pieces(options.text)
    print(f'\ntext: "{shown(options.text, 500)}"')
    cut = f" (truncated to max_length {tokenizer.max_length})" if len(pieces) > lengths[0] else ""
    print(
        f"word pieces ({int(lengths[0])}): {' '.join(shown(p, 40) for p in pieces[: int(lengths[0])])}{cut}"
    )
    predictions, errors = _classify(bundle, runtime, options, plan, ids[0])
    print(prediction_table(predictions, _labels_shown(bundle)))
    for note in _skip_notes(plan) + errors:
        print(note)
    return (1 if errors else 0), ids[0], ()
