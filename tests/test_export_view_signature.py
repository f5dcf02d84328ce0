"""The attention weights as a second signature of every exported mode.

For each mode, the model converted with `attention_saved_model_dir` must
give the same classification bytes as today's single-signature conversion
(subgraph 0 unchanged: ops, tensors, quantization, weights), and its `view`
signature must return the Keras model's own attention weights. Untrained
models keep this quick: conversion and quantization do not care whether the
weights were trained.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import textwrap

import numpy as np
import pytest
from edge_bundle import edge_python

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = ("float32", "dynamic", "float16", "int8", "int16x8")
# Attention weights lie in [0, 1]. float32 computes the same math (1e-5, as
# for the probabilities); float16 rounds weights to 11 significant bits
# (docs: about 1e-2); dynamic range stores weights >= 1024 values in int8 and
# quantizes activations on the fly; the integer modes' softmax output has a
# quantum of 1/256 (int8) or 1/32768 (int16), plus the error carried in from
# integer projections. Measured on an AMD EPYC with these untrained models
# (worst layer): float32 3e-7, float16 2e-4, dynamic 0.01, int8 0.03,
# int16x8 4e-3 (the token model's, made by ai-edge-quantizer: 2e-3). The bounds leave a 3x or wider margin for another CPU's
# rounding (a kernel one quantum off moves these by < 0.01).
ATTENTION_BOUNDS = {"float32": 1e-5, "dynamic": 0.05, "float16": 1e-2, "int8": 0.1, "int16x8": 0.05}
# The modes the converter is known not to produce, per model kind, with a
# fragment of the one-line reason export prints. Every other mode must
# convert; one of these converting is a change to record (README,
# docs/field_notes.md, docs/artifacts.md, mk/arm64.mk), not a pass.
# (TF 2.21's 16x8 quantizer finds no min/max for integer token-id inputs: export
# makes a token-id model's int16x8 with ai-edge-quantizer instead, export/aeq.py.)
EXPECTED_CONVERSION_FAILURES: dict[tuple[str, str], str] = {}


def _schema():
    from keras_mha_export.tflite_schema import schema

    return schema()


def _options(options) -> dict | None:
    """An op's builtin options as plain data (the generated classes use slots or dicts)."""
    if options is None:
        return None
    names = getattr(options, "__slots__", None) or list(vars(options))
    return {name: repr(getattr(options, name)) for name in names}


def _subgraph_contents(model: bytes, index: int = 0) -> dict:
    """Everything a runtime reads from one subgraph, buffer data included."""
    schema = _schema()
    root = schema.ModelT.InitFromObj(schema.Model.GetRootAs(bytearray(model), 0))
    graph = root.subgraphs[index]

    def data(buffer_index):
        buffer = root.buffers[buffer_index]
        return b"" if buffer.data is None else np.asarray(buffer.data, np.uint8).tobytes()

    def quant(tensor):
        q = tensor.quantization
        if q is None or q.scale is None:
            return None
        return (list(q.scale), list(q.zeroPoint), q.quantizedDimension)

    def code(op):
        c = root.operatorCodes[op.opcodeIndex]
        return (max(c.builtinCode, c.deprecatedBuiltinCode), c.version)

    return {
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "tensors": [
            (list(t.shape) if t.shape is not None else [], t.type, quant(t), data(t.buffer))
            for t in graph.tensors
        ],
        "ops": [
            (code(op), list(op.inputs), list(op.outputs), _options(op.builtinOptions))
            for op in graph.operators
        ],
    }


def _interpreter(model: bytes):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=model, num_threads=1)


def _to_input(x: np.ndarray, detail: dict) -> np.ndarray:
    """`round(x / scale) + zero_point` (half away from 0) for a quantized float input."""
    dtype = np.dtype(detail["dtype"])
    scale, zero_point = detail["quantization"]
    if not scale or dtype.kind == "f" or np.asarray(x).dtype.kind in "iu":
        return np.asarray(x).astype(dtype)
    v = np.asarray(x, np.float32) / np.float32(scale)
    q = np.sign(v) * np.floor(np.abs(v) + 0.5) + zero_point
    return np.clip(q, np.iinfo(dtype).min, np.iinfo(dtype).max).astype(dtype)


def _classify(model: bytes, x: np.ndarray) -> np.ndarray:
    """Raw output bytes of the default (subgraph 0) entry point, one sample at a time."""
    interpreter = _interpreter(model)
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    rows = []
    for row in x:
        interpreter.set_tensor(inp["index"], _to_input(row[None], inp))
        interpreter.invoke()
        rows.append(interpreter.get_tensor(out["index"]).copy())
    return np.stack(rows)


def _view(model: bytes, x: np.ndarray, description: dict) -> list[np.ndarray]:
    """The view signature's dequantized outputs per layer, `(N, h, T, T)`."""
    runner = _interpreter(model).get_signature_runner("view")
    inp = runner.get_input_details()["inputs"]
    per_layer = [[] for _ in description["outputs"]]
    for row in x:
        out = runner(inputs=_to_input(row[None], inp))
        for i, spec in enumerate(description["outputs"]):
            q = out[spec["name"]][0]
            if spec["scale"] is None:
                per_layer[i].append(q.astype(np.float64))
            else:
                per_layer[i].append((q.astype(np.float64) - spec["zero_point"]) * spec["scale"])
    return [np.stack(rows) for rows in per_layer]


def _build(kind: str):
    import keras

    from keras_mha.model import ModelConfig, build_classifier

    rng = np.random.default_rng(7)
    if kind == "features":
        config = ModelConfig(d_model=32, num_heads=[2, 4], num_layers=2, ff_dim=64, dropout=0.0)
        calibration = rng.uniform(0, 1, size=(64, 8, 8)).astype("float32")
        x = rng.uniform(0, 1, size=(40, 8, 8)).astype("float32")
    else:
        config = ModelConfig(
            input_kind="tokens", sequence_length=10, feature_dim=30, num_classes=3,
            d_model=16, num_heads=2, num_layers=2, ff_dim=16, dropout=0.0,
        )  # fmt: skip
        calibration = rng.integers(2, 30, size=(64, 10)).astype("int32")
        x = rng.integers(2, 30, size=(40, 10)).astype("int32")
        for rows in (calibration, x):  # padding at the end, 3..10 real tokens
            lengths = rng.integers(3, 11, size=len(rows))
            rows[np.arange(10)[None, :] >= lengths[:, None]] = 0
    keras.utils.set_random_seed(7)
    return build_classifier(config), calibration, x


@pytest.fixture(scope="module", params=["features", "tokens"])
def converted(request, tmp_path_factory):
    """Per mode: (single-signature bytes, with-view bytes) for one small model.

    `failures` holds the one-line reason of each mode that did not convert;
    `test_every_mode_converts_but_the_known_failures` judges them.
    """
    from keras_mha.model import forward
    from keras_mha_export.convert import (
        ConversionError,
        convert,
        write_attention_saved_model,
        write_saved_model,
    )

    model, calibration, x = _build(request.param)
    scratch = tmp_path_factory.mktemp(f"attention_{request.param}")
    write_saved_model(model, scratch / "classifier")
    write_attention_saved_model(model, scratch / "attention")
    _, scores = forward(model, x, return_attention_scores=True)
    reference = [np.asarray(s, dtype=np.float64) for s in scores]
    models, failures = {}, {}
    for mode in MODES:
        try:
            single = convert(scratch / "classifier", mode, calibration)
            both = convert(
                scratch / "classifier",
                mode,
                calibration,
                attention_saved_model_dir=scratch / "attention",
            )
        except ConversionError as error:  # recorded, and judged by a test below
            failures[mode] = str(error)
            continue
        models[mode] = (single, both)
    return {
        "kind": request.param,
        "x": x,
        "reference": reference,
        "models": models,
        "failures": failures,
    }


def _expected_failures(kind: str) -> dict[str, str]:
    return {mode: why for (k, mode), why in EXPECTED_CONVERSION_FAILURES.items() if k == kind}


def test_every_mode_converts_but_the_known_failures(converted):
    """Each mode converts, with and without the view; only a named, expected failure may not."""
    expected = _expected_failures(converted["kind"])
    unexpected = {m: why for m, why in converted["failures"].items() if m not in expected}
    assert unexpected == {}, f"modes that failed to convert: {unexpected}"
    for mode, why in expected.items():
        if mode in converted["models"]:
            pytest.fail(
                f"{mode} of a {converted['kind']} model now converts: a documented converter "
                "limit changed. Record it (README, docs/field_notes.md, docs/artifacts.md, "
                "mk/arm64.mk's ARM64_TEXT_MODES) and remove it from "
                "EXPECTED_CONVERSION_FAILURES.",
                pytrace=False,
            )
        reason = converted["failures"][mode]
        assert why in reason and "\n" not in reason, (mode, reason)
    assert sorted(converted["models"]) == sorted(set(MODES) - set(expected))


def test_attention_model_matches_forward_and_shares_weights():
    from keras_mha.model import attention_model, forward

    model, _, x = _build("features")
    probe = attention_model(model)
    # It tracks the classifier itself: the same variables, no copies.
    assert {id(w) for w in probe.weights} == {id(w) for w in model.weights}
    outputs = probe(x[:1])
    assert list(outputs) == ["attention_0", "attention_1"]
    _, scores = forward(model, x[:1], return_attention_scores=True)
    for name, expected in zip(outputs, scores, strict=True):
        np.testing.assert_array_equal(np.asarray(outputs[name]), np.asarray(expected))
    assert tuple(outputs["attention_1"].shape) == (1, 4, 8, 8)
    kernel = model.get_layer("embedding").kernel
    kernel.assign(kernel.numpy() * 3.0)  # the probe sees the classifier's own variables
    changed = np.asarray(probe(x[:1])["attention_0"])
    assert not np.allclose(changed, np.asarray(outputs["attention_0"]))


@pytest.mark.parametrize("implementation", ["per_head", "keras"])
def test_attention_model_reads_every_block_implementation(implementation):
    """Each attention layer records its weights while the model runs
    (attention.recording): keras_mha's layer, and a block on Keras's own
    (`implementation="keras"`)."""
    import keras

    from keras_mha.attention import attention_sink
    from keras_mha.model import ModelConfig, attention_model, build_classifier, forward

    keras.utils.set_random_seed(3)
    config = ModelConfig(d_model=16, num_heads=2, num_layers=2, ff_dim=16, dropout=0.0)
    model = build_classifier(dataclasses.replace(config, implementation=implementation))
    x = np.random.default_rng(3).uniform(0, 1, (3, 8, 8)).astype("float32")
    outputs = attention_model(model, batch_size=None)(x)
    _, scores = forward(model, x, return_attention_scores=True)
    assert list(outputs) == ["attention_0", "attention_1"]
    for name, expected in zip(outputs, scores, strict=True):
        np.testing.assert_allclose(np.asarray(outputs[name]), np.asarray(expected), atol=1e-6)
    left = [layer.name for layer in model._flatten_layers() if attention_sink(layer) is not None]
    assert left == []  # nothing left recording


def test_recording_is_per_context_nested_and_per_thread():
    """A recording inside a recording takes the layer's weights while it is open
    and leaves the outer one as it was; another thread calling the same layer
    records nothing; after the outer one ends, nothing records."""
    import threading

    from keras_mha.attention import MultiHeadAttention, attention_sink, recording

    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.random.default_rng(0).normal(size=(1, 5, 8)).astype("float32")
    layer(x, x)
    with recording([layer]) as outer:
        layer(x, x)
        with recording([layer]) as inner:
            layer(x, x)
        thread = threading.Thread(target=layer, args=(x, x))
        thread.start()
        thread.join()
        layer(x, x)
    layer(x, x)
    assert [len(outer), len(inner)] == [2, 1] and attention_sink(layer) is None
    assert outer[0][0] is layer and tuple(outer[0][1].shape) == (1, 2, 5, 5)
    _, expected = layer(x, x, return_attention_scores=True)
    np.testing.assert_allclose(np.asarray(inner[0][1]), np.asarray(expected), atol=1e-6)


def test_attention_model_refuses_a_model_that_runs_a_block_twice():
    import keras

    from keras_mha.layers import TransformerEncoderBlock
    from keras_mha.model import attention_model

    inputs = keras.Input((6, 8))
    block = TransformerEncoderBlock(num_heads=2, ff_dim=8, name="transformer_layer_0")
    model = keras.Model(inputs, block(block(inputs)))  # one block, run twice
    with pytest.raises(
        ValueError,
        match=r"ran its 1 keras_mha attention layers 2 times \(attention more than once\)",
    ):
        attention_model(model, batch_size=None)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True])
def test_attention_model_rejects_a_bad_batch_size(batch_size):
    from keras_mha.model import attention_model

    model, _, _ = _build("features")
    with pytest.raises(ValueError, match="argument `batch_size`"):
        attention_model(model, batch_size=batch_size)


def test_classification_is_bit_identical_and_subgraph_0_unchanged(converted):
    x = converted["x"]
    # Every mode but the known failures (judged above), and any mode that converts.
    assert set(MODES) - set(_expected_failures(converted["kind"])) <= set(converted["models"])
    for mode, (single, both) in converted["models"].items():
        assert _subgraph_contents(both, 0) == _subgraph_contents(single, 0), mode
        a, b = _classify(single, x), _classify(both, x)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), mode


def test_view_signature_returns_the_keras_attention(converted):
    from keras_mha_export.convert import attention_signature

    reference = converted["reference"]
    for mode, (single, both) in converted["models"].items():
        assert attention_signature(single) is None
        description = attention_signature(both)
        json.dumps(description)  # JSON-ready, for the manifest
        assert description["signature"] == "view" and description["subgraph"] == 1
        names = [o["name"] for o in description["outputs"]]
        assert names == [f"attention_{i}" for i in range(len(reference))]
        for out, ref in zip(description["outputs"], reference, strict=True):
            assert out["shape"] == [1, *ref.shape[1:]], mode
            # Without a mask the output is SOFTMAX's, whose scale is fixed (0..1).
            # With one, a query row with nothing to attend to is set to zeros
            # after it (a SELECT), whose range comes from calibration; it
            # still starts at 0 (int8 zero point -128).
            fixed = converted["kind"] == "features"
            if mode == "int8":
                assert (out["dtype"], out["zero_point"]) == ("int8", -128)
                assert not fixed or out["scale"] == 1 / 256
            elif mode == "int16x8":
                assert (out["dtype"], out["zero_point"]) == ("int16", 0)
                assert not fixed or out["scale"] == 1 / 32768
            else:
                assert (out["dtype"], out["scale"]) == ("float32", None)
        got = _view(both, converted["x"], description)
        for layer, (g, r) in enumerate(zip(got, reference, strict=True)):
            worst = float(np.abs(g - r).max())
            assert worst <= ATTENTION_BOUNDS[mode], (mode, layer, worst)
            # Padded keys get no weight; every real query row sums to ~1.
            if converted["kind"] == "tokens":
                padded = converted["x"] == 0
                assert (
                    np.abs(g.transpose(0, 3, 1, 2)[padded]).max() <= ATTENTION_BOUNDS[mode] + 1e-9
                )


def test_integer_view_subgraph_is_fully_integer(converted):
    schema = _schema()
    floats = {schema.TensorType.FLOAT32, schema.TensorType.FLOAT16}
    for mode in ("int8", "int16x8"):
        if mode in _expected_failures(converted["kind"]):
            continue  # judged by test_every_mode_converts_but_the_known_failures
        contents = _subgraph_contents(converted["models"][mode][1], 1)
        used = {
            i for _, inputs, outputs, _ in contents["ops"] for i in (*inputs, *outputs) if i >= 0
        }
        assert not [i for i in used if contents["tensors"][i][1] in floats], mode


def test_without_view_signature_keeps_subgraph_0(converted):
    from keras_mha_export.convert import attention_signature, without_view_signature

    single, both = converted["models"]["int8"]
    stripped = without_view_signature(both)
    assert attention_signature(stripped) is None
    assert _subgraph_contents(stripped, 0) == _subgraph_contents(single, 0)
    assert (
        _classify(stripped, converted["x"]).tobytes() == _classify(single, converted["x"]).tobytes()
    )


_TFLITE_SCRIPT = textwrap.dedent(
    """
    import json, sys, numpy as np
    from tflite_runtime.interpreter import Interpreter

    def classify(path, x):
        try:
            it = Interpreter(model_path=path, num_threads=1)
            it.allocate_tensors()
        except Exception as error:
            return "load: " + str(error).splitlines()[0]
        i, o = it.get_input_details()[0], it.get_output_details()[0]
        scale, zero = i["quantization"]
        rows = []
        try:
            for row in x:
                v = row[None].astype(np.float64)
                if scale and np.dtype(i["dtype"]).kind == "i" and x.dtype.kind == "f":
                    info = np.iinfo(i["dtype"])
                    v = np.sign(v / scale) * np.floor(np.abs(v / scale) + 0.5) + zero
                    v = np.clip(v, info.min, info.max)
                it.set_tensor(i["index"], v.astype(i["dtype"]))
                it.invoke()
                rows.append(it.get_tensor(o["index"]).copy())
        except Exception as error:
            return "run: " + str(error).splitlines()[0]
        return np.stack(rows).tobytes().hex()

    x = np.load(sys.argv[1])["x"]
    result = {}
    for mode in sys.argv[2].split(","):
        single = classify(f"{sys.argv[3]}/single_{mode}.tflite", x)
        both = classify(f"{sys.argv[3]}/both_{mode}.tflite", x)
        try:
            runner = Interpreter(model_path=f"{sys.argv[3]}/both_{mode}.tflite").get_signature_runner("view")
            dtype = runner.get_input_details()["inputs"]["dtype"]
            view = sorted(runner(inputs=np.zeros((1, *x.shape[1:]), dtype)))
        except Exception as error:
            view = "run: " + str(error).splitlines()[0]
        result[mode] = {"single": single, "both": both, "view": view}
    print(json.dumps(result))
    """
)


def test_tflite_runtime_214_classifies_as_before(converted, tmp_path):
    """tflite-runtime 2.14: the modes it ran before give the same bytes.

    This caught its XNNPACK delegate moving the float16 weights of the
    classifier when a second delegated subgraph was prepared (0.98 off).
    """
    edge_python("tflite-runtime")  # or missing(...): its venv, when this Python has the wheel
    result = _tflite_runtime_results(converted["models"], converted["x"][:20], tmp_path)
    refused = ("load:", "run:")
    # What 2.14 ran before (docs/artifacts.md); a token model's int8 masked
    # mean needs an int8 DIV it does not have.
    runs = (
        ("float32", "float16", "int8")
        if converted["kind"] == "features"
        else ("float32", "float16")
    )
    for mode in runs:
        entry = result[mode]
        assert not entry["single"].startswith(refused), (mode, entry["single"])
        assert isinstance(entry["view"], list), (mode, entry["view"])
    for mode, entry in result.items():  # the same bytes, or the same refusal
        failed = entry["single"].startswith(refused)
        assert failed == entry["both"].startswith(refused), (
            mode,
            entry["single"][:90],
            entry["both"][:90],
        )
        assert failed or entry["single"] == entry["both"], mode


def _tflite_runtime_results(models: dict[str, tuple[bytes, bytes]], x, tmp_path) -> dict:
    for mode, (single, both) in models.items():
        (tmp_path / f"single_{mode}.tflite").write_bytes(single)
        (tmp_path / f"both_{mode}.tflite").write_bytes(both)
    np.savez(tmp_path / "x.npz", x=x)
    proc = subprocess.run(
        [str(edge_python("tflite-runtime")), "-c", _TFLITE_SCRIPT, str(tmp_path / "x.npz"), ",".join(models), str(tmp_path)],
        capture_output=True, text=True, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tflite_runtime_214_float16_of_a_trained_model(digits_run, tmp_path):
    """The trained digits model is where 2.14's XNNPACK bug showed (see convert.py).

    With the view subgraph delegated too, this model's float16 probabilities
    came out 0.9998 off; untrained models did not show it.
    """
    edge_python("tflite-runtime")  # or missing(...): its venv, when this Python has the wheel
    import keras

    from keras_mha_export.convert import convert, write_attention_saved_model, write_saved_model

    model = keras.saving.load_model(digits_run / "model.keras")
    write_saved_model(model, tmp_path / "classifier")
    write_attention_saved_model(model, tmp_path / "attention")
    single = convert(tmp_path / "classifier", "float16")
    both = convert(
        tmp_path / "classifier", "float16", attention_saved_model_dir=tmp_path / "attention"
    )
    x = np.load(digits_run / "eval.npz")["x"][:60]
    entry = _tflite_runtime_results({"float16": (single, both)}, x, tmp_path)["float16"]
    assert not entry["single"].startswith(("load:", "run:")), entry["single"]
    assert entry["single"] == entry["both"]
    assert isinstance(entry["view"], list), entry["view"]


def test_attention_model_names_layers_in_the_order_they_run_at_any_depth():
    """Our classifier nested in another model (Keras lists a nested model's
    layers last first): attention_0 is still the first block's; and a block
    on Keras's layer, converted to ours, is read once, through our layer."""
    import keras

    import keras_mha
    from keras_mha.model import (
        ModelConfig,
        attention_model,
        attention_recorders,
        build_classifier,
        forward,
    )

    keras.utils.set_random_seed(3)
    config = ModelConfig(d_model=16, num_heads=[2, 4], num_layers=2, ff_dim=16, dropout=0.0)
    x = np.random.default_rng(3).uniform(0, 1, (3, 8, 8)).astype("float32")
    for implementation in ("fused", "keras"):
        inner = build_classifier(dataclasses.replace(config, implementation=implementation))
        inputs = keras.Input((8, 8))
        outer = keras.Model(inputs, inner(inputs))
        if implementation == "keras":
            outer = keras_mha.convert(outer)
            inner = outer.layers[1]
        assert len(attention_recorders(outer)) == 2
        outputs = attention_model(outer, batch_size=None)(x)
        _, scores = forward(inner, x, return_attention_scores=True)
        assert [tuple(outputs[f"attention_{i}"].shape)[1] for i in range(2)] == [2, 4]
        for i, expected in enumerate(scores):
            np.testing.assert_allclose(
                np.asarray(outputs[f"attention_{i}"]), np.asarray(expected), atol=1e-6
            )
