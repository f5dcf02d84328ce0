"""Test helpers for the edge demo: bundles made by the export command.

`export_bundle` runs `python -m keras_mha_export RUN_DIR --out BUNDLE --quant ...` (the
export package, in this venv, which has TensorFlow); `make_text_run` writes a
small untrained token classifier as a run directory with vocab.json, so the
text path of the edge demo is tested without training a text model.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def export_bundle(run_dir: pathlib.Path, out: pathlib.Path, quant: str = "all") -> pathlib.Path:
    """`python -m keras_mha_export RUN_DIR --out OUT --quant QUANT`; fails the test if it fails."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_mha_export",
            str(run_dir),
            "--out",
            str(out),
            "--quant",
            quant,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not (out / "manifest.json").exists():
        pytest.fail(
            f"python -m keras_mha_export failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    return out


def make_text_run(out: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A small untrained token classifier as a run directory, with vocab.json.

    Untrained weights are enough to exercise the text path of the edge demo:
    `eval.npz` holds the model's own softmax as the reference.
    """
    import keras

    from keras_mha.model import ModelConfig, build_classifier

    words = "the cat dog sat on a mat it was happy sad big small ran home".split()
    tokens = ["<pad>", "<unk>", *words]
    length = 6
    config = ModelConfig(
        input_kind="tokens",
        sequence_length=length,
        feature_dim=len(tokens),
        num_classes=2,
        d_model=16,
        num_heads=2,
        ff_dim=16,
        dropout=0.0,
        seed=seed,
    )
    model = build_classifier(config)
    rng = np.random.default_rng(seed)
    x = rng.integers(2, len(tokens), size=(40, length)).astype("int32")
    lengths = rng.integers(2, length + 1, size=40)
    x[np.arange(length)[None, :] >= lengths[:, None]] = 0  # padding at the end
    probs = model.predict(x, verbose=0).astype("float32")
    y = probs.argmax(-1).astype("int32")
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    np.savez(out / "eval.npz", x=x, y=y, probs=probs)
    np.savez(out / "calibration.npz", x=x)
    (out / "labels.json").write_text(json.dumps(["negative", "positive"]))
    vocab = {
        "tokens": tokens,
        "pad_id": 0,
        "unk_id": 1,
        "max_length": length,
        "lowercase": True,
        "token_pattern": "[a-z']+",
    }
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "metrics.json").write_text(
        json.dumps(
            {
                "dataset": "toy-text",
                "seed": seed,
                "config": config.to_dict(),
                "test_accuracy": 1.0,
                "versions": {"keras": keras.__version__},
            }
        )
    )
    return out
