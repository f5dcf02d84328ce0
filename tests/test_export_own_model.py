"""A user's own classifier: our MultiHeadAttention in a model without TransformerEncoderBlock.

Exported from explicit files (`--model --calibration --eval`), it converts and
verifies like the project's models; having no encoder block, the bundle has
no attention signature, and export says so in a line instead of failing.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    import keras

    from keras_mha import MultiHeadAttention

    root = tmp_path_factory.mktemp("own")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 8), name="inputs")
    x = keras.layers.Dense(16)(inputs)
    x = x + MultiHeadAttention(num_heads=2, name="mha")(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = keras.Model(inputs, outputs, name="own")
    rng = np.random.default_rng(0)
    x_eval = rng.normal(size=(120, 6, 8)).astype("float32")
    probs = model.predict(x_eval, verbose=0).astype("float32")
    y = probs.argmax(-1).astype("int64")
    model.save(root / "own.keras")
    np.savez(root / "eval.npz", x=x_eval, y=y, probs=probs)
    np.savez(root / "calibration.npz", x=rng.normal(size=(64, 6, 8)).astype("float32"))
    return root


def test_a_model_without_encoder_blocks_exports_and_verifies(own_files, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha_export", "--model", str(own_files / "own.keras"),
         "--calibration", str(own_files / "calibration.npz"), "--eval",
         str(own_files / "eval.npz"), "--out", str(tmp_path / "bundle"), "--quant",
         "float32,dynamic,float16"],
        capture_output=True, text=True, timeout=900, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "has no keras_mha TransformerEncoderBlock" in done.stdout + done.stderr
    from edge_demo.contract.manifest import Manifest

    manifest = Manifest.read(tmp_path / "bundle")
    assert manifest.attention is None
    assert manifest.verified == ["float32", "dynamic", "float16"]
    float32 = manifest.models["float32"].parity
    assert float32.agreement == 1.0 and float32.max_abs_diff <= 1e-5
