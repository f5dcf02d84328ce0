"""keras-mha-edge: run an exported keras-mha bundle on the device, without TensorFlow.

By default, a parity run: every eval sample through each selected mode at
batch 1, compared with the float Keras model's outputs (a classifier's
probabilities, an encoder's vectors, a cross-encoder's scores) and the
manifest's thresholds. `--sample N` and `--text "..."` run one input instead
(a classifier names its class, an encoder finds the nearest eval sentences;
a cross-encoder: `--pair "query" "passage"` scores a pair, `--rerank QUERY
FILE.txt` orders a file's lines); with `--view FILE.html` they also write the
head view of one mode's attention weights (app/head_view.py).
"""

from __future__ import annotations

import argparse
import os
import pathlib

from bundle_contract.errors import (
    DEBUG_ENV,
    Parser,
    UsageError,
    int_in,
    nonnegative_int,
    positive_int,
    run_main,
    shown,
)

from .options import DemoOptions

# numpy and the runtime code are imported in `run`, under `run_main`: Ctrl-C
# while they import is "interrupted", not a traceback. These names are the
# runtimes' (runtimes/runtime.py RUNTIMES), kept here so --help imports nothing.
RUNTIME_CHOICES = ("litert", "tflite-runtime", "tflite-micro")
# Passes over eval.npz for latency: percentiles settle within a few; 1,000
# passes of a text bundle already take minutes (progress goes to stderr).
MAX_REPEAT = 1000
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


def path_problem(path: pathlib.Path) -> str | None:
    """Why a path argument cannot name a file here (too long, a NUL), or None."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        return "contains a NUL byte"
    if len(raw) > MAX_PATH_BYTES:
        return f"is {len(raw)} bytes long (at most {MAX_PATH_BYTES})"
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        return f"has a component of {longest} bytes (a file name has at most {MAX_NAME_BYTES})"
    return None


PROG = "keras-mha-edge"
EPILOG = f"""\
exit codes: 0 every selected mode meets its thresholds; 1 a parity failure
(or the runtime failed running a loaded model); 2 bad input (bundle files,
flags, runtime), one line on stderr; 3 an internal error (set {DEBUG_ENV}=1
for its traceback); 130 interrupted.
Modes the runtime cannot run (tflite-runtime and dynamic-range or int16x8
models) are skipped, not failed."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (`--help` shows the exit codes)."""
    from .. import __version__

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
        choices=("auto", *RUNTIME_CHOICES),
        default="auto",
        help=f"TFLite runtime: auto = the first of {', '.join(RUNTIME_CHOICES)} that imports "
        "(default auto)",
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
        type=int_in(1, MAX_REPEAT),
        default=1,
        metavar="N",
        help=f"passes over eval.npz for latency, 1 to {MAX_REPEAT} (default 1); "
        "a run longer than 10 s prints its progress to stderr",
    )
    parser.add_argument(
        "--json",
        type=pathlib.Path,
        dest="json_path",
        metavar="FILE",
        help="also write the parity report as JSON (with --debug: every row of its table)",
    )
    parser.add_argument(
        "--raw",
        type=pathlib.Path,
        metavar="FILE.npz",
        help="also write each mode's outputs on eval.npz as the runtime gives them (int8, "
        "int16 or float32, before dequantization), one array per mode: compare two devices "
        "bit for bit",
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="the parity table with every column: mean |Δp|, the int8 attention tail, "
        "p90/p99 latency, load time, peak memory and the manifest's thresholds",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--sample",
        type=nonnegative_int,
        metavar="N",
        help="run eval sample N and show it (a classifier's prediction, an encoder's nearest "
        "eval sentences, a cross-encoder's score)",
    )
    what.add_argument(
        "--text",
        metavar='"..."',
        help="run a sentence (text bundles): a classifier's prediction; an embedding bundle: "
        "the nearest eval sentences",
    )
    what.add_argument(
        "--embed",
        type=pathlib.Path,
        metavar="FILE.txt",
        help="embedding bundles: embed each line of FILE.txt (with --out FILE.npy)",
    )
    what.add_argument(
        "--pair",
        nargs=2,
        metavar=('"QUERY"', '"PASSAGE"'),
        help="cross-encoder bundles: score one (query, passage) pair in each mode",
    )
    what.add_argument(
        "--rerank",
        nargs=2,
        metavar=('"QUERY"', "FILE.txt"),
        help="cross-encoder bundles: the lines of FILE.txt best first for QUERY, with their "
        "scores (mode: --quant MODE, default the first runnable)",
    )
    what.add_argument(
        "--generate",
        metavar='"PROMPT"',
        help="language model bundles: continue the prompt greedily, streaming the tokens, "
        "then tokens/s (mode: --quant MODE, default the first runnable)",
    )
    what.add_argument(
        "--chat",
        metavar='"MESSAGE"',
        help="language model bundles: answer the message in the model's chat template, "
        "stopping at its end token",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int_in(1, 4096),
        default=32,
        metavar="N",
        help="with --generate or --chat: at most N new tokens (default 32)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, metavar="FILE.npy", help="with --embed: where to write"
    )
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
        "(all eval samples; the first 32 sentences, each at its own length, for an "
        "encoder bundle; or --sample N)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_args(argv: list[str] | None = None) -> DemoOptions:
    """Parse the command line into DemoOptions (a usage error exits 2, one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    one = args.sample is not None or args.text is not None or args.pair or args.rerank
    one = one or args.generate is not None or args.chat is not None
    if args.json_path is not None and one:
        parser.error("--json applies to the parity run, not to --sample, --text or --pair")
    if args.raw is not None and (one or args.embed is not None or args.debug is not None):
        parser.error(
            "--raw applies to the parity run, not to --sample, --text, --pair, --embed or --debug"
        )
    if args.wide and one:
        parser.error("--wide applies to the parity table, not to --sample, --text or --pair")
    if args.debug is not None:
        for flag, value in (
            ("--text", args.text),
            ("--wide", args.wide or None),
            ("--view", args.view),
            ("--pair", args.pair),
            ("--rerank", args.rerank),
        ):
            if value is not None:
                parser.error(f"--debug cannot be combined with {flag}")
    if (args.embed is None) != (args.out is None):
        parser.error("--embed FILE.txt and --out FILE.npy go together")
    if args.embed is not None and (args.json_path or args.wide or args.view or args.debug):
        parser.error("--embed cannot be combined with --json, --wide, --view or --debug")
    if args.view is not None and args.sample is None and args.text is None and not args.pair:
        parser.error('--view needs --sample N, --text "..." or --pair (the input to show)')
    if args.rerank and args.view is not None:
        parser.error("--view shows one input: use --pair, not --rerank")
    rerank = None if not args.rerank else (args.rerank[0], pathlib.Path(args.rerank[1]))
    for flag, path in (
        ("BUNDLE_DIR", args.bundle),
        ("--json", args.json_path),
        ("--raw", args.raw),
        ("--view", args.view),
        ("--embed", args.embed),
        ("--out", args.out),
        ("--rerank", None if rerank is None else rerank[1]),
    ):
        problem = None if path is None else path_problem(path)
        if problem:
            parser.error(f"{flag} {problem}")
    for flag, texts in (
        ("--text", [args.text]),
        ("--generate", [args.generate]),
        ("--chat", [args.chat]),
        ("--pair", args.pair or []),
        ("--rerank", (args.rerank or [None])[:1]),
    ):
        for text in texts:
            try:
                None if text is None else text.encode("utf-8")
            except UnicodeEncodeError:
                parser.error(f"{flag} is not valid UTF-8 text")
    if args.quant is not None and len(args.quant) > 1000:
        parser.error("--quant is longer than 1000 characters")
    return DemoOptions(
        bundle=args.bundle,
        quant=args.quant,
        runtime=args.runtime,
        threads=args.threads,
        repeat=args.repeat,
        json_path=args.json_path,
        raw=args.raw,
        wide=args.wide,
        sample=args.sample,
        text=args.text,
        view=args.view,
        debug=args.debug,
        embed=args.embed,
        out=args.out,
        pair=None if not args.pair else (args.pair[0], args.pair[1]),
        rerank=rerank,
        generate=args.generate,
        chat=args.chat,
        max_new_tokens=args.max_new_tokens,
    )


# --- what runs ------------------------------------------------------------------


def _check_request(bundle, options: DemoOptions) -> None:
    """Flags that depend on the bundle, checked before any runtime is imported."""
    samples = bundle.manifest.eval.samples
    if options.sample is not None and options.sample >= samples:
        raise UsageError(
            f"{options.sample} is out of range: eval.npz has samples 0..{samples - 1}", "--sample"
        )
    from bundle_contract.files import check_output

    from .head_view import check_view_path

    command, commands = _command(options), bundle.task.commands
    if command is not None and command not in commands:
        takes = f"{', '.join(commands)} or none" if commands else "only the parity run"
        raise UsageError(f"a {bundle.task.name} bundle takes {takes}", command)
    if options.out is not None:  # with --embed: the sentence vectors
        check_output(options.out, "--out", protected=bundle.root)
    if options.text is not None and bundle.vocab is None and bundle.tokenizer is None:
        raise UsageError(
            f"needs a text bundle with vocab.json; {bundle.path('manifest.json')} has "
            f'"vocab": null (dataset {bundle.manifest.dataset!r})',
            "--text",
        )
    for flag, path in (("--json", options.json_path), ("--raw", options.raw)):
        if path is not None:
            check_output(path, flag, protected=bundle.root)
    if options.view is not None:
        check_view_path(options.view, bundle.root)
        if options.runtime == "tflite-micro":  # it runs deploy files: no attention signature
            raise UsageError("needs the attention signature; use --runtime litert", "--view")


def _command(options: DemoOptions) -> str | None:
    """The one-input command given (its flag), or None: the parity run."""
    given = {
        "--sample": options.sample is not None,
        "--text": options.text is not None,
        "--embed": options.embed is not None,
        "--pair": options.pair is not None,
        "--rerank": options.rerank is not None,
        "--generate": options.generate is not None,
        "--chat": options.chat is not None,
    }
    return next((flag for flag, on in given.items() if on), None)


def _predict(bundle, runtime, options: DemoOptions, plan):
    from .runs import run_sample, run_text

    if options.text is not None:
        return run_text(bundle, runtime, options, plan)
    return run_sample(bundle, runtime, options, plan), None, ()


def _search(bundle, runtime, options: DemoOptions, plan):
    from .search import run_search

    code, x = run_search(bundle, runtime, options, plan)
    return code, x, ()


def _embed(bundle, runtime, options: DemoOptions, plan) -> int:
    from .search import run_embed

    return run_embed(bundle, runtime, options, plan)


def _score(bundle, runtime, options: DemoOptions, plan):
    from .rerank import run_pair

    code, x = run_pair(bundle, runtime, options, plan)
    return code, x, ()


def _rank(bundle, runtime, options: DemoOptions, plan) -> int:
    from .rerank import run_rerank

    return run_rerank(bundle, runtime, options, plan)


def _generate(bundle, runtime, options: DemoOptions, plan) -> int:
    from .generate import run_generate

    return run_generate(bundle, runtime, options, plan)


# What the app does for each action a task names in `Task.commands`: (code, the input
# run, tokens dropped) for one input, which --view may draw; or an exit code.
ACTIONS = {
    "predict": _predict,
    "search": _search,
    "embed": _embed,
    "score": _score,
    "rank": _rank,
    "generate": _generate,
    "chat": _generate,
}


def run(options: DemoOptions) -> int:
    """Validate the bundle, import the runtime, probe the models, run."""
    import numpy as np

    from bundle_contract.bundle import open_bundle

    from ..runtimes.runtime import select_runtime
    from .head_view import view_mode, write_view
    from .runs import header, plan_modes, run_parity

    np.seterr(all="ignore")  # a hostile scale's overflow is a result, never a warning on stderr
    if options.debug is not None:
        from ..debug.cli import run_debug

        return run_debug(
            options.bundle,
            options.debug,
            options.sample,
            runtime_choice=options.runtime,
            json_path=options.json_path,
        )
    bundle = open_bundle(options.bundle, options.quant)
    _check_request(bundle, options)
    runtime = select_runtime(options.runtime)
    print(header(bundle, runtime, options), flush=True)
    for mode in bundle.modes:
        if bundle.manifest.models[mode].verified is False:
            print(f"note: manifest.json marks {mode} as not verified at export")
        view = bundle.manifest.models[mode].attention
        if view is not None and view.faithful is False:
            print(
                f"note: manifest.json marks {mode}'s attention view as not faithful "
                f"({'; '.join(view.misses()) or 'no figures'})"
            )
    plan = plan_modes(bundle, runtime)
    command = _command(options)
    if command is None:
        return run_parity(bundle, runtime, options, plan)
    action = ACTIONS[bundle.task.commands[command]]  # the task's (_check_request)
    if options.view is not None:
        view_mode(bundle, [m for m, skipped in plan.items() if skipped is None])  # before output
    answer = action(bundle, runtime, options, plan)
    if not isinstance(answer, tuple):  # a whole answer (--embed, --rerank): no view
        return answer
    code, x, dropped = answer
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
            text=options.text if options.pair is None else options.pair,
            dropped=dropped,
        )
        print(f"wrote {shown(options.view)} ({'; '.join(notes)})")
    return code


def main(argv: list[str] | None = None) -> int:
    """The console script: one line and exit 2 for bad input, never a traceback."""
    return run_main(PROG, lambda: run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
