"""Record a `.keras` file of today's layer as text: tests/data/saved_layer_0.2.0.json.

Run once, before keras_mha/attention.py became the package keras_mha/attention/
(issue 47), with that commit's code:

    .venv/bin/python tests/data/record_saved_layer.py

A small functional model (the layer fused with a mask, and per_head with
attention_axes and no bias) is saved with `model.save`; the JSON holds the
archive's config.json and metadata.json as written, every dataset of its
model.weights.h5 (path, dtype, values), fixed inputs and the outputs the
model gave. tests/test_attention_keras.py writes the archive back (h5py) and
loads it with today's code: a file saved before the move still loads and
gives the same numbers. Text, not a binary: the weights are seeded random.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import zipfile

import h5py
import keras
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from keras_mha import MultiHeadAttention  # noqa: E402


def main() -> None:
    keras.utils.set_random_seed(3)
    x = keras.Input((4, 8), name="x")
    m = keras.Input((4, 4), name="m", dtype="bool")
    fused = MultiHeadAttention(num_heads=2, key_dim=4, name="fused")(x, x, attention_mask=m)
    per_head = MultiHeadAttention(
        num_heads=2, key_dim=3, value_dim=5, use_bias=False, implementation="per_head",
        output_shape=(6,), name="per_head",
    )(fused, x)  # fmt: skip
    model = keras.Model([x, m], [fused, per_head])
    rng = np.random.default_rng(5)
    for w in model.weights:  # nonzero biases too
        w.assign(rng.normal(0, 0.5, w.shape).astype("float32"))
    xs = rng.normal(size=(2, 4, 8)).astype("float32")
    ms = np.tril(np.ones((4, 4), bool))[None].repeat(2, 0)
    ms[1, :, 0] = True
    outs = [np.asarray(o) for o in model([xs, ms])]
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "model.keras"
        model.save(path)
        with zipfile.ZipFile(path) as z:
            config = z.read("config.json").decode()
            metadata = z.read("metadata.json").decode()
            (pathlib.Path(tmp) / "w.h5").write_bytes(z.read("model.weights.h5"))
        datasets = {}
        with h5py.File(pathlib.Path(tmp) / "w.h5") as h5:
            h5.visititems(
                lambda name, obj: (
                    datasets.__setitem__(
                        name, {"dtype": str(obj.dtype), "values": np.asarray(obj).tolist()}
                    )
                    if isinstance(obj, h5py.Dataset)
                    else None
                )
            )
            groups = []
            h5.visititems(
                lambda name, obj: groups.append(name) if isinstance(obj, h5py.Group) else None
            )
    record = {
        "keras": keras.__version__,
        "config.json": config,
        "metadata.json": metadata,
        "groups": groups,
        "datasets": datasets,
        "x": xs.tolist(),
        "m": ms.tolist(),
        "outputs": [o.tolist() for o in outs],
    }
    out = HERE / "saved_layer_0.2.0.json"
    out.write_text(json.dumps(record) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
