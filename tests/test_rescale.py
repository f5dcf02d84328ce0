"""keras_mha.pretrained.rescale on a tiny random encoder with planted outliers.

The rescaled encoder must compute the same vectors, its LayerNorms must read
a residual stream whose channels the calibration sentences keep within the
bound the scales promise, its outlier FFN units must sit in their own Dense
pair, and the run it writes must reload in a new process. The real model's
int8 figures are in tests/test_pretrained_minilm.py (slow).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from test_heads_encoder import CONFIG, random_encoder, sentences, write_tiny_run

from keras_mha.model import encoder_blocks
from keras_mha.pretrained import rescale as R
from keras_mha.pretrained.encoding import embed

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def planted():
    """The tiny encoder with a residual outlier channel (3) and an FFN outlier unit (5)."""
    model = random_encoder(seed=4)
    embedding = model.get_layer("embedding")
    gamma = np.asarray(embedding.norm.gamma)
    gamma[3] *= 40.0
    embedding.norm.gamma.assign(gamma)
    block = model.get_layer("transformer_layer_0")
    kernel = np.asarray(block._ffn_in.kernel)
    kernel[:, 5] *= 12.0
    block._ffn_in.kernel.assign(kernel)
    return model


def test_the_planted_outliers_are_measured(planted):
    ranges, hidden = R.measure(planted, sentences(30, seed=7))
    assert [r.name for r in ranges] == [
        "embedding/norm",
        "transformer_layer_0/attention_norm",
        "transformer_layer_0/ffn_norm",
        "transformer_layer_1/attention_norm",
        "transformer_layer_1/ffn_norm",
    ]
    first = ranges[0].outputs
    assert np.argmax(first) == 3 and first[3] > 10 * np.median(first)
    assert 5 in R.ffn_outlier_units(hidden[0], 4.0)
    assert all(m.shape == (CONFIG.intermediate_size,) for m in hidden)


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_rescaled_encoder_is_the_same_function_with_smaller_outliers(planted, alpha):
    calibration, ids = sentences(30, seed=7), sentences(20, seed=8)
    rescaled, before = R.rescale_encoder(planted, calibration, alpha=alpha, ffn_ratio=4.0)
    np.testing.assert_allclose(embed(rescaled, ids), embed(planted, ids), atol=2e-5)
    blocks = encoder_blocks(rescaled)
    assert blocks[0].ffn_outliers >= 1 and blocks[0]._ffn_in.units == CONFIG.intermediate_size - (
        blocks[0].ffn_outliers
    )
    after, _ = R.measure(rescaled, calibration)
    for k in range(1, len(before)):  # LayerNorm k reads the sum divided by b_{k-1}
        r = np.maximum(before[k - 1].outputs, before[k].inputs)
        bound = r.max() ** (1 - alpha) * np.median(r) ** alpha  # x_j / b_j <= r_j^(1-a) med^a
        assert after[k].inputs.max() <= bound * 1.001 + 1e-6, (k, after[k].inputs.max(), bound)

    # the planted channel 3 stands out less in what the first block reads
    def spread(m: np.ndarray) -> float:
        return float(m[3] / np.median(m))

    assert spread(after[1].inputs) < spread(before[1].inputs) ** (1 - alpha / 2)
    if alpha == 1.0:  # every channel's maximum is brought to the median's
        assert after[0].inputs.max() <= np.median(before[0].inputs) * 1.001


def test_bad_alpha_and_a_classifier_are_refused(planted):
    from heads_models import tiny_token_model

    with pytest.raises(ValueError, match=r"alpha in \[0, 1\]"):
        R.channel_scales(R.norm_ranges(planted, sentences(4)), 1.5)
    with pytest.raises(ValueError, match="not an encoder"):
        R.measure(tiny_token_model()[0], sentences(4))


@pytest.mark.slow  # a Python child importing a framework
def test_the_rescaled_run_reloads_in_a_new_process(planted, tmp_path):
    source = write_tiny_run(planted, tmp_path / "source")
    lines = []
    run = R.rescale_run(source.path, tmp_path / "rescaled", alpha=0.5, log=lines.append)
    assert run.metrics["rescale"]["float_max_abs_diff"] < 1e-5
    assert run.metrics["rescale"]["ffn_outliers"][0] >= 1
    assert any("reads max" in line for line in lines)
    np.testing.assert_array_equal(run.eval.probs, source.eval.probs)  # the original's vectors
    script = (
        "import json, sys, numpy as np\n"
        "from keras_mha.rundir.embedding import read_embedding_run\n"
        "from keras_mha.pretrained.encoding import embed\n"
        "run = read_embedding_run(sys.argv[1])\n"
        "got = embed(run.load_model(), run.eval.x)\n"
        "print(json.dumps(float(np.abs(got - run.eval.probs).max())))\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(run.path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) < 2e-5


def test_the_command_refuses_bad_input_in_one_line(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    for argv, fragment in (
        (["run", "--out", str(tmp_path / "o"), "--alpha", "2"], "--alpha: must be in [0, 1]"),
        ([str(tmp_path / "nothing"), "--out", str(tmp_path / "o")], "nothing"),
    ):
        done = subprocess.run(
            [str(pathlib.Path(sys.executable).parent / "keras-mha-rescale"), *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], lines
        assert not (tmp_path / "o").exists()
