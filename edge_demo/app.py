"""keras-mha-edge: run an exported keras-mha bundle on the device, without TensorFlow.

By default, a parity run: every eval sample through each selected mode at
batch 1, compared with the float Keras model's softmax and the manifest's
thresholds. `--sample N` and `--text "..."` classify one input instead;
with `--view FILE.html` they also write the head view of one mode's
attention weights (app_view.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

from .app_view import check_view_path, view_mode, write_view
from .bundle import Bundle, open_bundle
from .command import (
    DEBUG_ENV,
    Parser,
    UsageError,
    check_writable,
    nonnegative_int,
    positive_int,
    run_main,
)
from .deployed import runtime_content, runtime_entry
from .files import write_json_atomic
from .probe import probe_model
from .report import parity_table, prediction_table, render_features
from .runtime import RUNTIMES, EdgeModel, InferenceError, Runtime, select_runtime
from .score import ModeResult, run_mode

PROG = "keras-mha-edge"
EPILOG = f"""\
exit codes: 0 every selected mode meets its thresholds; 1 a parity failure
(or the runtime failed running a loaded model); 2 bad input (bundle files,
flags, runtime), one line on stderr; 3 an internal error (set {DEBUG_ENV}=1
for its traceback); 130 interrupted.
Modes the runtime cannot run (tflite-runtime and dynamic-range or int16x8
models) are skipped, not failed."""


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """The command line, parsed."""

    bundle: pathlib.Path
    quant: str | None = None  # None or "all" = every mode in the manifest
    runtime: str = "auto"  # "auto" | "litert" | "tflite-runtime"
    threads: int = 1
    repeat: int = 1
    json_path: pathlib.Path | None = None
    wide: bool = False  # the parity table with every column
    sample: int | None = None
    text: str | None = None
    view: pathlib.Path | None = None
    debug: str | None = None  # --debug MODE (debug_cli.py)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (`--help` shows the exit codes)."""
    from . import __version__

    parser = Parser(
        prog=PROG,
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "bundle",
        type=pathlib.Path,
        metavar="BUNDLE_DIR",
        help="bundle directory (manifest.json, models, eval.npz)",
    )
    parser.add_argument(
        "--quant",
        default="all",
        metavar="all|MODE,...",
        help="modes to run: all (default) or e.g. float32,int8",
    )
    parser.add_argument(
        "--runtime",
        choices=("auto", *RUNTIMES),
        default="auto",
        help=f"TFLite runtime: auto = the first of {', '.join(RUNTIMES)} that imports (default auto)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="N",
        help="interpreter threads (default 1)",
    )
    parser.add_argument(
        "--repeat",
        type=positive_int,
        default=1,
        metavar="N",
        help="passes over eval.npz for latency (default 1)",
    )
    parser.add_argument(
        "--json",
        type=pathlib.Path,
        dest="json_path",
        metavar="FILE",
        help="also write the parity report as JSON",
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="the parity table with every column: mean |Δp|, the int8 attention tail, "
        "p90/p99 latency, load time, peak memory and the manifest's thresholds",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--sample", type=nonnegative_int, metavar="N", help="classify eval sample N and show it"
    )
    what.add_argument("--text", metavar='"..."', help="classify a sentence (text bundles)")
    parser.add_argument(
        "--view",
        type=pathlib.Path,
        metavar="FILE.html",
        help="with --sample or --text: write a head view of the attention weights "
        "(mode: --quant MODE, default the first of int8, int16x8, float32)",
    )
    parser.add_argument(
        "--debug",
        metavar="MODE",
        help="per tensor (and head), MODE's error against float32, worst first, on LiteRT "
        "(all eval samples, or --sample N)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_args(argv: list[str] | None = None) -> DemoOptions:
    """Parse the command line into DemoOptions (a usage error exits 2, one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.json_path is not None and (args.sample is not None or args.text is not None):
        parser.error("--json applies to the parity run, not to --sample or --text")
    if args.wide and (args.sample is not None or args.text is not None):
        parser.error("--wide applies to the parity table, not to --sample or --text")
    if args.debug is not None:
        for flag, value in (
            ("--text", args.text),
            ("--json", args.json_path),
            ("--wide", args.wide or None),
            ("--view", args.view),
        ):
            if value is not None:
                parser.error(f"--debug cannot be combined with {flag}")
    if args.view is not None and args.sample is None and args.text is None:
        parser.error('--view needs --sample N or --text "..." (the input to show)')
    return DemoOptions(
        bundle=args.bundle,
        quant=args.quant,
        runtime=args.runtime,
        threads=args.threads,
        repeat=args.repeat,
        json_path=args.json_path,
        wide=args.wide,
        sample=args.sample,
        text=args.text,
        view=args.view,
        debug=args.debug,
    )


# --- what runs ------------------------------------------------------------------


def _check_request(bundle: Bundle, options: DemoOptions) -> None:
    """Flags that depend on the bundle, checked before any runtime is imported."""
    samples = bundle.manifest.eval.samples
    if options.sample is not None and options.sample >= samples:
        raise UsageError(
            f"{options.sample} is out of range: eval.npz has samples 0..{samples - 1}", "--sample"
        )
    if options.text is not None and bundle.vocab is None:
        raise UsageError(
            f"needs a text bundle with vocab.json; {bundle.path('manifest.json')} has "
            f'"vocab": null (dataset {bundle.manifest.dataset!r})',
            "--text",
        )
    if options.json_path is not None:
        if options.json_path.is_dir():
            raise UsageError(f"{options.json_path} is a directory", "--json")
        check_writable(options.json_path, "--json")
    if options.view is not None:
        check_view_path(options.view)
        if options.runtime == "tflite-micro":  # it runs deploy files: no attention signature
            raise UsageError("needs the attention signature; use --runtime litert", "--view")


def plan_modes(bundle: Bundle, runtime: Runtime) -> dict[str, ModeResult | None]:
    """Each selected mode -> None (runnable) or a skipped ModeResult.

    Skips a mode the manifest says this runtime cannot load, or one the runtime
    refuses in the child-process probe for lack of an op or kernel. A model
    that crashes or is rejected otherwise raises UsageError.
    """
    plan: dict[str, ModeResult | None] = {}
    for mode in bundle.modes:
        entry = bundle.manifest.models[mode]
        if entry.runtimes.get(runtime.name) is False:
            reason = f"manifest.json says {runtime.name} cannot run {entry.file}"
            why = entry.micro.get("reason") if runtime.name == "tflite-micro" else None
            plan[mode] = ModeResult(mode, "skipped", reason=f"{reason}: {why}" if why else reason)
            continue
        entry = runtime_entry(entry, runtime)  # TFLM: the deploy file
        try:  # the first eval sample, as the manifest says the model takes it
            sample = entry.input.quantize(bundle.eval.x[:1])
        except ValueError as exc:
            raise UsageError(f"models.{mode}.input: {exc}", bundle.path("manifest.json")) from None
        content = runtime_content(bundle, mode, runtime)
        probe = probe_model(runtime, content, bundle.path(entry.file), sample)
        if probe.ok:
            probe.check_manifest(entry, bundle.path(entry.file))
        plan[mode] = None if probe.ok else ModeResult(mode, "skipped", reason=probe.reason)
    if all(result is not None for result in plan.values()):
        reasons = "; ".join(f"{m}: {r.reason}" for m, r in plan.items() if r is not None)
        raise UsageError(f"none of the selected modes can run here ({reasons})", runtime.name)
    return plan


def _header(bundle: Bundle, runtime: Runtime, options: DemoOptions) -> str:
    m = bundle.manifest
    info = runtime.info()
    return (
        f"bundle   {bundle.root} (dataset {m.dataset or '?'}, {m.eval.samples} eval samples, "
        f"{m.eval.num_classes} classes, float accuracy {m.eval.float_accuracy:.4f})\n"
        f"runtime  {info['name']} {info['version']} ({info['module']}), numpy {info['numpy']}, "
        f"Python {info['python']} {info['machine']}; threads {options.threads}, repeat {options.repeat}"
    )


def run_parity(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """The default run: the table, optional JSON; 0 all pass, 1 a failure."""
    results = [
        skipped or run_mode(bundle, mode, runtime, options.threads, options.repeat)
        for mode, skipped in plan.items()
    ]
    print()
    print(parity_table(results, wide=options.wide))
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
            {
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
        print(f"wrote {options.json_path}")
    return code


def _classify(
    bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict, x
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(mode, prediction, confidence) rows for one input `x`, and notes on errors."""
    rows, errors = [], []
    for mode, skipped in plan.items():
        if skipped is not None:
            rows.append((mode, "skipped", "-"))
            continue
        entry = runtime_entry(bundle.manifest.models[mode], runtime)
        model = EdgeModel(
            runtime,
            runtime_content(bundle, mode, runtime),
            options.threads,
            str(bundle.path(entry.file)),
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
        rows.append((mode, bundle.labels[best], f"{probs[best]:.4f}"))
    return rows, errors


def _skip_notes(plan: dict) -> list[str]:
    return [f"{mode}: skipped: {r.reason}" for mode, r in plan.items() if r is not None]


def run_sample(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """`--sample N`: show eval sample N, its label and each mode's prediction."""
    i = options.sample
    x, label, reference = bundle.eval.x[i], int(bundle.eval.y[i]), bundle.eval.probs[i]
    print(
        f"\nsample {i} of {bundle.manifest.eval.samples} in eval.npz: label {bundle.labels[label]!r}"
    )
    if bundle.vocab is not None:
        print(f'text: "{" ".join(bundle.vocab.decode(x))}"')
    else:
        print(render_features(x))
    best = int(reference.argmax())
    rows = [("keras (float reference)", bundle.labels[best], f"{reference[best]:.4f}")]
    predictions, errors = _classify(bundle, runtime, options, plan, x)
    print(prediction_table(rows + predictions))
    for note in _skip_notes(plan) + errors:
        print(note)
    return 1 if errors else 0


def run_text(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> tuple:
    """`--text "..."`: tokenize with vocab.json and classify in each mode.

    Returns (exit code, the model input ids, the words cut off by max_length).
    """
    vocab = bundle.vocab
    encoded = vocab.analyze(options.text)
    if not encoded.words:
        raise UsageError(
            f"no words found in {options.text!r} (token_pattern {vocab.token_pattern!r})", "--text"
        )
    print(f'\ntext: "{options.text}"')
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


def run(options: DemoOptions) -> int:
    """Validate the bundle, import the runtime, probe the models, run."""
    if options.debug is not None:
        from .debug_cli import run_debug

        return run_debug(options.bundle, options.debug, options.sample, options.runtime)
    bundle = open_bundle(options.bundle, options.quant)
    _check_request(bundle, options)
    runtime = select_runtime(options.runtime)
    print(_header(bundle, runtime, options), flush=True)
    for mode in bundle.modes:
        if bundle.manifest.models[mode].verified is False:
            print(f"note: manifest.json marks {mode} as not verified at export")
    plan = plan_modes(bundle, runtime)
    if options.view is not None:
        view_mode(bundle, [m for m, skipped in plan.items() if skipped is None])  # before output
    if options.text is not None:
        code, x, dropped = run_text(bundle, runtime, options, plan)
    elif options.sample is not None:
        code, x, dropped = run_sample(bundle, runtime, options, plan), None, ()
    else:
        return run_parity(bundle, runtime, options, plan)
    if options.view is not None:
        mode = view_mode(bundle, [m for m, skipped in plan.items() if skipped is None])
        notes = write_view(
            bundle,
            runtime,
            mode,
            bundle.eval.x[options.sample] if x is None else x,
            options.view,
            threads=options.threads,
            sample=options.sample,
            text=options.text,
            dropped=dropped,
        )
        print(f"wrote {options.view} ({'; '.join(notes)})")
    return code


def main(argv: list[str] | None = None) -> int:
    """The console script: one line and exit 2 for bad input, never a traceback."""
    return run_main(PROG, lambda: run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
