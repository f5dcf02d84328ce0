"""Time keras_mha.MultiHeadAttention against keras.layers.MultiHeadAttention.

On the Keras backend in KERAS_BACKEND (tensorflow, jax or torch): forward and
forward+backward of Keras's layer (the anchor) and ours (fused, per_head, and
fused with flash_attention=True where the backend accepts it), same shapes,
same weights, one process, each step compiled the backend's way
(tf.function, jax.jit; PyTorch eager, as Keras runs it). Prints the median
time of each and its ratio to the anchor measured in the same run, and with
--memory the peak memory each step adds (in a child process per layer and
step: the rise of the process's peak RSS (VmHWM) over its level once the
layer and inputs exist, first calls and their compilation included). Writes JSON.

    python benchmarks/bench_attention.py [--json FILE] [--repeats N] [--memory]
    make bench-backends   # each backend in its venv (tests/keras_suite/run.py --bench)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _util import write_json_atomic  # noqa: E402  (benchmarks/ is the script directory)

SHAPES = {
    # name: (batch, T, d_model, heads, timed repeats)
    "large": (32, 128, 256, 8, 20),
    "long": (2, 2048, 256, 8, 5),  # the (B, h, T, S) scores: 2*8*2048^2 floats, 268 MB
    "edge": (1, 8, 32, 4, 20),
}
ANCHOR = "keras.layers.MultiHeadAttention"


def _layers(shape, x):
    import keras

    from keras_mha import MultiHeadAttention

    batch, t, d_model, heads = shape[:4]
    keras.utils.set_random_seed(0)
    anchor = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)
    anchor(x[:1], x[:1])
    layers = {
        ANCHOR: anchor,
        "keras_mha fused": MultiHeadAttention.from_keras(anchor, implementation="fused"),
        "keras_mha per_head": MultiHeadAttention.from_keras(anchor, implementation="per_head"),
    }
    flash = MultiHeadAttention.from_keras(anchor)
    flash._flash_attention = True
    try:  # flash kernels: none on TensorFlow, none for CPU on JAX
        flash(x[:1, :8])
        layers["keras_mha fused flash"] = flash
    except Exception:  # noqa: BLE001 - the backend said no: not applicable here
        pass
    return layers


def _steps(layer, x):
    """(forward, forward+backward) callables, compiled as the backend does."""
    import keras

    backend = keras.backend.backend()

    def call(v=None):
        return layer(x, x) if v is None else layer(v, v)

    if backend == "tensorflow":
        import tensorflow as tf

        forward = tf.function(call)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(call()))
            return tape.gradient(loss, layer.trainable_weights)

        return (lambda: forward().numpy()), (lambda: [g.numpy() for g in step()])
    if backend == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        others = [v.value for v in layer.non_trainable_variables]

        def run(tv, xv):
            y, _ = layer.stateless_call(tv, others, xv, xv)
            return keras.ops.mean(keras.ops.square(y))

        def fwd(tv, xv):
            return layer.stateless_call(tv, others, xv, xv)[0]

        forward = jax.jit(fwd)
        grad = jax.jit(jax.grad(run))
        return (
            lambda: forward(trainable, x).block_until_ready(),
            lambda: [g.block_until_ready() for g in grad(trainable, x)],
        )
    import torch

    def forward():
        with torch.no_grad():
            return call().cpu()

    def step():
        layer.zero_grad() if hasattr(layer, "zero_grad") else None
        loss = torch.mean(torch.square(call()))
        loss.backward()
        return loss.item()

    return forward, step


def _inputs(shape):
    import keras
    import numpy as np

    batch, t, d_model = shape[:3]
    data = np.random.default_rng(0).standard_normal((batch, t, d_model)).astype("float32")
    return keras.ops.convert_to_tensor(data)


def _interleaved_medians_us(fns: dict, repeats: int) -> dict:
    """Median µs per function, timing them in turns so load changes hit all alike."""
    for fn in fns.values():  # trace + warm up
        fn()
        fn()
    times = {label: [] for label in fns}
    for _ in range(repeats):
        for label, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    return {label: statistics.median(t) * 1e6 for label, t in times.items()}


def _peak_mb(name: str, label: str, which: int) -> float | None:
    """Peak RSS the step adds, measured in a fresh child process."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, __file__, "--child", name, label, str(which)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"memory of {label} ({name}) not measured: {out.stderr[-500:]}", file=sys.stderr)
        return None


def _child(name: str, label: str, which: int) -> int:
    shape = SHAPES[name]
    x = _inputs(shape)
    layer = _layers(shape, x)[label]
    fn = _steps(layer, x)[which]
    before = _high_water_mb()
    for _ in range(3):
        fn()
    print(_high_water_mb() - before)
    return 0


def _high_water_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux keeps ru_maxrss
    across exec, so a child started by a big parent would inherit its peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_shape(name: str, repeats: int | None, memory: bool) -> dict:
    shape = SHAPES[name]
    x = _inputs(shape)
    layers = _layers(shape, x)
    steps = {label: _steps(layer, x) for label, layer in layers.items()}
    n = repeats or shape[4]
    fwd = _interleaved_medians_us({k: s[0] for k, s in steps.items()}, n)
    bwd = _interleaved_medians_us({k: s[1] for k, s in steps.items()}, n)
    results = {
        label: {"forward_us": fwd[label], "forward_backward_us": bwd[label]} for label in layers
    }
    anchor = results[ANCHOR]
    for label, r in results.items():
        r["forward_ratio"] = r["forward_us"] / anchor["forward_us"]
        r["forward_backward_ratio"] = r["forward_backward_us"] / anchor["forward_backward_us"]
        if memory:
            r["forward_peak_mb"] = _peak_mb(name, label, 0)
            r["forward_backward_peak_mb"] = _peak_mb(name, label, 1)
    return {"shape": dict(zip(("batch", "T", "d_model", "heads"), shape[:4])), "results": results}


def _print(name: str, entry: dict) -> None:
    s = entry["shape"]
    print(f"\n{name}: batch {s['batch']}, T {s['T']}, d_model {s['d_model']}, {s['heads']} heads")
    print(f"{'layer':34} {'fwd µs':>10} {'ratio':>6} {'fwd+bwd µs':>11} {'ratio':>6}  peak MB")
    for label, r in entry["results"].items():
        mem = ""
        if "forward_peak_mb" in r:
            mem = f"  {r['forward_peak_mb'] or 0:.0f} / {r['forward_backward_peak_mb'] or 0:.0f}"
        print(
            f"{label:34} {r['forward_us']:10.0f} {r['forward_ratio']:6.2f} "
            f"{r['forward_backward_us']:11.0f} {r['forward_backward_ratio']:6.2f}{mem}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write results here")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement")
    parser.add_argument(
        "--shapes", default="large,long,edge", help="comma list of " + ",".join(SHAPES)
    )
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child[0], args.child[1], int(args.child[2]))
    for name in args.shapes.split(","):
        if name not in SHAPES:
            print(
                f"error: unknown shape {name!r}; expected one of {', '.join(SHAPES)}",
                file=sys.stderr,
            )
            return 2
    import keras

    backend = keras.backend.backend()
    backend_module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[backend]
    report = {
        "benchmark": "attention",
        "backend": backend,
        "versions": {
            backend_module: __import__(backend_module).__version__,
            "keras": keras.__version__,
            "python": platform.python_version(),
        },
        "machine": {"cpus": os.cpu_count(), "processor": platform.machine()},
        "shapes": {},
    }
    print(f"backend: {backend}")
    for name in args.shapes.split(","):
        entry = bench_shape(name, args.repeats, args.memory)
        report["shapes"][name] = entry
        _print(name, entry)
    if args.json:
        write_json_atomic(args.json, report)
    else:
        print(json.dumps({"backend": backend}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
