"""keras-mha-export on a token-id classifier (int32 inputs): float32 and fully integer int8."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from environment import missing
from export_checks import (
    FLOATS,
    TFLITE_RUNTIME_PYTHON,
    litert_outputs,
    run_cli,
    sha256,
    tflite_runtime_loads,
)

from edge_demo.contract.vocab import Vocab
from keras_mha_export import SourcePaths, export_bundle
from keras_mha_export.graph import read_graph


def toy_tokens(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Padded id sequences (0 = pad); label: more 2s than 3s."""
    rng = np.random.default_rng(seed)
    x = rng.integers(2, 12, (n, 8)).astype("int32")
    lengths = rng.integers(3, 9, n)
    x[np.arange(8)[None, :] >= lengths[:, None]] = 0
    return x, ((x == 2).sum(1) > (x == 3).sum(1)).astype("int32")


@pytest.fixture(scope="module")
def token_files(tmp_path_factory) -> pathlib.Path:
    """A tiny trained token classifier as loose files (no labels.json)."""
    import keras

    from keras_mha.model import ModelConfig, build_classifier

    config = ModelConfig(
        input_kind="tokens",
        sequence_length=8,
        feature_dim=12,
        num_classes=2,
        d_model=16,
        num_heads=2,
        ff_dim=32,
        dropout=0.0,
        seed=0,
    )
    model = build_classifier(config)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    x_train, y_train = toy_tokens(800, seed=0)
    model.fit(x_train, y_train, epochs=10, batch_size=32, verbose=0)
    x, y = toy_tokens(300, seed=1)
    probs = model.predict(x, verbose=0).astype("float32")
    out = tmp_path_factory.mktemp("tokens")
    model.save(out / "classifier.keras")
    np.savez(out / "eval.npz", x=x, y=y, probs=probs)
    np.savez(out / "calibration.npz", x=x_train[:256])
    Vocab(tokens=["<pad>", "<unk>"] + [f"w{i}" for i in range(2, 12)], max_length=8).save(
        out / "vocab.json"
    )
    return out


@pytest.fixture(scope="module")
def token_bundle(token_files, tmp_path_factory) -> pathlib.Path:
    """keras-mha-export of the token classifier in int8 and float32 (fails the tests if it fails)."""
    out = tmp_path_factory.mktemp("token_bundle") / "bundle"
    status, stdout, stderr = run_cli(
        [
            "--model", str(token_files / "classifier.keras"),
            "--calibration", str(token_files / "calibration.npz"),
            "--eval", str(token_files / "eval.npz"),
            "--vocab", str(token_files / "vocab.json"),
            "--quant", "int8,float32",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert status == 0, stderr
    return out


@pytest.mark.slow
def test_the_toy_token_task_is_learned(token_files, figure):
    """Which of two tokens is more frequent among up to 8: 10 epochs of a small
    model. Measured 1.0 on Intel Xeon (oneDNN on, off, AVX2, AVX512_CORE_BF16);
    0.95 leaves 15 of the 300 held-out samples, far more than another CPU's
    rounding changes in a model that has learned the rule (docs/trained_figures.md)."""
    with np.load(token_files / "eval.npz") as npz:
        accuracy = (npz["probs"].argmax(-1) == npz["y"]).mean()
    assert figure("held-out accuracy", accuracy, "> 0.95") > 0.95


@pytest.mark.slow
def test_token_model_exports_float32_and_integer_int8(token_files, token_bundle, figure):
    out = token_bundle
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verified"] == ["float32", "int8"]
    int8 = manifest["models"]["int8"]
    assert int8["input"] == {**int8["input"], "dtype": "int32", "shape": [1, 8], "scale": None}
    assert int8["output"]["dtype"] == "int8"
    graph = read_graph((out / "model_int8.tflite").read_bytes())
    floats = [
        op.name
        for op in graph.ops
        if op.name not in ("QUANTIZE", "DEQUANTIZE")
        for i in (*op.inputs, *op.outputs)
        if i >= 0 and graph.tensor(i).dtype in FLOATS
    ]
    assert floats == []  # the masked mean (MaskedMeanPooling) stays integer
    assert "CAST" not in int8["ops"] and "GATHER" in int8["ops"]
    # Loose files: labels made from class indices, vocab copied.
    assert json.loads((out / "labels.json").read_text()) == ["0", "1"]
    assert manifest["vocab"]["sha256"] == sha256(token_files / "vocab.json")
    assert manifest["source_model"]["file"] == "classifier.keras"
    evaluation = np.load(token_files / "eval.npz")
    probs, _, _ = litert_outputs(out / "model_int8.tflite", evaluation["x"])
    agreement = (probs.argmax(-1) == evaluation["probs"].argmax(-1)).mean()
    figure("int8 agreement", agreement, ">= the manifest's 1 % rule")
    assert agreement >= manifest["models"]["int8"]["thresholds"]["min_agreement"] - 1e-9
    assert agreement == pytest.approx(manifest["models"]["int8"]["parity"]["agreement"])


@pytest.mark.slow
def test_token_runtime_claims_match_tflite_runtime_214(token_bundle):
    """The manifest's tflite-runtime claims are what 2.14 does with the files."""
    if not TFLITE_RUNTIME_PYTHON.exists():
        missing(f"{TFLITE_RUNTIME_PYTHON} (tflite-runtime 2.14's venv; make edge-venvs)")
    manifest = json.loads((token_bundle / "manifest.json").read_text())
    loads = tflite_runtime_loads(
        [token_bundle / "model_float32.tflite", token_bundle / "model_int8.tflite"]
    )
    for mode in ("float32", "int8"):
        claim = manifest["models"][mode]["runtimes"]["tflite-runtime"]
        assert claim == loads[f"model_{mode}.tflite"], mode
    # 2.14 has no int8 DIV (docs/field_notes.md); the masked mean of a 0/1 float
    # mask (keras_mha.layers.TokenEmbedding) needs none, so it runs both.
    assert loads == {"model_float32.tflite": True, "model_int8.tflite": True}


@pytest.mark.slow
def test_a_mode_the_converter_cannot_produce_is_one_line(token_files, tmp_path):
    """TF's 16x8 quantizer fails on int32 token inputs: a message, not a trace.

    A known converter limit (TF 2.21), documented in README, docs/field_notes.md
    and docs/artifacts.md. A TensorFlow that converts it is a change to
    record there, so it fails this test instead of skipping it.
    """
    out = tmp_path / "bundle"
    source = SourcePaths(
        model=token_files / "classifier.keras",
        calibration=token_files / "calibration.npz",
        eval=token_files / "eval.npz",
    )
    lines: list[str] = []
    manifest = export_bundle(source, out, "float32,int16x8", log=lines.append)
    if "int16x8" not in manifest.failed:
        pytest.fail(
            "this TensorFlow converts int16x8 of a token-id model "
            f"(verified: {manifest.verified}): the documented limit is gone. Update README "
            "(Attention you can see), docs/field_notes.md, docs/artifacts.md, mk/arm64.mk's "
            "ARM64_TEXT_MODES and tests/test_convert_attention.py's "
            "EXPECTED_CONVERSION_FAILURES, then this test.",
            pytrace=False,
        )
    failure = manifest.failed["int16x8"]
    assert failure.stage == "convert"
    assert len(failure.reasons) == 1 and "\n" not in failure.reasons[0]
    # The known failure, named as export names it, not some other converter error.
    assert "TF's 16x8 quantizer cannot handle integer token-id inputs" in failure.reasons[0]
    assert "int16x8" not in manifest.models and not (out / "model_int16x8.tflite").exists()
    line = next(line for line in lines if line.split()[:1] == ["int16x8"])
    assert "FAILED" in line and "Traceback" not in "\n".join(lines)
    assert manifest.verified == ["float32"]


def test_a_vocabulary_the_device_would_refuse_is_refused_up_front(token_files, tmp_path):
    (tmp_path / "vocab.json").write_text(
        json.dumps({"tokens": ["<pad>", "<unk>"], "pad_id": 0, "unk_id": 1})
    )
    status, stdout, stderr = run_cli(
        [
            "--model", token_files / "classifier.keras",
            "--calibration", token_files / "calibration.npz",
            "--eval", token_files / "eval.npz",
            "--vocab", tmp_path / "vocab.json",
            "--out", tmp_path / "bundle",
        ]
    )  # fmt: skip
    assert status == 2 and stdout == "", stderr
    assert "vocab.json: missing field(s): max_length, lowercase, token_pattern" in stderr
    assert not (tmp_path / "bundle").exists()
