"""Time keras_mha.MultiHeadAttention against keras.layers.MultiHeadAttention.

Forward and forward+backward, same shapes, same weights, one process, each
step compiled with tf.function. Prints the median time of each and its ratio
to Keras's layer (the anchor, measured in the same run); writes JSON.

    python benchmarks/bench_attention.py [--json FILE] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _util import write_json_atomic  # noqa: E402  (benchmarks/ is the script directory)

SHAPES = {
    # name: (batch, T, d_model, heads)
    "large": (32, 128, 256, 8),
    "edge": (1, 8, 32, 4),
}


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


def bench_shape(name: str, shape: tuple[int, int, int, int], repeats: int) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_mha import MultiHeadAttention

    batch, t, d_model, heads = shape
    x = tf.constant(np.random.default_rng(0).standard_normal((batch, t, d_model)), tf.float32)
    anchor = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)
    anchor(x, x)
    layers = {
        "keras.layers.MultiHeadAttention": anchor,
        "keras_mha fused": MultiHeadAttention.from_keras(anchor, implementation="fused"),
        "keras_mha per_head": MultiHeadAttention.from_keras(anchor, implementation="per_head"),
    }
    forwards, steps = {}, {}
    for label, layer in layers.items():

        def call(layer=layer):
            return layer(x, x) if isinstance(layer, keras.layers.MultiHeadAttention) else layer(x)

        forward = tf.function(call)

        @tf.function
        def train_step(layer=layer, call=call):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(call()))
            return tape.gradient(loss, layer.trainable_weights)

        forwards[label] = lambda f=forward: f().numpy()
        steps[label] = lambda s=train_step: [g.numpy() for g in s()]
    fwd = _interleaved_medians_us(forwards, repeats)
    bwd = _interleaved_medians_us(steps, repeats)
    results = {
        label: {"forward_us": fwd[label], "forward_backward_us": bwd[label]} for label in layers
    }
    anchor_times = results["keras.layers.MultiHeadAttention"]
    for r in results.values():
        r["forward_ratio"] = r["forward_us"] / anchor_times["forward_us"]
        r["forward_backward_ratio"] = r["forward_backward_us"] / anchor_times["forward_backward_us"]
    return {"shape": dict(zip(("batch", "T", "d_model", "heads"), shape)), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write results here")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma list of " + ",".join(SHAPES)
    )
    args = parser.parse_args(argv)
    import keras
    import tensorflow as tf

    report = {
        "benchmark": "attention",
        "versions": {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "python": platform.python_version(),
        },
        "machine": {"cpus": os.cpu_count(), "processor": platform.machine()},
        "shapes": {},
    }
    for name in args.shapes.split(","):
        if name not in SHAPES:
            print(
                f"error: unknown shape {name!r}; expected one of {', '.join(SHAPES)}",
                file=sys.stderr,
            )
            return 2
        entry = bench_shape(name, SHAPES[name], args.repeats)
        report["shapes"][name] = entry
        s = entry["shape"]
        print(
            f"\n{name}: batch {s['batch']}, T {s['T']}, d_model {s['d_model']}, {s['heads']} heads"
        )
        print(f"{'layer':34} {'fwd µs':>10} {'ratio':>6} {'fwd+bwd µs':>11} {'ratio':>6}")
        for label, r in entry["results"].items():
            print(
                f"{label:34} {r['forward_us']:10.0f} {r['forward_ratio']:6.2f} "
                f"{r['forward_backward_us']:11.0f} {r['forward_backward_ratio']:6.2f}"
            )
    if args.json:
        write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
