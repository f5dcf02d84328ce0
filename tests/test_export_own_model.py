"""A user's own classifier, exported from explicit files (`--model --calibration --eval`).

Two models the project did not build: one with our MultiHeadAttention but no
TransformerEncoderBlock, and keras-io's text classifier built with keras-hub's
TransformerEncoder on `keras.layers.MultiHeadAttention` (saved as the user
saved it; loading it builds keras-hub's classes, on Keras's layer, again).
Export converts the second to our layer (`source.on_our_layer`), so both
convert, verify and carry the attention signature like the project's models,
and the TensorFlow-free device shows their heads.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from edge_bundle import copy_device_app, edge_python

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[1]


def _save(root: pathlib.Path, model, x_eval, calibration) -> pathlib.Path:
    probs = model.predict(x_eval, verbose=0).astype("float32")
    y = probs.argmax(-1).astype("int64")
    model.save(root / "model.keras")
    np.savez(root / "eval.npz", x=x_eval, y=y, probs=probs)
    np.savez(root / "calibration.npz", x=calibration)
    return root


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    """Our layer in a model of the user's own shape (no encoder block)."""
    import keras

    from keras_mha import MultiHeadAttention

    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 8), name="inputs")
    x = keras.layers.Dense(16)(inputs)
    x = x + MultiHeadAttention(num_heads=2, name="mha")(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = keras.Model(inputs, outputs, name="own")
    rng = np.random.default_rng(0)
    x_eval = rng.normal(size=(120, 6, 8)).astype("float32")
    calibration = rng.normal(size=(64, 6, 8)).astype("float32")
    return _save(tmp_path_factory.mktemp("own"), model, x_eval, calibration)


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory):
    """keras-io's text classifier on keras-hub (Keras's attention), token ids padded with 0."""
    pytest.importorskip("keras_hub", reason="keras-hub is not installed (make install)")
    import keras
    import keras_hub

    keras.utils.set_random_seed(5)
    tokens = keras.Input((12,), dtype="int32", name="tokens")
    x = keras_hub.layers.TokenAndPositionEmbedding(40, 12, 16, mask_zero=True)(tokens)
    for i in range(2):
        x = keras_hub.layers.TransformerEncoder(32, num_heads=2, name=f"encoder_{i}")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, keras.layers.Dense(4, activation="softmax")(x), name="hub")
    rng = np.random.default_rng(1)

    def sentences(n):
        ids = rng.integers(1, 40, size=(n, 12)).astype("int32")
        lengths = rng.integers(3, 13, size=n)
        ids[np.arange(12)[None, :] >= lengths[:, None]] = 0
        return ids

    return _save(tmp_path_factory.mktemp("hub"), model, sentences(100), sentences(64))


def _export(files: pathlib.Path, out: pathlib.Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha_export", "--model", str(files / "model.keras"),
         "--calibration", str(files / "calibration.npz"), "--eval", str(files / "eval.npz"),
         "--out", str(out), "--quant", "float32,dynamic,float16", *extra],
        capture_output=True, text=True, timeout=900, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


def _check_bundle(bundle: pathlib.Path, layers: int, heads: int, length: int):
    from bundle_contract.manifest import Manifest

    manifest = Manifest.read(bundle)
    assert manifest.verified == ["float32", "dynamic", "float16"]
    float32 = manifest.models["float32"]
    # The same function (our layer equals Keras's to 1e-5; TFLite float32 the same sums).
    assert float32.parity.agreement == 1.0 and float32.parity.max_abs_diff <= 1e-5
    assert manifest.attention is not None and manifest.attention.layers == layers
    with np.load(bundle / manifest.attention.file) as reference:
        shapes = {tuple(reference[name].shape[1:]) for name in reference.files}
    assert shapes == {(heads, length, length)}
    # float32's weights: the Keras model's to float32 rounding (its own bound, verified).
    assert float32.attention.parity.max_abs_diff <= 1e-5
    return manifest


def test_our_layer_without_encoder_blocks_exports_with_its_attention(own_files, tmp_path):
    out = _export(own_files, tmp_path / "bundle")
    assert "converted" not in out and "no attention signature" not in out
    _check_bundle(tmp_path / "bundle", layers=1, heads=2, length=6)


def test_a_keras_hub_classifier_is_converted_exported_and_shown_on_the_device(hub_files, tmp_path):
    """Saved on Keras's layer, exported with --import-module keras_hub: export
    converts its two attention layers, the bundle verifies with the attention
    signature, and the device (no TensorFlow, no keras_mha) draws its heads."""
    bundle = tmp_path / "device" / "bundle"
    out = _export(hub_files, bundle, "--import-module", "keras_hub")
    assert "its 2 keras.layers.MultiHeadAttention converted to keras_mha's" in out
    _check_bundle(bundle, layers=2, heads=2, length=12)
    copy_device_app(tmp_path / "device")
    page, report = tmp_path / "view.html", tmp_path / "report.json"
    python = str(edge_python("litert"))
    run = subprocess.run(
        [python, "-m", "edge_demo", "bundle", "--quant", "float32", "--json", str(report)],
        cwd=tmp_path / "device", capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(report.read_text())["modes"]["float32"]
    assert result["passed"] and result["attention_status"] == "passed", result
    view = subprocess.run(
        [python, "-m", "edge_demo", "bundle", "--sample", "0", "--view", str(page)],
        cwd=tmp_path / "device", capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert view.returncode == 0, view.stdout + view.stderr
    found = re.search(
        r'<script type="application/json" id="attention-data">(.*?)</script>',
        page.read_text(), re.S,
    )  # fmt: skip
    data = json.loads(found.group(1))
    with np.load(hub_files / "eval.npz") as ev:
        ids = ev["x"][0]
    assert data["input"]["kind"] == "text" and data["tokens"] == [f"#{i}" for i in ids]
    # The device's weights of both layers, drawn beside the Keras model's: each
    # within 1e-5 of the other (float32's verified attention parity), each shown
    # rounded to 4 decimals (5e-5 either way): 1.1e-4 apart at most.
    assert len(data["device"]) == len(data["reference"]) == 2
    for device, reference in zip(data["device"], data["reference"], strict=True):
        assert np.array(device).shape == (2, 12, 12)
        assert np.abs(np.array(device) - np.array(reference)).max() <= 1.1e-4


@pytest.fixture(scope="module")
def cross_files(tmp_path_factory):
    """Our layer attending from 6 tokens to 3 (cross-attention to a cropped sequence)."""
    import keras

    from keras_mha import MultiHeadAttention

    keras.utils.set_random_seed(4)
    inputs = keras.Input((6, 8), name="inputs")
    x = keras.layers.Dense(16)(inputs)
    keys = keras.layers.Cropping1D((0, 3))(x)
    x = x + MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(x, keys)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x), name="cross")
    rng = np.random.default_rng(2)
    x_eval = rng.normal(size=(120, 6, 8)).astype("float32")
    return _save(tmp_path_factory.mktemp("cross"), model, x_eval, x_eval[:64])


def test_attention_the_device_cannot_draw_is_left_out_with_a_reason(cross_files, tmp_path):
    """Weights (1, 2, 6, 3) are not (batch, heads, T, T) over the tokens: the
    device's parity check and head view cannot read them, so export leaves the
    view signature out, says why, and the classifier verifies without it."""
    from bundle_contract.manifest import Manifest

    out = _export(cross_files, tmp_path / "bundle")
    assert "(1, 2, 6, 3), not (batch, heads, T, T) over the input's 6 tokens" in out
    assert "so the bundle has no attention signature" in out
    manifest = Manifest.read(tmp_path / "bundle")
    assert manifest.verified == ["float32", "dynamic", "float16"]
    assert manifest.attention is None
    assert manifest.models["float32"].parity.max_abs_diff <= 1e-5


def _source(model, user_model: bool):
    from keras_mha_export.source import Source

    return Source({}, model, None, None, None, {}, None, None, user_model=user_model)


def test_attention_problem_names_what_the_device_cannot_read(monkeypatch):
    """attention_axes over two axes gives 6-D weights: refused with their shape.
    Self-attention over the tokens: no problem. An error other than
    attention_model's refusals (ValueError) is a reason for a user's model and
    a bug for one the project built."""
    import keras

    import keras_mha.model
    from keras_mha import MultiHeadAttention

    inputs = keras.Input((4, 4, 8))
    grid = MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(1, 2), name="grid")
    model = keras.Model(inputs, grid(inputs, inputs))
    assert _source(model, True).attention_problem == (
        "an attention layer's weights are (1, 2, 4, 4, 4, 4), not (batch, heads, T, T) "
        "over the input's 4 tokens"
    )
    tokens = keras.Input((None, 8))
    model = keras.Model(tokens, MultiHeadAttention(num_heads=2, key_dim=4)(tokens, tokens))
    assert _source(model, False).attention_problem is None

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(keras_mha.model, "attention_model", broken)
    assert _source(model, True).attention_problem == "its attention weights cannot be read (boom)"
    with pytest.raises(RuntimeError, match="boom"):
        _source(model, False).attention_problem  # noqa: B018
