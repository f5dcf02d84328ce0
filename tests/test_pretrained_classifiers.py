"""Sequence classifiers (issue 33): a checkpoint's classifier imports as a classifier.

`BertForSequenceClassification` and the DistilBERT, RoBERTa and XLM-R ones are
tiny models that transformers builds, fine-tunes on the corpus's topics and
saves in the torch venv (tests/oracle/bert_oracle.py `tiny --head classifier
--labels N --train 20`); the oracle's
`probs` are transformers' softmax of its logits. Ours must match them, and
every layer's attention, within 1e-5 on TensorFlow (here), JAX and PyTorch
(slow, in their venvs); the labels are config.json's id2label. Then the run
goes through export, the TF-free device (parity, `--text`, `--sample`,
`--view`) and the head tools as a trained classifier does.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from keras_mha.pretrained import corpus
from tests.test_pretrained import TOLERANCE, _compare, _edge, backend_diffs
from tests.test_pretrained_families import TRICKY
from tests.test_pretrained_oracle import oracle, torch_python

SHAPE = dict(layers=2, heads=4, hidden=32, intermediate=64)
# Each classifier is fine-tuned by the oracle on the corpus's topics (class = topic mod N)
# for this many epochs: a random head on random features is undecided (its top probability
# about 0.4 of 3 classes, near ties that dynamic range's rounding flips beyond the 1 % rule),
# a trained one decides, as the classifiers people deploy do.
EPOCHS = 20
# (family, labels, seed): each family's classifier head, with 2 to 4 classes
KINDS = {
    "bert-3": ("bert", 3, 21),
    "distilbert-2": ("distilbert", 2, 22),
    "roberta-4": ("roberta", 4, 23),
    "xlm-roberta-3": ("xlm-roberta", 3, 24),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def classifier(request, tmp_path_factory):
    """A tiny fine-tuned sequence classifier and transformers' outputs on corpus sentences."""
    family, labels, seed = KINDS[request.param]
    python = torch_python()
    root = tmp_path_factory.mktemp(request.param)
    sentences = corpus.sentences()[:21] + TRICKY
    (root / "sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    options = [f"--{k}={v}" for k, v in SHAPE.items()]
    oracle(python, "tiny", root / "model", *options, "--seed", seed, "--family", family,
           "--head", "classifier", "--labels", labels, "--train", EPOCHS)  # fmt: skip
    oracle(python, "reference", root / "model", root / "sentences.txt", root / "ref.npz",
           "--max-length", 64)  # fmt: skip
    with np.load(root / "ref.npz") as z:
        ref = {k: z[k] for k in z.files}
    ref["embeddings"] = ref["probs"]  # what _compare compares the outputs with
    return {"dir": root / "model", "root": root, "sentences": sentences, "ref": ref,
            "family": family, "labels": [str(n) for n in ref["labels"]]}  # fmt: skip


def test_the_classifier_gives_transformers_probabilities(classifier):
    from keras_mha.pretrained import load

    encoder = load(classifier["dir"], max_length=64)
    config, ref = encoder.config, classifier["ref"]
    assert list(config.labels) == classifier["labels"] and config.family == classifier["family"]
    ids = encoder.tokenize(classifier["sentences"], ref["input_ids"].shape[1])
    np.testing.assert_array_equal(ids, ref["input_ids"])  # the tokenizers ids
    probs = encoder.embed_ids(ids)
    assert probs.shape == ref["probs"].shape
    diffs = _compare(probs, encoder.attention(ids), ref)
    assert len(diffs) == 1 + SHAPE["layers"] and max(diffs.values()) <= TOLERANCE, diffs
    # the test can tell: transformers' logits are not probabilities, and the random
    # head does not give one class everywhere
    assert np.abs(ref["logits"] - ref["probs"]).max() > 100 * TOLERANCE
    assert len(set(ref["probs"].argmax(1))) > 1 or ref["probs"].max(1).std() > 1e-3


def test_the_head_is_the_checkpoints_two_linears(classifier):
    """pre_classifier and classifier are the family's head Linears, transposed."""
    from safetensors.numpy import load_file

    from keras_mha.pretrained import load
    from keras_mha.pretrained.bert import NAMES

    encoder = load(classifier["dir"], max_length=64)
    tensors = load_file(str(classifier["dir"] / "model.safetensors"))
    prefix = {"bert": "bert.", "distilbert": "distilbert."}.get(classifier["family"], "roberta.")
    names = NAMES[classifier["family"]]
    for layer in ("pre_classifier", "classifier"):
        dense = encoder.model.get_layer(layer)
        key = names[layer].format(p=prefix)
        np.testing.assert_array_equal(np.asarray(dense.kernel), tensors[key + ".weight"].T)
        np.testing.assert_array_equal(np.asarray(dense.bias), tensors[key + ".bias"])
    activation = "relu" if classifier["family"] == "distilbert" else "tanh"
    assert encoder.model.get_layer("pre_classifier").activation.__name__ == activation


@pytest.mark.slow  # children in the JAX and torch venvs
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_give_the_same_probabilities(classifier, backend, tmp_path):
    ref_path = tmp_path / "ref.npz"
    np.savez(ref_path, **classifier["ref"])
    diffs = backend_diffs(
        backend, classifier["dir"], ref_path, tmp_path / "out.npz", SHAPE["layers"], 64
    )
    assert len(diffs) == 1 + SHAPE["layers"] and max(diffs.values()) <= TOLERANCE, diffs


def _probabilities(line: str, labels: list[str]) -> np.ndarray:
    """The probabilities a `--text` row prints: 'label 0.1234' for each class."""
    found = dict(re.findall(r"(\S+) (\d\.\d{4})", line))
    return np.array([float(found[label]) for label in labels])


@pytest.mark.slow  # an export of three modes and the device in its venv
def test_import_export_and_the_device_classify_text(classifier, tmp_path):
    from keras_mha.pretrained.cli import import_run
    from keras_mha_export.bundle import export_bundle

    run = import_run(str(classifier["dir"]), tmp_path / "run", max_length=64, log=lambda _: None)
    assert run.task.name == "text-classification" and run.task.classes
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == classifier["labels"]
    manifest = export_bundle(tmp_path / "run", tmp_path / "bundle", "float32,dynamic,float16")
    assert manifest.verified == ["float32", "dynamic", "float16"]
    assert manifest.models["float32"].parity.max_abs_diff <= 1e-5
    assert manifest.models["float32"].parity.agreement == 1.0
    done = _edge(tmp_path / "bundle")
    assert done.returncode == 0 and "PASS: 3 of 3 modes" in done.stdout, done.stdout + done.stderr
    # --text: the label transformers' argmax gives, and its probabilities to 4 decimals
    ref, labels = classifier["ref"], classifier["labels"]
    sentence = classifier["sentences"][-1]  # accents, capitals, digits
    done = _edge(tmp_path / "bundle", "--quant", "float32", "--text", sentence,
                 "--view", tmp_path / "view.html")  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("float32"))
    expected = ref["probs"][-1]
    assert row.split()[1] == labels[int(expected.argmax())], row
    assert np.abs(_probabilities(row, labels) - expected).max() <= 1e-4 + TOLERANCE, row
    page = (tmp_path / "view.html").read_text(encoding="utf-8")
    assert labels[int(expected.argmax())] in page
    # --sample N: the eval sentence, the float reference and each mode's prediction
    done = _edge(tmp_path / "bundle", "--sample", "2")
    assert done.returncode == 0 and "keras (float reference)" in done.stdout, done.stderr
    assert "label" not in done.stdout.splitlines()[2]  # no gold label is claimed


@pytest.mark.slow  # importance and pruning on the imported classifier
def test_head_tools_take_the_classifier(classifier, tmp_path):
    if classifier["family"] != "bert":
        pytest.skip("one family is enough: the head tools do not depend on the family")
    from keras_mha.heads.encoder import (
        jacobian_importance,
        prune_encoder,
        removal_masks,
        select_heads,
    )
    from keras_mha.pretrained.cli import import_run
    from keras_mha.pretrained.encoding import embed

    run = import_run(str(classifier["dir"]), tmp_path / "run", max_length=64, log=lambda _: None)
    model = run.load_model()
    scores = jacobian_importance(model, run.calibration[:40])
    assert [len(s) for s in scores] == [SHAPE["heads"]] * SHAPE["layers"]
    assert all(np.isfinite(s).all() and (s > 0).all() for s in scores)
    removed = select_heads(scores, 0.25)
    pruned, keep = prune_encoder(model, removed, run.config)
    x = run.eval.x[:60]
    masked = embed(model, x, removal_masks(model, removed))
    # removing the heads is masking them: the same probabilities, a smaller model
    np.testing.assert_allclose(embed(pruned, x), masked, atol=TOLERANCE)
    assert np.abs(masked - run.eval.probs[:60]).max() > 100 * TOLERANCE  # heads did matter
    for name in ("pre_classifier", "classifier"):
        np.testing.assert_array_equal(
            pruned.get_layer(name).get_weights()[0], model.get_layer(name).get_weights()[0]
        )


def test_what_a_classifier_import_refuses(classifier, tmp_path):
    """Multi-label heads, a label count id2label contradicts, and id2label that does not
    name 0..N-1 once each (one label is a cross-encoder: tests/test_pretrained_cross_encoders.py)."""
    from keras_mha.pretrained.checkpoint import resolve

    base = json.loads((classifier["dir"] / "config.json").read_text())
    cases = [
        ({"problem_type": "multi_label_classification"}, "problem_type .* is not supported"),
        ({"id2label": {"0": "a", "1": "b", "2": "c"}, "num_labels": 2}, "num_labels 2 but"),
        ({"id2label": {"0": "a", "2": "b"}}, r"id2label's ids must be 0..1"),
        ({"id2label": {"0": "a", "1": "a"}}, "id2label names a class twice"),
        ({"id2label": {"0": "a", "1": ""}}, "labels must be class names"),
    ]
    for edit, expected in cases:
        directory = tmp_path / "checkpoint"
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(classifier["dir"], directory)
        (directory / "config.json").write_text(json.dumps({**base, **edit}))
        with pytest.raises(ValueError, match=expected) as info:
            resolve(str(directory))
        assert "\n" not in str(info.value)
