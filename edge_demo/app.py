"""keras-mha-edge: run an exported keras-mha bundle on the device, without TensorFlow.

By default, a parity run: every eval sample through each selected mode at
batch 1, compared with the float Keras model's softmax and the manifest's
thresholds. `--sample N` and `--text "..."` classify one input instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys

from .bundle import Bundle, open_bundle
from .errors import BadInput
from .parity import ModeResult, run_mode
from .report import parity_table, prediction_table, render_features, write_json
from .runtime import (
    EdgeModel,
    InferenceError,
    Runtime,
    probe_model,
    select_runtime,
    to_input,
)

PROG = "keras-mha-edge"
DEBUG_ENV = "KERAS_MHA_EDGE_DEBUG"
EPILOG = """\
exit codes: 0 every selected mode meets its thresholds; 1 a parity failure
(or the runtime failed running a loaded model); 2 bad input (bundle files, flags, runtime), one line on stderr; 3 an internal
error (set KERAS_MHA_EDGE_DEBUG=1 for its traceback).
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
    sample: int | None = None
    text: str | None = None


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (BadInput), not usage + message."""

    def error(self, message: str):  # type: ignore[override]
        raise BadInput("usage", f"{message} (see {self.prog} --help)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a sample index, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a sample index >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (`--help` shows the exit codes)."""
    from . import __version__

    parser = _Parser(
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
        choices=("auto", "litert", "tflite-runtime"),
        default="auto",
        help="TFLite runtime: auto = LiteRT, else tflite-runtime (default auto)",
    )
    parser.add_argument(
        "--threads", type=_positive, default=1, metavar="N", help="interpreter threads (default 1)"
    )
    parser.add_argument(
        "--repeat",
        type=_positive,
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
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--sample", type=_index, metavar="N", help="classify eval sample N and show it"
    )
    what.add_argument("--text", metavar='"..."', help="classify a sentence (text bundles)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_args(argv: list[str] | None = None) -> DemoOptions:
    """Parse the command line into DemoOptions (raises BadInput on a usage error)."""
    args = build_parser().parse_args(argv)
    if args.json_path is not None and (args.sample is not None or args.text is not None):
        raise BadInput("--json", "applies to the parity run, not to --sample or --text")
    return DemoOptions(
        bundle=args.bundle,
        quant=args.quant,
        runtime=args.runtime,
        threads=args.threads,
        repeat=args.repeat,
        json_path=args.json_path,
        sample=args.sample,
        text=args.text,
    )


# --- what runs ------------------------------------------------------------------


def _check_request(bundle: Bundle, options: DemoOptions) -> None:
    """Flags that depend on the bundle, checked before any runtime is imported."""
    samples = bundle.manifest.eval.samples
    if options.sample is not None and options.sample >= samples:
        raise BadInput(
            "--sample", f"{options.sample} is out of range: eval.npz has samples 0..{samples - 1}"
        )
    if options.text is not None and bundle.vocab is None:
        raise BadInput(
            "--text",
            f"needs a text bundle with vocab.json; {bundle.path('manifest.json')} has "
            f'"vocab": null (dataset {bundle.manifest.dataset!r})',
        )
    if options.json_path is not None:
        parent = options.json_path.resolve().parent
        if not parent.is_dir():
            raise BadInput("--json", f"directory {parent} does not exist")
        if options.json_path.is_dir():
            raise BadInput("--json", f"{options.json_path} is a directory")


def plan_modes(bundle: Bundle, runtime: Runtime) -> dict[str, ModeResult | None]:
    """Each selected mode -> None (runnable) or a skipped ModeResult.

    Skips a mode the manifest says this runtime cannot load, or one the runtime
    refuses in the child-process probe for lack of an op or kernel. A model
    that crashes or is rejected otherwise raises BadInput.
    """
    plan: dict[str, ModeResult | None] = {}
    for mode in bundle.modes:
        spec = bundle.manifest.models[mode]
        if spec.runtimes.get(runtime.name) is False:
            reason = f"manifest.json says {runtime.name} cannot run {spec.file}"
            plan[mode] = ModeResult(mode, "skipped", reason=reason)
            continue
        inp = spec.input
        try:  # the first eval sample, as the manifest says the model takes it
            sample = to_input(bundle.eval.x[:1], inp.dtype, inp.scale, inp.zero_point)
        except ValueError as exc:
            raise BadInput(bundle.path("manifest.json"), f"models.{mode}.input: {exc}") from None
        probe = probe_model(runtime, bundle.model_bytes[mode], bundle.path(spec.file), sample)
        if probe.ok:
            probe.check_manifest(spec, bundle.path(spec.file))
        plan[mode] = None if probe.ok else ModeResult(mode, "skipped", reason=probe.reason)
    if all(result is not None for result in plan.values()):
        reasons = "; ".join(f"{m}: {r.reason}" for m, r in plan.items() if r is not None)
        raise BadInput(runtime.name, f"none of the selected modes can run here ({reasons})")
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
    print(parity_table(results))
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
        write_json(
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
        spec = bundle.manifest.models[mode]
        model = EdgeModel(
            runtime, bundle.model_bytes[mode], options.threads, str(bundle.path(spec.file))
        )
        try:
            model.check_manifest(spec)
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
        print(f'text: "{bundle.vocab.decode(x)}"')
    else:
        print(render_features(x))
    best = int(reference.argmax())
    rows = [("keras (float reference)", bundle.labels[best], f"{reference[best]:.4f}")]
    predictions, errors = _classify(bundle, runtime, options, plan, x)
    print(prediction_table(rows + predictions))
    for note in _skip_notes(plan) + errors:
        print(note)
    return 1 if errors else 0


def run_text(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """`--text "..."`: tokenize with vocab.json and classify in each mode."""
    vocab = bundle.vocab
    encoded = vocab.encode(options.text)
    if not encoded.words:
        raise BadInput(
            "--text", f"no words found in {options.text!r} (token_pattern {vocab.token_pattern!r})"
        )
    print(f'\ntext: "{options.text}"')
    notes = []
    if encoded.unknown:
        notes.append(f"unknown to the vocabulary: {', '.join(sorted(set(encoded.unknown)))}")
    if encoded.truncated:
        notes.append(f"truncated to max_length {vocab.max_length} of {len(encoded.words)} tokens")
    print(
        f"model input: {vocab.decode(encoded.ids)!r} = {encoded.ids.tolist()}"
        + (f" ({'; '.join(notes)})" if notes else "")
    )
    predictions, errors = _classify(bundle, runtime, options, plan, encoded.ids)
    print(prediction_table(predictions))
    for note in _skip_notes(plan) + errors:
        print(note)
    return 1 if errors else 0


def run(options: DemoOptions) -> int:
    """Validate the bundle, import the runtime, probe the models, run."""
    bundle = open_bundle(options.bundle, options.quant)
    _check_request(bundle, options)
    runtime = select_runtime(options.runtime)
    print(_header(bundle, runtime, options), flush=True)
    for mode in bundle.modes:
        if bundle.manifest.models[mode].verified is False:
            print(f"note: manifest.json marks {mode} as not verified at export")
    plan = plan_modes(bundle, runtime)
    if options.text is not None:
        return run_text(bundle, runtime, options, plan)
    if options.sample is not None:
        return run_sample(bundle, runtime, options, plan)
    return run_parity(bundle, runtime, options, plan)


def main(argv: list[str] | None = None) -> int:
    """The console script: never a traceback for bad input (exit 2)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="replace")  # µ and Δ on an ASCII terminal
        except (AttributeError, ValueError):
            pass
    try:
        return run(parse_args(argv))
    except BadInput as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        print(
            f"{PROG}: internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for a traceback)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
