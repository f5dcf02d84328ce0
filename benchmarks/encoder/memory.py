"""Peak memory: one fresh child process per engine (the first thread count).

The child (bench_encoder.py --memory-child SPEC IDS, `memory_child`) imports
only that engine's runtime, loads the model and runs every sentence once; it
reports its VmHWM (the whole process) and VmHWM minus its VmRSS after the
imports (what the model adds).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

from .engines import build_engine, import_runtime
from .inputs import sentence_ids


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


def measure_memory(specs: list[dict], ids: list[np.ndarray], threads: int, script: str) -> dict:
    """Engine name -> the JSON its child printed (None if it failed); `script`:
    bench_encoder.py, whose hidden --memory-child runs `memory_child`."""
    print(f"peak memory: a child process per engine ({threads} thread(s)) ...", flush=True)
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
                script,
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
