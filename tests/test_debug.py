"""The quantization debugger (edge_demo/debug/debugger.py) on a real exported bundle.

The session's digits bundle (edge_fixtures: the small trained digits run
exported by `keras_mha_export`), float32 and int8; LiteRT runs here (it is all the
debugger needs). Tampering uses TensorFlow's flatbuffer tools.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from keras_mha_edge.debug.debugger import debug_mode, float_ops, format_debug_table

SAMPLES = 40
NUM_HEADS = 2  # conftest.make_digits_run

pytest_plugins = ["edge_fixtures"]  # the session's digits bundle


@pytest.fixture(scope="module")
def models(digits_bundle) -> dict:
    bundle = digits_bundle
    manifest = json.loads((bundle / "manifest.json").read_text())
    with np.load(bundle / "eval.npz") as npz:
        x = npz["x"][:SAMPLES]
    files = {
        mode: (bundle / manifest["models"][mode]["file"]).read_bytes()
        for mode in ("float32", "int8")
    }
    return {"x": x, **files}


def test_float32_against_itself_has_no_error(models):
    rows = debug_mode(models["float32"], models["float32"], models["x"], num_heads=NUM_HEADS)
    assert len(rows) > 20
    assert all(r.rel_rmse == 0 and r.max_abs == 0 for r in rows)
    ops = {r.op for r in rows}
    assert {"input", "SOFTMAX", "FULLY_CONNECTED", "BATCH_MATMUL"} <= ops


def test_int8_errors_are_finite_nonzero_worst_first_with_heads(models):
    rows = debug_mode(models["float32"], models["int8"], models["x"], num_heads=NUM_HEADS)
    activations = [r for r in rows if r.op != "const"]
    assert len(activations) > 20
    # Every activation of an int8 graph is rounded to its scale: never exact over 40 digits.
    assert all(math.isfinite(r.rel_rmse) and r.rel_rmse > 0 and r.max_abs > 0 for r in activations)
    assert all(r.dtype == "int8" and r.rmse_quanta is not None for r in activations)
    errors = [r.rel_rmse for r in rows]
    assert errors == sorted(errors, reverse=True)
    # Attention scores (1, heads, T, T) get one row per head beside the whole tensor.
    scores = [r for r in rows if r.op == "SOFTMAX" and len(r.shape) == 4]
    assert scores and {r.head for r in scores} == {None, *range(NUM_HEADS)}
    assert float_ops(models["int8"]) == []
    table = format_debug_table(rows, limit=5).splitlines()
    assert table[0].split()[:2] == ["tensor", "op"] and rows[0].name in table[2]
    assert table[-1] == f"... {len(rows) - 5} more rows"


def _tampered_reshape(content: bytes, factor: float) -> tuple[bytes, str]:
    """The int8 model with the first RESHAPE output's scale multiplied by `factor`.

    RESHAPE copies its int8 bytes unchanged, so only that tensor reads
    `factor` times too large; its producer is exact and its consumers
    requantize into their own (clipped) ranges.
    """
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    graph = model.subgraphs[0]
    for op in graph.operators:
        if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) == "RESHAPE":
            tensor = graph.tensors[op.outputs[0]]
            if tensor.quantization is not None and tensor.quantization.scale is not None:
                tensor.quantization.scale = [float(tensor.quantization.scale[0]) * factor]
                data = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
                return data, tensor.name.decode().split(";")[0]
    raise AssertionError("no quantized RESHAPE in the int8 model")


def test_a_tampered_scale_ranks_its_tensor_worst(models):
    tampered, name = _tampered_reshape(models["int8"], 64.0)
    rows = debug_mode(models["float32"], tampered, models["x"], num_heads=NUM_HEADS)
    worst = rows[0]
    assert name.endswith(worst.name) and worst.op == "RESHAPE", (name, worst)
    # 64 x the right value: 63 x the float tensor's RMS off, give or take its rounding.
    assert 55 < worst.rel_rmse < 70
    assert all(r.rel_rmse < worst.rel_rmse / 2 for r in rows if r.name != worst.name)


def test_a_stripped_model_cannot_be_debugged(models):
    from keras_mha_export.deploy import strip_model

    with pytest.raises(ValueError, match="debug the named file"):
        debug_mode(models["float32"], strip_model(models["int8"]), models["x"])
