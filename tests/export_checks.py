"""Helpers for the export tests: an independent LiteRT oracle, tflite-runtime probes, leftovers."""

from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
from edge_bundle import edge_python, run_main

from bundle_contract.files import sha256_file
from keras_mha_export.cli import main

FLOATS = {"float16", "float32", "float64"}
# Lines TensorFlow, the converter or LiteRT print when nobody silences them.
NOISE = (
    "I0000",
    "W0000",
    "E0000",
    "WARNING",
    "Saved artifact",
    "XNNPACK",
    "fully_quantize",
    "absl",
)
PROG = "keras-mha-export"


def run_cli(argv: list) -> tuple[int, str, str]:
    """keras-mha-export's main(argv) in this process: (exit status, stdout, stderr)."""
    return run_main(main, argv)


def litert_outputs(path: pathlib.Path, x: np.ndarray) -> tuple[np.ndarray, dict, dict]:
    """Run a .tflite file with LiteRT directly, at batch 1: an oracle independent of
    edge_demo (its own interpreter calls, its own float64 quantization)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=1)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    results = []
    for row in x:
        scale, zero_point = inp["quantization"]
        if scale:  # round half away from zero, as TFLite does
            info = np.iinfo(inp["dtype"])
            scaled = row / scale
            q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + zero_point
            row = np.clip(q, info.min, info.max)
        interpreter.set_tensor(inp["index"], row[None].astype(inp["dtype"]))
        interpreter.invoke()
        y = interpreter.get_tensor(out["index"])[0].astype(np.float64)
        scale, zero_point = out["quantization"]
        results.append((y - zero_point) * scale if scale else y)
    return np.array(results), inp, out


def tflite_runtime_loads(paths: list[pathlib.Path]) -> dict[str, bool]:
    """Whether tflite-runtime 2.14 (the edge venv) loads and invokes each model."""
    script = (
        "import json, sys, numpy as np\n"
        "from tflite_runtime.interpreter import Interpreter\n"
        "result = {}\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        it = Interpreter(model_path=path); it.allocate_tensors()\n"
        "        d = it.get_input_details()[0]\n"
        "        it.set_tensor(d['index'], np.zeros(d['shape'], d['dtype'])); it.invoke()\n"
        "        result[path] = True\n"
        "    except Exception:\n"
        "        result[path] = False\n"
        "print(json.dumps(result))\n"
    )
    done = subprocess.run(
        [str(edge_python("tflite-runtime")), "-c", script, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return {pathlib.Path(k).name: v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}


_TFLITE_RUNTIME_OUTPUTS = """
import sys, numpy as np
from tflite_runtime.interpreter import Interpreter

x = np.load(sys.argv[2])["x"]
interpreter = Interpreter(model_path=sys.argv[1], num_threads=1)
interpreter.allocate_tensors()
inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
rows = []
for row in x:
    scale, zero_point = inp["quantization"]
    if scale:
        info = np.iinfo(inp["dtype"])
        scaled = row / scale
        row = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + zero_point, info.min, info.max)
    interpreter.set_tensor(inp["index"], row[None].astype(inp["dtype"]))
    interpreter.invoke()
    y = interpreter.get_tensor(out["index"])[0].astype(np.float64)
    scale, zero_point = out["quantization"]
    rows.append((y - zero_point) * scale if scale else y)
np.save(sys.argv[3], np.array(rows))
"""


def tflite_runtime_outputs(path: pathlib.Path, x: np.ndarray, scratch: pathlib.Path) -> np.ndarray:
    """`litert_outputs(path, x)[0]` computed by tflite-runtime 2.14 in its venv (`scratch`: a
    directory for the inputs and outputs)."""
    np.savez(scratch / "oracle_x.npz", x=x)
    subprocess.run(
        [str(edge_python("tflite-runtime")), "-c", _TFLITE_RUNTIME_OUTPUTS, str(path),
         str(scratch / "oracle_x.npz"), str(scratch / "oracle_y.npy")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return np.load(scratch / "oracle_y.npy")


def leftovers(directory: pathlib.Path) -> list[str]:
    """Temporary bundle directories left behind in `directory`."""
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


sha256 = sha256_file
