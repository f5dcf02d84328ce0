"""Shared fixtures: a small trained run directory, made on the fly."""

from __future__ import annotations

import json
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def make_digits_run(out: pathlib.Path, epochs: int = 12, seed: int = 0, **config) -> pathlib.Path:
    """Train a small digits classifier and write a run directory (docs/artifacts.md)."""
    import keras
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from keras_mha.model import ModelConfig, build_classifier

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")
    y = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=seed
    )
    cfg = ModelConfig(d_model=16, num_heads=2, ff_dim=32, dropout=0.0, seed=seed)
    for key, value in config.items():
        setattr(cfg, key, value)
    model = build_classifier(cfg)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0, shuffle=True)
    probs = model.predict(x_test, verbose=0).astype("float32")
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    np.savez(out / "eval.npz", x=x_test, y=y_test, probs=probs)
    np.savez(out / "calibration.npz", x=x_train[:256])
    (out / "labels.json").write_text(json.dumps([str(i) for i in range(10)]))
    accuracy = float((probs.argmax(-1) == y_test).mean())
    (out / "metrics.json").write_text(
        json.dumps(
            {
                "dataset": "digits",
                "seed": seed,
                "config": cfg.to_dict(),
                "test_accuracy": accuracy,
                "versions": {"keras": keras.__version__},
            }
        )
    )
    return out


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> pathlib.Path:
    """A trained digits run directory, made once per test session. Read-only."""
    return make_digits_run(tmp_path_factory.mktemp("digits_run") / "run")
