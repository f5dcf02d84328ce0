"""Per-step communication: data parallel against head sharding (docs/distribution.md).

    make bench-communication
    (XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax
     .venv-jax/bin/python benchmarks/communication.py [--json OUT])

all-MiniLM-L6-v2 and BERT-base (the lesson's model), built on our layers as
`keras-mha-train --from` fine-tunes them (a 3-class head, the embedding
tables frozen), with random weights: what crosses devices depends on shapes
only. For each layout on 8 devices (JAX's CPU platform split in 8), one
training step (forward and the gradients of the trainable weights, a batch
of 32 sequences) is compiled, not run, and the collectives of XLA's compiled
program are added up: what the layout actually costs, including any
resharding XLA chose, not a formula's idea of it.

Each collective is counted as the bytes one device sends in a ring over its
group of n devices: all-reduce 2 (n - 1) / n of the array, all-gather and
reduce-scatter (n - 1) / n of the whole, all-to-all (n - 1) / n, a
collective-permute the array. The optimizer's update adds nothing: each
device updates the weights it holds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

DEVICES = 8
BATCH = 32
LENGTHS = (32, 128)
LAYOUTS = {  # name: (devices on the batch axis, devices on the model axis); 12 heads
    "data parallel 8": (8, 1),
    "heads 4 x 2": (4, 2),
    "heads 2 x 4": (2, 4),
}
DTYPE_BYTES = {"pred": 1, "c64": 8, "c128": 16}  # the rest by their bits: f32, bf16, f8e4m3fn
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\("
)
_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_GROUPS = re.compile(
    r"replica_groups=(\{\{[0-9,{}]*\}\}|\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)"
)


def _array_bytes(shape: str) -> list[int]:
    sizes = []
    for dtype, dims in _ARRAY.findall(shape):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        sizes.append(count * _dtype_bytes(dtype))
    return sizes


def _dtype_bytes(dtype: str) -> int:
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    bits = re.match(r"[a-z]+(\d+)", dtype)
    if bits is None:
        raise ValueError(f"an HLO array type this script does not size: {dtype}")
    return max(1, int(bits.group(1)) // 8)


def _group_size(line: str, devices: int) -> int:
    match = _GROUPS.search(line)
    if match is None:  # no groups: every device
        return devices
    groups = match.group(1)
    if groups.startswith("{{"):
        return len(groups[2:].split("}")[0].split(","))
    return int(groups[1:].split("]")[0].split(",")[-1])  # [G,S]<=[...]: groups of S


def collectives(hlo: str, devices: int) -> list[dict]:
    """Every collective of a compiled HLO module's text: its op, group size,
    array bytes and the bytes one device sends (module docstring)."""
    found = []
    for line in hlo.splitlines():
        line = _COMMENT.sub("", line)  # a long tuple's /*index=5*/ marks
        match = _OP.search(line)
        if match is None:
            continue
        op, sizes = match["op"], _array_bytes(match["shape"])
        if match["start"] and op == "all-gather":  # async: (operands, results)
            sizes = sizes[len(sizes) // 2 :]
        elif match["start"] and op == "collective-permute":  # (operand, result, contexts)
            sizes = sizes[:1]
        n = _group_size(line, devices)
        size = sum(sizes)
        share = (n - 1) / n if n > 1 else 0.0
        sent = {"all-reduce": 2 * share * size, "collective-permute": float(size)}.get(
            op, share * size
        )
        found.append({"op": op, "group": n, "bytes": size, "sent": sent})
    return found


def configs():
    from keras_mha.pretrained.config import BertConfig

    labels = ("first noun", "second noun", "neither")
    return {
        "all-MiniLM-L6-v2": BertConfig(30522, 384, 6, 12, 1536, 512, labels=labels),
        "BERT-base": BertConfig(30522, 768, 12, 12, 3072, 512, pooling="cls", labels=labels),
    }


def compiled_step(config, layout: tuple[int, int], length: int) -> str:
    """The compiled HLO of one training step of `config` under `layout`."""
    import jax
    import keras
    import numpy as np

    from keras_mha.distribution import layout_map
    from keras_mha.pretrained.bert import build_encoder

    keras.distribution.set_distribution(None)
    keras.utils.set_random_seed(0)
    single = build_encoder(config)
    devices = keras.distribution.list_devices("cpu")[:DEVICES]
    batch, model = layout
    if model == 1:
        distribution = keras.distribution.DataParallel(devices=devices)
    else:
        mesh = keras.distribution.DeviceMesh((batch, model), ("batch", "model"), devices)
        distribution = keras.distribution.ModelParallel(
            layout_map=layout_map(single, mesh), batch_dim_name="batch"
        )
    keras.distribution.set_distribution(distribution)
    sharded = keras.models.clone_model(single)
    sharded.get_layer("embedding").trainable = False  # as keras-mha-train --from
    ids = np.ones((BATCH, length), "int32")
    labels = np.zeros((BATCH,), "int32")
    place = distribution.get_data_layout
    ids = jax.device_put(ids, place(ids.shape).backend_layout)
    labels = jax.device_put(labels, place(labels.shape).backend_layout)
    trainable = [v.value for v in sharded.trainable_variables]
    fixed = [v.value for v in sharded.non_trainable_variables]

    def loss(t, f, x, y):  # the frozen tables as an argument: no 94 MB constant
        probs = sharded.stateless_call(t, f, x)[0]
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, probs))

    step = jax.jit(jax.value_and_grad(loss))  # the gradients of the trainable weights
    text = step.lower(trainable, fixed, ids, labels).compile().as_text()
    keras.distribution.set_distribution(None)
    return text


def main(argv: list[str] | None = None) -> int:
    import keras

    parser = argparse.ArgumentParser(prog="communication.py")
    parser.add_argument("--json", help="also write the table as JSON")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "jax" or len(keras.distribution.list_devices("cpu")) < DEVICES:
        print(
            f"communication.py: needs KERAS_BACKEND=jax and {DEVICES} CPU devices "
            f"(XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES})",
            file=sys.stderr,
        )
        return 2
    rows = []
    for name, config in configs().items():
        for length in LENGTHS:
            for layout_name, layout in LAYOUTS.items():
                started = time.perf_counter()
                found = collectives(compiled_step(config, layout, length), DEVICES)
                by_op = {}
                for c in found:
                    by_op[c["op"]] = by_op.get(c["op"], 0.0) + c["sent"]
                row = {
                    "model": name, "length": length, "layout": layout_name,
                    "collectives": len(found), "sent_mb": sum(by_op.values()) / 1e6,
                    "by_op_mb": {k: v / 1e6 for k, v in sorted(by_op.items())},
                    "compile_s": round(time.perf_counter() - started, 1),
                }  # fmt: skip
                rows.append(row)
                print(
                    f"{name:18s} T={length:<4d} {layout_name:16s} {row['sent_mb']:9.1f} MB sent "
                    f"a device a step, {len(found)} collectives "
                    f"({', '.join(f'{k} {v:.1f}' for k, v in row['by_op_mb'].items())})",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"batch": BATCH, "devices": DEVICES, "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
