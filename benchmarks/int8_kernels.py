"""Why full int8 does not pay for attention on a CPU: the kernels, alone.

Each case is one op of all-MiniLM-L6-v2's block (12 heads, d_k 32, d_model
384), converted by TensorFlow's converter to float32 and to full-integer
int8 (random calibration data: the timing does not depend on the values),
then timed on LiteRT (XNNPACK on, its default; 1 thread; the models in turns,
p50 of the rounds), at two sequence lengths:

- `Q K^T` and `P V` as the export writes them: one BATCH_MATMUL over the
  heads, both operands activations;
- `Q K^T per head, FULLY_CONNECTED`: the restructuring tried, each head's
  keys the (non-constant) filter of a FULLY_CONNECTED, the layout that op
  wants without a transpose;
- `x W (FFN)`: a Dense layer's FULLY_CONNECTED with constant weights, where
  int8 does pay: the anchor.

Per case: float32 and int8 p50, their ratio, and how many of the case's
matmul ops XNNPACK took in each (the rest run on LiteRT's builtin kernels).
docs/quantization.md has a run's figures. A benchmark: exit 0 whatever it
measures.

    python benchmarks/int8_kernels.py [--lengths 32,128] [--rounds 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from _util import write_json_atomic  # noqa: E402  (benchmarks/ is the script directory)

from bundle_contract.errors import Parser, positive_int  # noqa: E402
from edge_demo.tables import format_table  # noqa: E402

HEADS, D_K, D_MODEL, D_FF = 12, 32, 384, 1536
MATMULS = ("BATCH_MATMUL", "FULLY_CONNECTED")


def cases(length: int) -> dict:
    """{name: (function of float32 tensors, their shapes without the batch axis)}."""
    import tensorflow as tf

    heads = (HEADS, length, D_K)
    weights = np.random.default_rng(0).normal(0, 0.05, (D_MODEL, D_FF)).astype("float32")

    def per_head_fc(q, k):  # each head: q_i (T, d_k) times k_i^T, k_i the FC's filter
        rows = [tf.matmul(q[0, i], k[0, i], transpose_b=True) for i in range(HEADS)]
        return tf.stack(rows)[None]

    return {
        "Q K^T (BATCH_MATMUL)": (lambda q, k: tf.matmul(q, k, transpose_b=True), [heads, heads]),
        "P V (BATCH_MATMUL)": (tf.matmul, [(HEADS, length, length), heads]),
        "Q K^T per head (FULLY_CONNECTED)": (per_head_fc, [heads, heads]),
        "x W, the FFN (FULLY_CONNECTED)": (lambda x: tf.matmul(x, weights), [(length, D_MODEL)]),
    }


def convert(function, shapes, int8: bool) -> bytes:
    import tensorflow as tf

    specs = [tf.TensorSpec((1, *shape), tf.float32) for shape in shapes]
    concrete = tf.function(function, input_signature=specs).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    if int8:
        rng = np.random.default_rng(0)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: (
            [rng.normal(size=(1, *s)).astype("float32") for s in shapes] for _ in range(16)
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int8
    return converter.convert()


def delegated(ops: list[dict]) -> set[int]:
    """Indices of the ops a DELEGATE node took: walked back from each delegate
    node's outputs to its inputs through the ops that produce them."""
    producer = {t: op["index"] for op in ops if op["op_name"] != "DELEGATE" for t in op["outputs"]}
    by_index = {op["index"]: op for op in ops}
    taken: set[int] = set()
    for node in (op for op in ops if op["op_name"] == "DELEGATE"):
        stop, todo = set(node["inputs"]), list(node["outputs"])
        while todo:
            tensor = todo.pop()
            index = producer.get(tensor)
            if tensor in stop or index is None or index in taken:
                continue
            taken.add(index)
            todo.extend(by_index[index]["inputs"])
    return taken


class Timed:
    """One model in LiteRT (XNNPACK on, its default), 1 thread, inputs zero."""

    def __init__(self, content: bytes):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_content=content, num_threads=1)
        self.interpreter.allocate_tensors()
        for detail in self.interpreter.get_input_details():
            self.interpreter.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
        ops = self.interpreter._get_ops_details()
        taken = delegated(ops)
        matmuls = [op["index"] for op in ops if op["op_name"] in MATMULS]
        self.matmuls, self.xnnpack = len(matmuls), sum(i in taken for i in matmuls)
        self.times: list[float] = []

    def run(self, calls: int) -> None:
        start = time.perf_counter()
        for _ in range(calls):
            self.interpreter.invoke()
        self.times.append((time.perf_counter() - start) / calls * 1e3)


def measure(lengths: list[int], rounds: int, calls: int) -> list[dict]:
    rows = []
    for length in lengths:
        models, built = {}, cases(length)
        for name, (function, shapes) in built.items():
            for mode in ("float32", "int8"):
                models[name, mode] = Timed(convert(function, shapes, mode == "int8"))
        for model in models.values():
            model.run(calls)  # warm-up
            model.times.clear()
        for r in range(rounds):  # in turns, the starting model rotating
            order = list(models.values())
            for model in order[r % len(order) :] + order[: r % len(order)]:
                model.run(calls)
        for name in built:
            f, q = models[name, "float32"], models[name, "int8"]
            p50f, p50q = statistics.median(f.times), statistics.median(q.times)
            rows.append(
                {
                    "case": name,
                    "length": length,
                    "float32_ms": p50f,
                    "int8_ms": p50q,
                    "int8_over_float32": p50q / p50f,
                    "xnnpack_float32": f"{f.xnnpack}/{f.matmuls}",
                    "xnnpack_int8": f"{q.xnnpack}/{q.matmuls}",
                }
            )
    return rows


def _lengths(text: str) -> list[int]:
    """argparse `type=`: comma-separated sequence lengths, each >= 1."""
    try:
        return [positive_int(v) for v in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}"
        ) from None


def main() -> int:
    parser = Parser(prog="int8_kernels.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lengths", type=_lengths, default=[32, 128], help="sequence lengths (default 32,128)"
    )
    parser.add_argument("--rounds", type=positive_int, default=15, help="timed rounds (default 15)")
    parser.add_argument(
        "--calls", type=positive_int, default=20, help="invokes per round (default 20)"
    )
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    rows = measure(args.lengths, args.rounds, args.calls)
    print(f"LiteRT, 1 thread, p50 of {args.rounds} rounds; {HEADS} heads, d_k {D_K}\n")
    print(
        format_table(
            ["case", "T", "float32", "int8", "int8/float32", "XNNPACK took (float32, int8)"],
            [
                [
                    r["case"],
                    r["length"],
                    f"{r['float32_ms']:.3f} ms",
                    f"{r['int8_ms']:.3f} ms",
                    f"{r['int8_over_float32']:.2f}",
                    f"{r['xnnpack_float32']}, {r['xnnpack_int8']}",
                ]
                for r in rows
            ],
        )
    )
    if args.json:
        write_json_atomic(args.json, {"rounds": args.rounds, "calls": args.calls, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
