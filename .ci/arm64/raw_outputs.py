"""Raw outputs of every mode of a bundle in LiteRT, to compare machines.

usage: python3 raw_outputs.py BUNDLE OUT.npz [MODE,...]   (from a folder holding edge_demo/;
       the modes, default every mode of the bundle)

Each mode's model runs every eval sample (an encoder's first EMBEDDING_SAMPLES) at batch 1 (a dynamic sequence
axis, an embedding model's: at the sample's own length, as the device runs
it) with LiteRT's default
delegate (XNNPACK, whose "Created ... XNNPACK delegate" line on stderr is
left visible: test.sh requires it); the raw output tensor (int8, int16 or
float32, before dequantization) is saved under the mode's name.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from edge_demo.contract.tensors import TensorSpec
from edge_demo.runtimes.model import EdgeModel

# An encoder's raw outputs: its first 100 sentences. Emulated, its 389 take
# minutes a CPU, and the edge demo's report (every sentence) already gives the
# figures the vectors are bounded by (summary.py's embedding_bound).
EMBEDDING_SAMPLES = 100


def main(bundle: pathlib.Path, out: pathlib.Path, modes: list[str] | None = None) -> int:
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    with np.load(bundle / manifest["eval"]["file"], allow_pickle=False) as npz:
        x = npz["x"]
    if manifest["eval"].get("task") == "embedding":
        x = x[:EMBEDDING_SAMPLES]
    raw = {}
    for mode, entry in manifest["models"].items():
        if modes is not None and mode not in modes:
            continue
        interpreter = Interpreter(
            model_content=(bundle / entry["file"]).read_bytes(), num_threads=1
        )
        interpreter.allocate_tensors()
        (inp,), (outp,) = interpreter.get_input_details(), interpreter.get_output_details()
        pad_id = (manifest.get("tokenizer") or {}).get("pad_id", 0)  # RoBERTa's is 1
        lengths = EdgeModel.own_lengths(x, pad_id) if entry.get("dynamic_length") else None
        rows = []
        for i, sample in enumerate(TensorSpec.from_detail(inp).quantize(x)):
            if lengths is not None:
                sample = sample[: lengths[i]]
                interpreter.resize_tensor_input(inp["index"], [1, int(lengths[i])])
                interpreter.allocate_tensors()
            interpreter.set_tensor(inp["index"], sample[None])
            interpreter.invoke()
            rows.append(interpreter.get_tensor(outp["index"])[0].copy())
        raw[mode] = np.stack(rows)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, **raw)
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        print("usage: raw_outputs.py BUNDLE OUT.npz [MODE,...]", file=sys.stderr)
        raise SystemExit(2)
    chosen = sys.argv[3].split(",") if len(sys.argv) == 4 else None
    raise SystemExit(main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), chosen))
