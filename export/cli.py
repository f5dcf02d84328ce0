"""Export a trained keras-mha model as quantized, verified TFLite models.

Converts RUN_DIR/model.keras (or --model) at batch 1 in each mode (float32,
dynamic, float16, int8, int16x8), checks each graph (builtin ops only, int8
fully integer), runs it over eval.npz with LiteRT and compares it with the
float model, then writes the bundle described in docs/artifacts.md.

Verified means the edge demo passes: the staged bundle is opened with the
device's loader and each mode scored with the device's own code. A mode is
verified by its task's outputs; a verified mode whose attention weights miss
their bound is kept, its view marked not faithful (with the figures).

By default (--quant all) export keeps the modes that verify and names each
one it left out, with the figures it missed and the command that would make
it hold. Modes named with --quant must all verify.

Exit status: 0 when at least one mode is verified and, if --quant names
modes, every one of them is (or with --allow-parity-failure); 1 when no
mode is verified, or a mode --quant names fails conversion or
verification; 2 on bad input (one line; nothing is written); 3 on an
internal error (KERAS_MHA_DEBUG=1 shows it); 130 when interrupted (nothing
is written).
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import sys

from bundle_contract.errors import Parser, run_main

PROG = "keras-mha-export"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; `--help` answers without importing TensorFlow."""
    parser = Parser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_dir",
        nargs="?",
        type=pathlib.Path,
        metavar="RUN_DIR",
        help="run directory written by keras-mha-train or keras-mha-import (model.keras, "
        "metrics.json, eval.npz, ...)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        metavar="BUNDLE_DIR",
        help="bundle directory (default: RUN_DIR/bundle)",
    )
    parser.add_argument(
        "--quant",
        default="all",
        metavar="MODES",
        help="'all' or a comma list of float32,dynamic,float16,int8,int16x8 (default: all, "
        "which keeps the modes that verify; a mode named here must verify)",
    )
    parser.add_argument(
        "--npu",
        metavar="ACCELERATORS",
        help="also compile each verified full-integer mode for Arm Ethos-U NPUs with Vela: "
        "'all' or a comma list of ethos-u55-128,ethos-u65-256,ethos-u85-256 "
        "(needs ethos-u-vela; figures are Vela's estimates)",
    )
    parser.add_argument(
        "--length",
        type=int,
        metavar="L",
        help="export an encoder (token ids of any length) at the fixed length L instead: "
        "what an NPU and TensorFlow Lite Micro need (eval and calibration padded to L; "
        "sentences are cut at L on the device)",
    )
    parser.add_argument(
        "--context",
        type=int,
        metavar="S",
        help="a language model's run: the positions its file's KV cache holds, prompt and "
        "answer together (default: 256, or the model's own limit if smaller)",
    )
    parser.add_argument(
        "--prefill",
        type=int,
        metavar="P",
        help="a language model's run: prompt tokens one prefill call takes (default 16)",
    )
    parser.add_argument(
        "--allow-parity-failure",
        action="store_true",
        help="exit 0 and keep models that fail verification (marked unverified), "
        "even a mode --quant names",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing non-empty bundle"
    )
    files = parser.add_argument_group("explicit files instead of RUN_DIR")
    files.add_argument("--model", type=pathlib.Path, metavar="FILE.keras")
    files.add_argument("--calibration", type=pathlib.Path, metavar="FILE.npz")
    files.add_argument("--eval", type=pathlib.Path, metavar="FILE.npz")
    files.add_argument(
        "--labels", type=pathlib.Path, metavar="FILE.json", help="default: class indices"
    )
    files.add_argument("--vocab", type=pathlib.Path, metavar="FILE.json")
    parser.add_argument("--dataset", help="dataset name for the manifest (default: metrics.json)")
    parser.add_argument(
        "--import-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE before loading the model (its custom layers); repeatable",
    )
    return parser


def _source(args: argparse.Namespace, parser: argparse.ArgumentParser):
    from .source import SourcePaths

    explicit = {name: getattr(args, name) for name in ("model", "calibration", "eval")}
    extras = [f"--{name}" for name in ("labels", "vocab") if getattr(args, name) is not None]
    if args.run_dir is not None:
        given = [f"--{name}" for name, value in explicit.items() if value is not None] + extras
        if given:
            parser.error(f"give RUN_DIR or --model/--calibration/--eval, not both ({given[0]})")
        return args.run_dir
    missing = [f"--{name}" for name, value in explicit.items() if value is None]
    if len(missing) == 3:
        parser.error("give RUN_DIR, or --model, --calibration and --eval")
    if missing:
        parser.error(f"--model, --calibration and --eval go together; missing {missing[0]}")
    if args.out is None:
        parser.error("--out is required with --model")
    return SourcePaths(
        model=args.model,
        calibration=args.calibration,
        eval=args.eval,
        labels=args.labels,
        vocab=args.vocab,
    )


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    source = _source(args, parser)
    if args.length is not None:  # before TensorFlow, like --npu
        from .source import check_length

        check_length(args.length)
    if args.npu:  # before TensorFlow: one line for a bad request or no Vela
        from .bundle import parse_modes
        from .npu import npu_request

        npu_request(args.npu, parse_modes(args.quant))
    from keras_mha.quiet_tensorflow import import_tensorflow  # keras_mha only past --help

    import_tensorflow()  # first: its start-up logs filtered (keras_mha/quiet_tensorflow.py)
    from .bundle import ExportFailed, export_bundle, names_modes
    from .summary import left_out, npu_table, summary_table, unfaithful_views

    # What is imported now lives until the command ends: out of the garbage
    # collector's sight, each gc.collect() of the converter and the device's
    # scoring (one a model) walks only what export makes (0.2 s to a few ms).
    gc.collect()
    gc.freeze()

    def log(line: str) -> None:
        print(line, flush=True)

    try:
        manifest = export_bundle(
            source,
            args.out,
            args.quant,
            overwrite=args.overwrite,
            allow_parity_failure=args.allow_parity_failure,
            dataset=args.dataset,
            import_modules=tuple(args.import_module),
            npu=args.npu,
            length=args.length,
            context=args.context,
            prefill=args.prefill,
            log=log,
        )
    except ExportFailed as error:
        print()
        print(summary_table(error.manifest))
        # the error names each mode's first reason: a conversion's is all there is
        for line in left_out(error.manifest, args.run_dir, converted_only=True):
            print(f"{PROG}: {line}", file=sys.stderr)
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    out = args.out if args.out is not None else pathlib.Path(args.run_dir) / "bundle"
    print()
    print(summary_table(manifest))
    views = unfaithful_views(manifest, args.run_dir)
    if views:
        print()
        print("\n".join(views))
    if args.npu:
        print(f"\nArm Ethos-U, Vela {manifest_vela(manifest)} (estimates; nothing ran on an NPU):")
        name = out.parent.name if out.name.startswith("bundle") else out.name  # RUN/bundle*
        print(npu_table({name: manifest}))
    verified, failed = manifest.verified, manifest.failed
    dropped = [mode for mode in failed if mode not in manifest.models]
    print(
        f"\nbundle: {out} ({len(verified)}/{len(manifest.requested)} modes verified"
        f"{': ' + ', '.join(verified) if verified else ''}"
        f"{'; left out: ' + ', '.join(dropped) if dropped else ''}"
        f"; {manifest.export_seconds:.1f} s)"
    )
    if not failed:
        return 0
    if args.allow_parity_failure:
        detail = "; ".join(f"{mode}: {', '.join(info.reasons)}" for mode, info in failed.items())
        print(f"{PROG}: warning: not verified (allowed): {detail}", file=sys.stderr)
        return 0
    for line in left_out(manifest, args.run_dir):
        print(f"{PROG}: {line}", file=sys.stderr)
    if names_modes(args.quant):  # what the user asked for by name must hold
        print(
            f"{PROG}: not verified, left out of the bundle: {', '.join(dropped)} "
            "(named with --quant)",
            file=sys.stderr,
        )
        return 1
    return 0  # the default: the bundle holds what verified (at least one mode)


def manifest_vela(manifest) -> str:
    """The Vela version the manifest's NPU reports name."""
    found = {e.npu.vela for e in manifest.models.values() if e.npu is not None}
    return ", ".join(sorted(found)) or "-"


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    return run_main(PROG, lambda: _run(parser.parse_args(argv), parser))


if __name__ == "__main__":
    raise SystemExit(main())
