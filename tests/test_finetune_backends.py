"""keras-mha-train --from DIR --data FILE on JAX and PyTorch: the fine-tuning path runs
on every Keras backend, and the run it writes is the same contract (TensorFlow's
export loads the weights another backend trained and verifies them against the
probabilities that backend computed).

A tiny random BERT (tests/test_pretrained.py's, written by transformers) keeps it
to seconds a backend; the real encoder's fine-tuning is tests/test_finetune.py's.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from keras_mha.examples import topic_rows, write_csv
from tests.environment import backend_env, missing
from tests.test_pretrained import REPO, tiny  # noqa: F401  (the module fixture)

pytestmark = pytest.mark.slow  # children in the JAX and torch venvs train models

EPOCHS = 8
LEARNING_RATE = 1e-3


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_fine_tuning_runs_on_this_backend_and_exports_on_tensorflow(
    tiny,  # noqa: F811
    backend,
    tmp_path,
    figure,
):
    """The 29 topics (490 sentences) on the tiny encoder (3 layers, hidden 48), 8
    epochs at 1e-3. Measured on an AMD EPYC: the last epoch's training loss is
    0.38 of the first's on JAX and on PyTorch (the first epoch starts near ln 29,
    chance). Asserted: below 0.9 of it (a random encoder with a trainable head
    learns the frequent topic words; the measured fall, 0.62, is six times the
    0.1 asked), the run records its backend, its embedding layer is the
    checkpoint's and its blocks are not, and TensorFlow's float32 export of
    the run verifies (each probability within float32's bound of what the other
    backend computed)."""
    python = REPO / f".venv-{backend}" / "bin" / "python"
    if not python.exists():
        missing(f"{python} (make backend-venvs)")
    write_csv(tmp_path / "topics.csv", topic_rows())
    run = tmp_path / "run"
    env = backend_env(backend, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [
            str(python), "-m", "keras_mha.train", "--from", str(tiny["dir"]),
            "--data", str(tmp_path / "topics.csv"), "--out", str(run), "--max-length", "48",
            "--epochs", str(EPOCHS), "--learning-rate", str(LEARNING_RATE), "--quiet",
        ],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["fine_tuned"]["backend"] == backend
    assert metrics["fine_tuned"]["frozen"] == ["embedding"]
    loss = metrics["train_loss"]
    assert len(loss) == EPOCHS
    figure(f"{backend} fine-tuning loss last/first", loss[-1] / loss[0], "< 0.9")
    assert loss[-1] < 0.9 * loss[0], loss

    # The embedding layer is the checkpoint's, weight for weight, whatever the
    # backend: fine-tuning trains the blocks and the head only; the blocks moved.
    from keras_mha.pretrained.encoder import load
    from keras_mha.rundir.embedding import read_embedding_run
    from keras_mha_export.bundle import export_bundle

    tuned = read_embedding_run(run).load_model()
    pretrained = load(str(tiny["dir"]), 48).model
    for name in ("embedding", "transformer_layer_0"):
        pairs = zip(pretrained.get_layer(name).get_weights(), tuned.get_layer(name).get_weights())
        # the block's kernels (its biases may start at 0 with no gradient: the keys')
        changed = [not np.array_equal(a, b) for a, b in pairs if name == "embedding" or a.ndim >= 2]
        moved = not any(changed) if name == "embedding" else all(changed)
        assert changed and moved, (name, changed)

    manifest = export_bundle(run, tmp_path / "bundle", "float32", log=lambda line: None)
    assert manifest.verified == ["float32"], manifest.failed
    assert manifest.eval.task == "text-classification"
    float32 = manifest.models["float32"].parity
    assert float32.max_abs_diff <= 1e-5
    # The held-out gold labels travel with the run: the bundle's float accuracy
    # is the run's test accuracy (the same probabilities, the same labels), and
    # float32, agreeing on every row, scores the same on them.
    assert manifest.eval.float_accuracy == pytest.approx(metrics["test_accuracy"], abs=1e-12)
    assert float32.agreement == 1.0 and float32.accuracy == manifest.eval.float_accuracy
