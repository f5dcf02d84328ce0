"""Edge benchmarks: our classifier against the same one on keras.layers.MultiHeadAttention.

1. Trains the default digits classifier twice with the same seed and
   settings: once with keras_mha.MultiHeadAttention (ours), once with
   keras.layers.MultiHeadAttention (the anchor); a third variant is ours with
   `implementation="per_head"` (same weights as ours).
2. Exports all five modes of each the same way (keras-mha-export).
3. Per mode: file size, op count and LiteRT latency (batch 1, one thread,
   timed in turns), with ratios against the anchor.
4. Cold start: process start to first prediction through edge_demo (LiteRT,
   no TensorFlow) against loading the same model through TensorFlow/Keras.

    python benchmarks/bench_edge.py [--json FILE] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _util import write_json_atomic  # noqa: E402  (benchmarks/ is the script directory)

from bundle_contract.manifest import MODES

REPO = pathlib.Path(__file__).resolve().parents[1]
VARIANTS = ("keras.layers.MultiHeadAttention", "keras_mha fused", "keras_mha per_head")


def train_variants(work: pathlib.Path, seed: int, epochs: int | None) -> dict[str, pathlib.Path]:
    import keras
    import numpy as np

    from keras_mha.model import ModelConfig, build_classifier
    from keras_mha.train import train

    runs = {
        "keras.layers.MultiHeadAttention": work / "keras_attention",
        "keras_mha fused": work / "ours",
        "keras_mha per_head": work / "ours_per_head",
    }
    common = {"seed": seed, "overwrite": True, "verbose": 0, "epochs": epochs}
    metrics = train("digits", runs["keras_mha fused"], **common)
    train("digits", runs["keras.layers.MultiHeadAttention"], implementation="keras", **common)
    # per_head: the same trained weights, computed head by head.
    src = runs["keras_mha fused"]
    dst = runs["keras_mha per_head"]
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("bundle"))
    config = ModelConfig.from_dict({**metrics["config"], "implementation": "per_head"})
    model = build_classifier(config)
    model.set_weights(keras.saving.load_model(src / "model.keras").get_weights())
    model.save(dst / "model.keras")
    with np.load(src / "eval.npz") as ev:
        arrays = dict(ev)
    arrays["probs"] = model.predict(arrays["x"], verbose=0).astype("float32")
    np.savez(dst / "eval.npz", **arrays)
    return runs


def export_variants(runs: dict[str, pathlib.Path]) -> dict:
    from keras_mha_export import export_bundle

    return {
        label: export_bundle(run, run / "bundle", "all", overwrite=True, allow_parity_failure=True)
        for label, run in runs.items()
    }


def litert_latency(bundles: dict[str, pathlib.Path], repeats: int) -> dict[str, dict[str, float]]:
    """Median µs per inference for every (variant, mode), timed in turns.

    Through the edge demo's own model wrapper (`EdgeModel.run`: quantize once,
    then set_tensor + invoke + get_tensor per sample), on LiteRT.
    """
    from bundle_contract.bundle import open_bundle
    from edge_demo.runtimes.model import EdgeModel
    from edge_demo.runtimes.runtime import select_runtime

    runtime = select_runtime("litert")
    runners = {}
    for label, path in bundles.items():
        bundle = open_bundle(path)
        x = bundle.eval.x[:64]
        for mode in bundle.modes:
            model = EdgeModel(
                runtime, bundle.model_bytes[mode], threads=1, where=mode, pad_id=bundle.pad_id
            )
            runners[(label, mode)] = (model, model.prepare(x))
    times: dict = {key: [] for key in runners}
    for _ in range(repeats):
        for key, (model, prepared) in runners.items():
            _, latencies_ns = model.run(prepared)
            times[key].append(float(latencies_ns.mean()) / 1e9)
    result: dict = {}
    for (label, mode), t in times.items():
        result.setdefault(label, {})[mode] = statistics.median(t) * 1e6
    return result


def _median_seconds(cmd: list[str], repeats: int, env=None) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=REPO)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cold_start(run: pathlib.Path, repeats: int) -> dict:
    edge_python = os.environ.get("KERAS_MHA_EDGE_PYTHON", str(REPO / ".venv-edge/bin/python"))
    bundle = run / "bundle"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    edge_cmd = [edge_python, "-m", "edge_demo", str(bundle), "--quant", "float32", "--sample", "0"]
    keras_cmd = [
        sys.executable,
        "-c",
        "import numpy as np, keras, keras_mha\n"
        f"m = keras.saving.load_model({str(run / 'model.keras')!r})\n"
        f"x = np.load({str(run / 'eval.npz')!r})['x'][:1]\n"
        "print(m.predict(x, verbose=0).argmax())",
    ]
    tf_lite_cmd = [
        sys.executable,
        "-c",
        "import numpy as np, tensorflow as tf\n"
        f"i = tf.lite.Interpreter(model_path={str(bundle / 'model_float32.tflite')!r})\n"
        "i.allocate_tensors()\n"
        f"x = np.load({str(run / 'eval.npz')!r})['x'][:1]\n"
        "i.set_tensor(i.get_input_details()[0]['index'], x)\n"
        "i.invoke()\n"
        "print(i.get_tensor(i.get_output_details()[0]['index']).argmax())",
    ]
    edge = _median_seconds(edge_cmd, repeats, env)
    keras_s = _median_seconds(keras_cmd, repeats, env)
    tf_lite = _median_seconds(tf_lite_cmd, repeats, env)
    return {
        "edge_demo_litert_s": edge,
        "tensorflow_keras_load_model_s": keras_s,
        "tensorflow_tflite_interpreter_s": tf_lite,
        "ratio_vs_keras": edge / keras_s,
        "ratio_vs_tf_lite": edge / tf_lite,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write results here")
    parser.add_argument("--work", type=pathlib.Path, default=REPO / ".cache" / "bench_edge")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=None, help="override training epochs")
    parser.add_argument("--repeats", type=int, default=15, help="timing rounds")
    args = parser.parse_args(argv)

    args.work.mkdir(parents=True, exist_ok=True)
    print("training the three variants (same seed, same settings) ...", flush=True)
    runs = train_variants(args.work, args.seed, args.epochs)
    print("exporting all modes of each ...", flush=True)
    manifests = export_variants(runs)
    bundles = {label: run / "bundle" for label, run in runs.items()}
    latency = litert_latency(bundles, args.repeats)
    anchor = "keras.layers.MultiHeadAttention"
    report: dict = {"benchmark": "edge", "variants": {}, "cold_start": None}
    for label in VARIANTS:
        m = manifests[label]
        metrics = json.loads((runs[label] / "metrics.json").read_text())
        entry = {"test_accuracy": metrics["test_accuracy"], "modes": {}}
        for mode in MODES:
            if mode not in m.models:
                continue
            info = m.models[mode]
            a = manifests[anchor].models.get(mode)
            entry["modes"][mode] = {
                "bytes": info.bytes,
                "ops": info.op_count,
                "latency_us": latency[label][mode],
                "verified": bool(info.verified),
                "agreement": info.parity.agreement if info.parity else None,
                "size_ratio": info.bytes / a.bytes if a else None,
                "latency_ratio": latency[label][mode] / latency[anchor][mode] if a else None,
            }
        report["variants"][label] = entry

    print("\nper mode, LiteRT, batch 1, 1 thread (ratio = against keras.layers.MultiHeadAttention)")
    print(
        f"{'mode':8} {'variant':34} {'bytes':>7} {'×':>5} {'ops':>4} {'µs':>7} {'×':>5} {'agree':>6}"
    )
    for mode in MODES:
        for label in VARIANTS:
            r = report["variants"][label]["modes"].get(mode)
            if r is None:
                continue
            print(
                f"{mode:8} {label:34} {r['bytes']:7d} {r['size_ratio'] or 0:5.2f} {r['ops']:4d} "
                f"{r['latency_us']:7.1f} {r['latency_ratio'] or 0:5.2f} {r['agreement'] or 0:6.3f}"
            )
    for label in VARIANTS:
        print(f"test accuracy, {label}: {report['variants'][label]['test_accuracy']:.4f}")
    # The full-integer issue's goal (docs/quantization.md): int8 no slower than float32.
    print("\nper variant, each mode's p50 / float32's p50 (same run; goal for int8: <= 1)")
    for label in VARIANTS:
        modes = report["variants"][label]["modes"]
        base = modes.get("float32", {}).get("latency_us")
        ratios = {m: r["latency_us"] / base for m, r in modes.items() if base and m != "float32"}
        report["variants"][label]["latency_vs_float32"] = ratios
        print(f"  {label:34} " + "  ".join(f"{m} {v:.2f}" for m, v in ratios.items()))

    print("\ncold start: process start to first prediction (median)", flush=True)
    cold = cold_start(runs["keras_mha fused"], max(3, args.repeats // 3))
    report["cold_start"] = cold
    print(f"  edge_demo (LiteRT, no TensorFlow):   {cold['edge_demo_litert_s']:.2f} s")
    print(f"  TensorFlow + keras.load_model:        {cold['tensorflow_keras_load_model_s']:.2f} s")
    print(
        f"  TensorFlow + tf.lite.Interpreter:     {cold['tensorflow_tflite_interpreter_s']:.2f} s"
    )
    print(
        f"  ratio edge/keras {cold['ratio_vs_keras']:.3f}, edge/tf.lite {cold['ratio_vs_tf_lite']:.3f}"
    )
    if args.json:
        write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
