"""Our layers under keras.distribution (keras_mha/distribution.py), on JAX's CPU
platform split into 8 devices (`--xla_force_host_platform_device_count`, in a
child process: the count is fixed when JAX starts).

Under DataParallel and under ModelParallel with `layout_map`'s head split, the
attention layer (all heads and grouped), our encoder block and the decoder
block give the single-device outputs and gradients; the variables keep the
shardings the map asked for; a split the heads do not divide is refused in one
line naming the layer, by `layout_map` and by the layer under a hand-written map.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest
from environment import JAX_TEST_XLA_FLAGS

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution shards on JAX")

DEVICES = 8


def _run(script: str) -> dict:
    """`script` in a fresh Python on 8 CPU devices; its last line of output is JSON."""
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        # 8 devices, then the layer tests' cheap code generation (tests/environment.py;
        # XLA ignores flags after its bare intra_op_parallelism_threads=1)
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES} {JAX_TEST_XLA_FLAGS}",
    }
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True, text=True, env=env, check=False, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SHARDED_AGREES = """
import json
import jax, numpy as np, keras
from keras_mha import MultiHeadAttention, GroupedQueryAttention
from keras_mha.decoder.model import DecoderBlock
from keras_mha.distribution import layout_map
from keras_mha.layers import TransformerEncoderBlock

devices = keras.distribution.list_devices("cpu")
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 6, 32)).astype("float32")
y = rng.standard_normal((8, 6, 32)).astype("float32")
DECODER = {"hidden_size": 32, "num_attention_heads": 8, "num_key_value_heads": 4,
           "head_dim": 4, "intermediate_size": 64, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "num_hidden_layers": 1, "vocab_size": 16,
           "max_position_embeddings": 16, "tie_word_embeddings": True}

def build():  # every layer the map splits: attention (all heads, grouped), both blocks
    inputs = keras.Input((6, 32))
    h = MultiHeadAttention(num_heads=8, key_dim=4, name="mha")(inputs, inputs)
    h = GroupedQueryAttention(head_dim=4, num_query_heads=8, num_key_value_heads=4,
                              name="gqa")(h, h)
    h = GroupedQueryAttention(head_dim=4, num_query_heads=8, num_key_value_heads=2,
                              name="gqa_two")(h, h)  # 2 key/value heads, 4 devices: whole
    h = TransformerEncoderBlock(8, 64, name="encoder_block")(h)
    h = DecoderBlock(DECODER, name="decoder_block")(h)[0]
    h = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8, name="keras")(h, h)  # Keras's
    return keras.Model(inputs, h)

def run(model):
    # the outputs for x and the gradients of the mean squared error against y,
    # as one compiled program (eager, every op would compile for 8 devices)
    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def forward(t):
        return model.stateless_call(t, fixed, x)[0]

    def loss(t):
        return jax.numpy.mean((forward(t) - y) ** 2)

    out, grads = jax.jit(lambda t: (forward(t), jax.grad(loss)(t)))(trainable)
    return np.asarray(out), [np.asarray(g) for g in grads]

def largest(a, b):
    return max(float(np.abs(u - v).max()) for u, v in zip(a, b))

keras.utils.set_random_seed(0)
single = build()
want, want_grads = run(single)
out = {"scale": float(np.abs(want).max()), "grad_scale": max(float(np.abs(g).max()) for g in want_grads)}
for kind in ("data", "heads"):
    if kind == "data":
        dist = keras.distribution.DataParallel(devices=devices)
    else:
        mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
        dist = keras.distribution.ModelParallel(layout_map=layout_map(single, mesh),
                                                batch_dim_name="batch")
    keras.distribution.set_distribution(dist)
    sharded = keras.models.clone_model(single)
    sharded.set_weights(single.get_weights())
    out[kind] = {
        "specs": {v.path: [None if a is None else str(a) for a in v.value.sharding.spec]
                  for v in sharded.weights if any(v.value.sharding.spec)},
    }
    got, got_grads = run(sharded)
    out[kind]["out"] = float(np.abs(got - want).max())
    out[kind]["grads"] = largest(got_grads, want_grads)
print(json.dumps(out))
"""


def test_sharded_layers_give_the_single_device_outputs_and_gradients():
    found = _run(SHARDED_AGREES)
    # The same float32 sums in another order (4 devices' partial sums of W^O's
    # contraction over heads and of the feed-forward's): each of the 6 layers
    # rounds a few ulps (1.2e-7 of the value) apart. Measured on an Intel Xeon:
    # 3.8e-7 of the largest output, 3.0e-7 of the largest gradient (heads), 0 and
    # 2.2e-7 (data). Bound: 2e-6 of the largest, 17 ulps.
    for kind in ("data", "heads"):
        got = found[kind]
        assert got["out"] <= 2e-6 * found["scale"], (kind, got)
        assert got["grads"] <= 2e-6 * found["grad_scale"], (kind, got)
    assert found["data"]["specs"] == {}  # DataParallel: every weight whole on every device
    assert found["heads"]["specs"] == expected_specs()


def expected_specs() -> dict:
    """What layout_map asks of the model SHARDED_AGREES builds, written out."""
    heads, output = [None, "model", None], ["model", None, None]
    specs = {}

    def attention(prefix: str, bias: bool = True, key_value: bool = True):
        names = ("query", "key", "value") if key_value else ("query",)
        for name in names:
            specs[f"{prefix}/{name}/kernel"] = heads
            if bias:
                specs[f"{prefix}/{name}/bias"] = ["model", None]
        specs[f"{prefix}/attention_output/kernel"] = output  # its bias stays whole

    attention("mha")
    attention("gqa")
    attention("gqa_two", key_value=False)  # 2 key/value heads on 4 devices: whole
    attention("encoder_block/attention")
    specs["encoder_block/ffn_in/kernel"] = [None, "model"]
    specs["encoder_block/ffn_in/bias"] = ["model"]
    specs["encoder_block/ffn_out/kernel"] = ["model", None]
    attention("decoder_block/attention", bias=False)
    specs["decoder_block/ffn/gate/kernel"] = [None, "model"]
    specs["decoder_block/ffn/up/kernel"] = [None, "model"]
    specs["decoder_block/ffn/down/kernel"] = ["model", None]
    attention("keras")  # Keras's own layer: its kernels are laid out alike
    return specs


REFUSED = """
import json
import numpy as np, keras
from keras_mha import MultiHeadAttention
from keras_mha.distribution import layout_map
from keras_mha.layers import TransformerEncoderBlock

devices = keras.distribution.list_devices("cpu")[:2]
mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"), devices)
inputs = keras.Input((5, 18))
model = keras.Model(inputs, MultiHeadAttention(num_heads=9, key_dim=2, name="nine")(inputs, inputs))
messages = {}
try:
    layout_map(model, mesh)
except ValueError as error:
    messages["layout_map"] = str(error)
# LoRA on (the kernel a computed array) and a feed-forward of 13 units (16 less 3
# outliers) that 2 devices do not divide: heads split, that feed-forward whole
lora = MultiHeadAttention(num_heads=4, key_dim=2, name="lora")
h = TransformerEncoderBlock(2, 16, ffn_outliers=3, name="outliers")(lora(inputs, inputs))
lora.enable_lora(2)
messages["keys"] = sorted(layout_map(keras.Model(inputs, h), mesh).keys())
hand = keras.distribution.LayoutMap(mesh)
hand["nine/(query|key|value)/kernel"] = (None, "model", None)
hand["short/query/kernel"] = (None, "model")  # shorter than the kernel, as Keras takes it
keras.distribution.set_distribution(
    keras.distribution.ModelParallel(layout_map=hand, batch_dim_name="batch"))
try:
    MultiHeadAttention(num_heads=9, key_dim=2, name="nine")(np.zeros((2, 5, 18), "float32"),
                                                           np.zeros((2, 5, 18), "float32"))
except ValueError as error:
    messages["build"] = str(error)
try:
    MultiHeadAttention(num_heads=9, key_dim=2, name="short")(np.zeros((2, 5, 18), "float32"),
                                                            np.zeros((2, 5, 18), "float32"))
except ValueError as error:
    messages["short"] = str(error)
print(json.dumps(messages))
"""


def test_heads_that_do_not_divide_over_the_devices_are_refused_in_one_line():
    messages = _run(REFUSED)
    attention = [
        f"{p}/{n}/{v}"
        for p in ("lora", "outliers/attention")
        for n in ("query", "key", "value")
        for v in ("kernel", "bias")
    ]
    attention += ["lora/attention_output/kernel", "outliers/attention/attention_output/kernel"]
    assert messages["keys"] == sorted(attention)
    for where, name in (("layout_map", "nine"), ("build", "nine"), ("short", "short")):
        message = messages[where]
        assert "\n" not in message, message
        assert message == (
            f"{name}: 9 heads of {name}/query/kernel (18, 9, 2) do not divide over the 2 "
            "devices of mesh axis 'model'; use a mesh whose 'model' axis divides 9"
        ), message
