"""Make the legacy `.keras` fixtures: files as keras_mha 0.1.0 wrote them.

keras_mha 0.1.0 stored the layer's weights on the layer itself, heads first:
`query_kernel` (h, d_model, d_k), ..., `output_kernel` (h * d_v, d_out), and
called the output size `output_dim`. Today's layer keeps Keras's sublayer
layout (docs/layer.md) and must still load those files.

The first part of this file is what 0.1.0 wrote, as data: the model configs
(config.json) and, for each layer, its weights-file group and variables in
the order 0.1.0's `build` created them (model.weights.h5). The second part
writes `.keras` files from that description with seeded random weights (no
Keras, no git history: h5py and numpy only) and computes, in numpy from the
same weights, what 0.1.0's equations give on fixed inputs:

    .venv/bin/python tests/data/make_legacy_fixtures.py [OUT_DIR]

Writes OUT_DIR/legacy_0.1.0_{mha,block}.keras and legacy_0.1.0.npz (OUT_DIR
defaults to .cache/legacy_fixtures). tests/test_attention_keras.py makes them
in a temporary directory with `make(out)`.
"""

from __future__ import annotations

import io
import json
import pathlib
import sys
import zipfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
CACHE = HERE.parents[1] / ".cache" / "legacy_fixtures"

# =========================================================== what 0.1.0 wrote
KERAS_VERSION = "3.15.1"  # the Keras the 0.1.0 files were recorded with (metadata.json)
DATE_SAVED = "2026-12-01@21:06:24"
FLOAT32 = {
    "module": "keras",
    "class_name": "DTypePolicy",
    "config": {"name": "float32"},
    "registered_name": None,
}


def mha_config(name, num_heads, key_dim, value_dim, output_dim, use_bias, implementation):
    """keras_mha 0.1.0's `MultiHeadAttention.get_config()`: `output_dim`; no
    output_shape, attention_axes, use_gate, sliding_window, flash_attention."""
    return {
        "name": name,
        "trainable": True,
        "dtype": FLOAT32,
        "num_heads": num_heads,
        "key_dim": key_dim,
        "value_dim": value_dim,
        "output_dim": output_dim,
        "dropout": 0.0,
        "use_bias": use_bias,
        "implementation": implementation,
        "kernel_initializer": {
            "module": "keras.initializers",
            "class_name": "GlorotUniform",
            "config": {"seed": None, "input_axes": None, "output_axes": None},
            "registered_name": None,
        },
        "bias_initializer": {
            "module": "keras.initializers",
            "class_name": "Zeros",
            "config": {},
            "registered_name": None,
        },
        "kernel_regularizer": None,
        "bias_regularizer": None,
        "activity_regularizer": None,
        "kernel_constraint": None,
        "bias_constraint": None,
        "seed": None,
    }


def block_config(name, num_heads, ff_dim):
    """keras_mha 0.1.0's `TransformerEncoderBlock.get_config()`."""
    return {
        "name": name,
        "trainable": True,
        "dtype": FLOAT32,
        "num_heads": num_heads,
        "ff_dim": ff_dim,
        "dropout": 0.0,
        "key_dim": None,
        "implementation": "fused",
        "epsilon": 1e-06,
        "seed": None,
    }


def _input(name, shape):
    return {
        "module": "keras.layers",
        "class_name": "InputLayer",
        "config": {
            "batch_shape": [None, *shape],
            "dtype": "float32",
            "sparse": False,
            "ragged": False,
            "name": name,
            "optional": False,
        },
        "registered_name": None,
        "name": name,
        "inbound_nodes": [],
    }


def _tensor(shape, layer):
    return {
        "class_name": "__keras_tensor__",
        "config": {"shape": [None, *shape], "dtype": "float32", "keras_history": [layer, 0, 0]},
    }


def _layer(module, class_name, config, build_config, args, kwargs):
    return {
        "module": module,
        "class_name": class_name,
        "config": config,
        "registered_name": f"keras_mha>{class_name}",
        "build_config": build_config,
        "name": config["name"],
        "inbound_nodes": [{"args": args, "kwargs": kwargs}],
    }


def _functional(name, layers, input_layers, output_layers):
    return {
        "module": "keras.src.models.functional",
        "class_name": "Functional",
        "config": {
            "name": name,
            "trainable": True,
            "layers": layers,
            "input_layers": input_layers,
            "output_layers": output_layers,
        },
        "registered_name": "Functional",
        "build_config": {"input_shape": None},
        "compile_config": {},
    }


# legacy_0.1.0_mha.keras: query x (B, 5, 8), memory m (B, 3, 4);
#   mha = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=4, output_dim=6)(x, m)
#   nobias = MultiHeadAttention(num_heads=4, use_bias=False, implementation="per_head")(x)
MHA_MODEL = _functional(
    "functional",
    [
        _input("input_layer", (5, 8)),
        _input("input_layer_1", (3, 4)),
        _layer(
            "keras_mha.attention",
            "MultiHeadAttention",
            mha_config("mha", 2, 3, 4, 6, True, "fused"),
            {"shapes_dict": {"query_shape": [None, 5, 8], "value_shape": [None, 3, 4]}},
            [_tensor((5, 8), "input_layer"), _tensor((3, 4), "input_layer_1")],
            {},
        ),
        _layer(
            "keras_mha.attention",
            "MultiHeadAttention",
            mha_config("nobias", 4, None, None, None, False, "per_head"),
            {"input_shape": [None, 5, 8]},
            [_tensor((5, 8), "input_layer")],
            {},
        ),
    ],
    [["input_layer", 0, 0], ["input_layer_1", 0, 0]],
    [["mha", 0, 0], ["nobias", 0, 0]],
)

# legacy_0.1.0_block.keras: TransformerEncoderBlock(num_heads=2, ff_dim=16)(x).
BLOCK_MODEL = _functional(
    "functional_1",
    [
        _input("input_layer_2", (5, 8)),
        _layer(
            "keras_mha.layers",
            "TransformerEncoderBlock",
            block_config("block", 2, 16),
            {"input_shape": [None, 5, 8]},
            [_tensor((5, 8), "input_layer_2")],
            {"mask": None},
        ),
    ],
    ["input_layer_2", 0, 0],
    ["block", 0, 0],
)


def mha_variables(h, d_model, d_key, d_value, d_k, d_v, d_out, use_bias):
    """0.1.0's variables in creation order: kernels heads first, W^O (h * d_v, d_out)."""
    names = [
        ("query_kernel", (h, d_model, d_k)),
        ("query_bias", (h, d_k)),
        ("key_kernel", (h, d_key, d_k)),
        ("key_bias", (h, d_k)),
        ("value_kernel", (h, d_value, d_v)),
        ("value_bias", (h, d_v)),
        ("output_kernel", (h * d_v, d_out)),
        ("output_bias", (d_out,)),
    ]
    return [(n, s) for n, s in names if use_bias or not n.endswith("_bias")]


def _norm(d):
    return [("gamma", (d,)), ("beta", (d,))]


# model.weights.h5: group -> (the `name` attribute of its vars group, variables
# written as vars/0, vars/1, ...). Groups are Keras's paths to each layer.
MHA_WEIGHTS = {
    "layers/input_layer": ("input_layer", []),
    "layers/input_layer_1": ("input_layer_1", []),
    "layers/multi_head_attention": ("mha", mha_variables(2, 8, 4, 4, 3, 4, 6, True)),
    "layers/multi_head_attention/_dropout_layer": ("dropout", []),
    "layers/multi_head_attention_1": ("nobias", mha_variables(4, 8, 8, 8, 2, 2, 8, False)),
    "layers/multi_head_attention_1/_dropout_layer": ("dropout_1", []),
    "": ("functional", []),
}
_BLOCK = "layers/transformer_encoder_block"
BLOCK_WEIGHTS = {
    "layers/input_layer": ("input_layer_2", []),
    _BLOCK: ("block", []),
    f"{_BLOCK}/_ffn_in": ("ffn_in", [("kernel", (8, 16)), ("bias", (16,))]),
    f"{_BLOCK}/_ffn_out": ("ffn_out", [("kernel", (16, 8)), ("bias", (8,))]),
    f"{_BLOCK}/attention": ("attention", mha_variables(2, 8, 8, 8, 4, 4, 8, True)),
    f"{_BLOCK}/attention/_dropout_layer": ("dropout_2", []),
    f"{_BLOCK}/attention_dropout": ("dropout_3", []),
    f"{_BLOCK}/attention_norm": ("attention_norm", _norm(8)),
    f"{_BLOCK}/ffn_dropout": ("dropout_4", []),
    f"{_BLOCK}/ffn_norm": ("ffn_norm", _norm(8)),
    "": ("functional_1", []),
}


# ============================================================ the fixtures
def random_weights(layout: dict, seed: int) -> dict:
    """group -> {variable: array}: kernels ~ N(0, 1/fan_in), biases and the
    norms' offsets ~ N(0, 0.3), gammas 1 + N(0, 0.3): nothing zero or one,
    so a misplaced bias or transposed kernel changes the outputs."""
    rng = np.random.default_rng(seed)
    weights = {}
    for group, (_, variables) in layout.items():
        weights[group] = {}
        for name, shape in variables:
            if name.endswith("kernel"):
                fan_in = shape[-2] if len(shape) == 3 else shape[0]
                value = rng.standard_normal(shape) / np.sqrt(fan_in)
            else:
                value = (name == "gamma") + 0.3 * rng.standard_normal(shape)
            weights[group][name] = value.astype("float32")
    return weights


def write_keras_file(path: pathlib.Path, config: dict, layout: dict, weights: dict) -> None:
    """A `.keras` zip as Keras writes one: metadata.json, config.json, model.weights.h5."""
    import h5py

    h5 = io.BytesIO()
    with h5py.File(h5, "w") as f:
        for group, (name, variables) in layout.items():
            vars_group = f.create_group(f"{group}/vars" if group else "vars")
            vars_group.attrs["name"] = name
            for i, (var, _) in enumerate(variables):
                vars_group.create_dataset(str(i), data=weights[group][var])
    metadata = {"keras_version": KERAS_VERSION, "date_saved": DATE_SAVED}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", json.dumps(metadata))
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", h5.getvalue())


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def mha_reference(w: dict, query, value):
    """0.1.0's equations on its own layout (float64): head i's W_i = kernel[i],
    Concat(heads) (h * d_v) times output_kernel. No biases: use_bias=False."""

    def bias(name, i=slice(None)):
        return w[name][i] if name in w else 0.0

    heads = []
    for i in range(w["query_kernel"].shape[0]):
        q = query @ w["query_kernel"][i] + bias("query_bias", i)  # Q W_i^Q + b_i^Q
        k = value @ w["key_kernel"][i] + bias("key_bias", i)
        v = value @ w["value_kernel"][i] + bias("value_bias", i)
        a = _softmax(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]))
        heads.append(a @ v)
    return np.concatenate(heads, -1) @ w["output_kernel"] + bias("output_bias")


def _layer_norm(x, w, eps=1e-6):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * w["gamma"] + w["beta"]


def block_reference(w: dict, x):
    """0.1.0's post-norm block: LN(x + MHA(x)), then LN(x + FFN(x))."""
    x = _layer_norm(
        x + mha_reference(w[f"{_BLOCK}/attention"], x, x), w[f"{_BLOCK}/attention_norm"]
    )
    ffn_in, ffn_out = w[f"{_BLOCK}/_ffn_in"], w[f"{_BLOCK}/_ffn_out"]
    hidden = np.maximum(x @ ffn_in["kernel"] + ffn_in["bias"], 0.0)
    return _layer_norm(x + hidden @ ffn_out["kernel"] + ffn_out["bias"], w[f"{_BLOCK}/ffn_norm"])


def make(out: pathlib.Path) -> pathlib.Path:
    """Write the two files and legacy_0.1.0.npz (inputs x, m; outputs mha,
    nobias, block) into `out`."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mha_weights = random_weights(MHA_WEIGHTS, seed=1)
    block_weights = random_weights(BLOCK_WEIGHTS, seed=2)
    write_keras_file(out / "legacy_0.1.0_mha.keras", MHA_MODEL, MHA_WEIGHTS, mha_weights)
    write_keras_file(out / "legacy_0.1.0_block.keras", BLOCK_MODEL, BLOCK_WEIGHTS, block_weights)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8)).astype("float32")
    m = rng.standard_normal((2, 3, 4)).astype("float32")
    x64, m64 = x.astype("float64"), m.astype("float64")
    f64 = {g: {k: v.astype("float64") for k, v in d.items()} for g, d in mha_weights.items()}
    b64 = {g: {k: v.astype("float64") for k, v in d.items()} for g, d in block_weights.items()}
    np.savez(
        out / "legacy_0.1.0.npz",
        x=x,
        m=m,
        mha=mha_reference(f64["layers/multi_head_attention"], x64, m64).astype("float32"),
        nobias=mha_reference(f64["layers/multi_head_attention_1"], x64, x64).astype("float32"),
        block=block_reference(b64, x64).astype("float32"),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    make(pathlib.Path(argv[0]) if argv else CACHE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
