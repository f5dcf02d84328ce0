"""The quantization debugger (edge_demo/debug/debugger.py) on a real exported bundle.

The session's digits bundle (edge_fixtures: the small trained digits run
exported by `keras_mha_export`), float32 and int8; LiteRT runs here (it is all the
debugger needs). Tampering uses TensorFlow's flatbuffer tools.

A dynamic sequence axis: the fast tests' tiny random BERT (tests/test_pretrained.py,
3 layers x 4 heads, built in the torch venv) imported as an embedding run and
exported in float32 and int8, each sentence run at its own length.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import shutil

import numpy as np
import pytest
from edge_bundle import edit_manifest, run_main

from edge_demo.app.cli import main
from edge_demo.debug import debugger
from edge_demo.debug.cli import DYNAMIC_SAMPLES
from edge_demo.debug.debugger import debug_mode, float_ops, format_debug_table
from edge_demo.runtimes.model import EdgeModel

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


def test_a_fixed_shape_model_keeps_its_stacked_path(models, monkeypatch):
    """A fixed-shape model's samples stay one stacked array per tensor, its shapes the
    tensors' own; the same samples joined one by one (the dynamic-length path) give the
    same rows up to float rounding."""
    details, values, _, roles, shapes = debugger._trace(models["int8"], models["x"])
    activations = [i for i in values if roles[i] == "act"]
    assert activations and all(len(values[i]) == 1 for i in values)
    assert all(values[i][0].shape[0] == SAMPLES for i in activations)
    assert all(shapes[i] == tuple(details[i]["shape"]) for i in details)
    stacked = debug_mode(models["float32"], models["int8"], models["x"], num_heads=NUM_HEADS)
    assert all(-1 not in r.shape for r in stacked)

    trace = debugger._trace

    def one_by_one(content, x, *rest):
        details, values, ops, roles, shapes = trace(content, x, *rest)
        split = {
            i: [part[n : n + 1] for part in v for n in range(len(part))] for i, v in values.items()
        }
        return details, split, ops, roles, shapes

    monkeypatch.setattr(debugger, "_trace", one_by_one)
    joined = debug_mode(models["float32"], models["int8"], models["x"], num_heads=NUM_HEADS)

    def key(r):
        return (r.name, r.op, r.head is None, r.head or 0, r.shape)

    assert len(joined) == len(stacked)
    for a, b in zip(sorted(stacked, key=key), sorted(joined, key=key)):
        assert key(a) == key(b) and a.dtype == b.dtype and a.scale == b.scale
        assert a.max_abs == b.max_abs
        assert a.rel_rmse == pytest.approx(b.rel_rmse, rel=1e-9, abs=1e-12)
        assert a.rmse_quanta == pytest.approx(b.rmse_quanta, rel=1e-9, abs=1e-12)


# --- a dynamic sequence axis: a sentence encoder, each sentence at its own length ---

ENCODER_SAMPLES = 12


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> dict:
    """The tiny random BERT (tests/test_view.py's way: the oracle's `tiny`, then
    `keras-mha-import`) exported in float32 and int8; int8 of random weights may
    miss parity, so it is kept either way (`allow_parity_failure`)."""
    from keras_mha.pretrained.cli import import_run
    from keras_mha_export.bundle import export_bundle
    from tests.test_pretrained import SHAPE, oracle, torch_python

    root = tmp_path_factory.mktemp("debug-bert")
    options = [f"--{k}={v}" for k, v in SHAPE.items()]
    oracle(torch_python(), "tiny", root / "model", *options, "--seed", 7)
    import_run(str(root / "model"), root / "run", max_length=64, log=lambda line: None)
    manifest = export_bundle(
        root / "run", root / "bundle", "float32,int8", allow_parity_failure=True
    )
    assert set(manifest.models) == {"float32", "int8"}
    assert all(entry.dynamic_length for entry in manifest.models.values())
    bundle = root / "bundle"
    with np.load(bundle / "eval.npz") as npz:
        x = npz["x"]
    files = {mode: (bundle / entry.file).read_bytes() for mode, entry in manifest.models.items()}
    return {"bundle": bundle, "x": x, "heads": SHAPE["heads"], "eval": len(x), **files}


# The padding mask's own tensors in an encoder's graph: its 0/1 lookup, (1 - m),
# the mask products and their reshapes, the masked-score correction, and the masked
# mean's (m - 1) * 30.
MASK_PATH = re.compile(
    r"^keras_mha_encoder_1/GatherV2$|pooling_1/(mul|sub)$"
    r"|attention_1/(ExpandDims(_\d)?|mul|mul_2|sub_1)$"
)


def attention_softmax(rows):
    """The attention weights' rows: SOFTMAX of (1, h, T, S) (the masked mean is a
    SOFTMAX over the tokens too, (1, T))."""
    return [r for r in rows if r.op == "SOFTMAX" and len(r.shape) == 4]


def _ids_of_length(x: np.ndarray, length: int) -> np.ndarray:
    """The longest eval sentence cut to `length` ids, padded to eval.npz's width."""
    row = np.zeros((1, x.shape[1]), x.dtype)
    row[0, :length] = x[np.argmax(EdgeModel.own_lengths(x)), :length]
    assert EdgeModel.own_lengths(row)[0] == length
    return row


def test_dynamic_float32_against_itself_has_no_error(encoder):
    x = encoder["x"][:ENCODER_SAMPLES]
    assert len(set(EdgeModel.own_lengths(x))) > 3  # sentences of many lengths, not the width
    rows = debug_mode(encoder["float32"], encoder["float32"], x, num_heads=encoder["heads"])
    assert len(rows) > 100
    assert all(r.rel_rmse == 0 and r.max_abs == 0 for r in rows)
    scores = attention_softmax(rows)
    assert len(scores) == 3 * (1 + encoder["heads"])  # 3 layers: the tensor and each head
    assert {r.shape for r in scores} == {(1, encoder["heads"], -1, -1)}
    # the masked mean is a softmax over the tokens too (0 on tokens, -30 on padding)
    assert [r.shape for r in rows if r.op == "SOFTMAX" and r not in scores] == [(1, -1)]


def test_dynamic_int8_errors_over_every_sentence_with_heads(encoder):
    heads, x = encoder["heads"], encoder["x"][:ENCODER_SAMPLES]
    rows = debug_mode(encoder["float32"], encoder["int8"], x, num_heads=heads)
    assert len(rows) > 100 and all(r.dtype == "int8" for r in rows)
    assert all(math.isfinite(r.rel_rmse) and r.rmse_quanta is not None for r in rows)
    # int8 errs everywhere but on the 0/1 padding mask and what only it feeds (0 and 1
    # are exact int8 values; the masked-score correction (1 - m)(scores - floor) is
    # exactly 0 at a sentence's own length): those and only those are exact
    exact = {r.name for r in rows if r.rel_rmse == 0}
    assert exact and all(MASK_PATH.search(name) for name in exact), exact
    assert sum(r.rel_rmse > 0 for r in rows) > 0.9 * len(rows)
    errors = [r.rel_rmse for r in rows]
    assert errors == sorted(errors, reverse=True) and errors[0] > 0
    scores = attention_softmax(rows)
    assert {r.name for r in scores} == {
        f"transformer_layer_{k}_1/attention_1/Softmax" for k in range(3)
    }
    assert {r.head for r in scores} == {None, *range(heads)}
    assert all(r.rel_rmse > 0 and r.max_abs > 0 and r.shape == (1, heads, -1, -1) for r in scores)
    # Only the head axis gets per-head rows: never a dim that changes with the length.
    assert all(r.shape.count(heads) == 1 for r in rows if r.head is not None)
    table = format_debug_table(scores).splitlines()
    assert f"1x{heads}x?x?" in table[2].split()


def test_dynamic_errors_pool_every_value_of_every_sentence(encoder):
    """Two sentences of lengths 9 and 23: the pair's RMSE is the root of the mean square
    over both sentences' values (weighted by their T x T), not a mean of the two;
    max |Δ| is the larger one."""
    x = encoder["x"]
    a, b = _ids_of_length(x, 9), _ids_of_length(x, 23)

    def softmax_rows(samples):
        rows = debug_mode(encoder["float32"], encoder["int8"], samples, num_heads=4)
        return {(r.name, r.head): r for r in attention_softmax(rows)}

    one, two, both = softmax_rows(a), softmax_rows(b), softmax_rows(np.concatenate([a, b]))
    assert set(one) == set(two) == set(both) and len(both) == 3 * 5
    for key, row in both.items():
        rmse = [r.rmse_quanta * r.scale for r in (one[key], two[key])]
        pooled = math.sqrt((81 * rmse[0] ** 2 + 529 * rmse[1] ** 2) / (81 + 529))
        assert row.rmse_quanta * row.scale == pytest.approx(pooled, rel=1e-9)
        assert row.max_abs == max(one[key].max_abs, two[key].max_abs)


def test_one_sentence_as_long_as_the_head_count_still_finds_the_head_axis(encoder):
    """A sentence of 4 tokens with 4 heads makes (1, 4, 4, 4) scores and (1, 4, 48)
    hidden states: one extra run at another length shows which dims are the length."""
    heads = encoder["heads"]
    row = _ids_of_length(encoder["x"], heads)
    rows = debug_mode(encoder["float32"], encoder["int8"], row, num_heads=heads)
    scores = attention_softmax(rows)
    assert {r.head for r in scores} == {None, *range(heads)}
    assert {r.shape for r in scores} == {(1, heads, -1, -1)}
    hidden = [r for r in rows if r.op == "FULLY_CONNECTED"]
    assert hidden and all(-1 in r.shape and r.head is None for r in hidden)
    assert all(r.shape.count(heads) == 1 for r in rows if r.head is not None)


def test_debug_cli_on_an_embedding_bundle(encoder, tmp_path):
    """`--debug int8` on the encoder: its first DYNAMIC_SAMPLES sentences, each at its own
    length, stated in the header; --json holds every row with the per-head softmax rows.
    An int8 that missed parity (marked unverified) is exactly what one debugs: no refusal."""
    bundle = pathlib.Path(shutil.copytree(encoder["bundle"], tmp_path / "bundle"))

    def unverify(manifest):
        manifest["models"]["int8"]["verified"] = False
        manifest["verified"] = ["float32"]

    edit_manifest(bundle, unverify)
    out_path = tmp_path / "debug.json"
    status, out, err = run_main(main, [bundle, "--debug", "int8", "--json", out_path])
    assert status == 0, err
    lines = out.splitlines()
    assert (
        f"int8 against float32 on the first {DYNAMIC_SAMPLES} of {encoder['eval']} eval samples, "
        "each at its own length;" in lines[0]
    ) and "heads 4" in lines[0]
    data = json.loads(out_path.read_text())
    assert data["samples"] == list(range(DYNAMIC_SAMPLES))
    rows = data["rows"]
    assert len(rows) > 100 and all(r["rel_rmse"] is not None for r in rows)
    scores = [r for r in rows if r["op"] == "SOFTMAX" and len(r["shape"]) == 4]
    assert {r["head"] for r in scores} == {None, 0, 1, 2, 3}
    assert all(r["shape"] == [1, 4, -1, -1] and r["rel_rmse"] > 0 for r in scores)
    table = [line.split() for line in lines[3:33]]
    assert [t[0] for t in table] == [r["name"] for r in rows[:30]]
    status, out, err = run_main(main, [bundle, "--debug", "int8", "--sample", 5])
    assert status == 0, err
    assert "int8 against float32 on eval sample 5 at its own length;" in out.splitlines()[0]
