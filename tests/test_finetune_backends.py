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
from tests.environment import JAX_TEST_XLA_FLAGS, backend_env, missing
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


DISTRIBUTED = """
import json, sys
import numpy as np
from keras_mha.rundir.embedding import read_embedding_run
from keras_mha.train import finetune

source, data, out = sys.argv[1:4]
found = {}
for kind in (None, "data", "heads"):
    run = f"{out}/{kind or 'single'}"
    metrics = finetune.finetune(source, data, run, epochs=2, batch_size=16, max_length=32,
                                learning_rate=1e-3, distribute=kind)
    found[kind or "single"] = {
        "loss": metrics["train_loss"], "train_size": metrics["train_size"],
        "distribute": metrics["fine_tuned"].get("distribute"),
        "probs": read_embedding_run(run).eval.probs.tolist(),
    }
print(json.dumps(found))
"""


def test_fine_tuning_over_8_devices_trains_the_single_device_model(tiny, tmp_path):  # noqa: F811
    """keras-mha-train --from --distribute data|heads (keras_mha.train.finetune): on
    JAX's CPU platform split into 8 devices, DataParallel (8 x 1) and the heads
    split (the tiny BERT's 4 heads: a 2 x 4 mesh) train the single-device model
    on the same batches: 128 training rows, 8 batches of 16 a epoch, none left
    out. Each run's held-out probabilities (its eval.npz, computed with the
    gathered weights on one device) and losses match the single-device run's:
    float32 sums in another order (8 or 2 devices' partial sums of each
    gradient, 4 devices' of W^O's and the feed-forward's contractions), carried
    through 16 AdamW steps. Measured on an Intel Xeon: losses 1.1e-7 (data) and
    2.1e-7 (heads) apart relatively, probabilities 2.7e-7 and 1.2e-7; bounds
    1e-5, which a wrong batch or a lost shard (a different model) exceeds by
    orders. The heads run's weights were split (each read back in the child)."""
    from keras_mha.examples import pronoun_rows

    python = REPO / ".venv-jax" / "bin" / "python"
    if not python.exists():
        missing(f"{python} (make backend-venvs)")
    write_csv(tmp_path / "rows.csv", pronoun_rows(160))  # 128 training rows, 32 held out
    # the device count first: XLA ignores flags after the bare intra_op_parallelism_threads
    flags = "--xla_force_host_platform_device_count=8 " + JAX_TEST_XLA_FLAGS
    env = backend_env("jax", PYTHONPATH=str(REPO), XLA_FLAGS=flags)
    done = subprocess.run(
        [str(python), "-c", DISTRIBUTED, str(tiny["dir"]), str(tmp_path / "rows.csv"),
         str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    single = found["single"]
    assert single["distribute"] is None and single["train_size"] == 128
    meshes = {"data": {"batch": 8, "model": 1}, "heads": {"batch": 2, "model": 4}}
    for kind, mesh in meshes.items():
        got = found[kind]
        split = got["distribute"].pop("weights_split")
        assert got["distribute"] == {
            "kind": kind, "devices": 8, "mesh": mesh, "training_rows_left_out": 0
        }  # fmt: skip
        # heads: every block's q/k/v kernels and biases, W^O and both feed-forward
        # kernels and the first's bias, 3 blocks (the layout, read back); data: none
        assert split == (3 * 10 if kind == "heads" else 0), (kind, split)
        assert got["train_size"] == 128
        # float32 sums in another order, carried through 16 AdamW steps
        np.testing.assert_allclose(got["loss"], single["loss"], rtol=1e-5)
        np.testing.assert_allclose(got["probs"], single["probs"], atol=1e-5)
    assert single["loss"][1] < single["loss"][0]  # the two epochs trained it


@pytest.mark.parametrize(
    "rows, batch, devices, left_out",
    [(128, 16, 8, 0), (391, 16, 8, 7), (391, 16, 4, 3), (100, 16, 2, 0), (5, 16, 4, 1)],
)
def test_a_last_batch_loses_the_rows_the_batch_axis_does_not_divide(rows, batch, devices, left_out):
    from keras_mha.train.finetune import rows_left_out

    assert rows_left_out(rows, batch, devices) == left_out
