"""Other BERT-family checkpoints (issue 33, in part): DistilBERT, RoBERTa (byte-level
BPE, pad id 1, positions from 2), XLM-RoBERTa (Unigram), [CLS] and max pooling, and
what an import must refuse rather than get silently wrong.

Each checkpoint is a tiny random model that transformers builds and saves in the
torch venv (tests/oracle/bert_oracle.py `tiny --family --pooling`), with
sentence-transformers' module files; the oracle's `st_embeddings` are what
sentence-transformers' `encode()` gives, and its attention what transformers
computes. Ours must match both within 1e-5, on TensorFlow here and on JAX and
PyTorch in their venvs (slow).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from keras_mha.pretrained import corpus
from tests.test_pretrained import TOLERANCE, _compare, _edge, backend_diffs
from tests.test_pretrained_oracle import oracle, torch_python

SHAPE = dict(layers=2, heads=4, hidden=32, intermediate=64)
# (family, pooling, seed): a DistilBERT pooling its [CLS] token (as bge-small and
# arctic-embed pool), a BERT taking the max over its tokens, a RoBERTa with mean
# pooling (all-distilroberta-v1's), an XLM-R pooling its first token <s>.
KINDS = {
    "distilbert-cls": ("distilbert", "cls", 11),
    "bert-max": ("bert", "max", 12),
    "roberta-mean": ("roberta", "mean", 13),
    "xlm-roberta-cls": ("xlm-roberta", "cls", 14),
}
# What tokenizers differ on: accents, capitals, digits, punctuation inside words.
TRICKY = [
    "Café Müller paid 1,234.50 EUR in 2024 — naïve, isn't it?",
    "THE ANIMAL didn't cross the street; Zoë's façade costs 3x more.",
]
# config.json's architectures of each family's sequence classifier
CLASSIFIERS = {
    "bert": "BertForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "xlm-roberta": "XLMRobertaForSequenceClassification",
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def checkpoint(request, tmp_path_factory):
    """A tiny random checkpoint with sentence-transformers' files and the oracle's outputs."""
    family, pooling, seed = KINDS[request.param]
    python = torch_python()
    root = tmp_path_factory.mktemp(request.param)
    sentences = corpus.sentences()[:21] + sorted(corpus.sentences(), key=len)[-2:] + TRICKY
    (root / "sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    options = [f"--{k}={v}" for k, v in SHAPE.items()]
    oracle(python, "tiny", root / "model", *options, "--seed", seed,
           "--family", family, "--pooling", pooling)  # fmt: skip
    oracle(python, "reference", root / "model", root / "sentences.txt", root / "ref.npz",
           "--max-length", 64)  # fmt: skip
    with np.load(root / "ref.npz") as z:
        ref = {k: z[k] for k in z.files}
    assert str(ref["pooling"][0]) == pooling and bool(ref["normalize"][0])
    # what sentence-transformers gives is what the checkpoint's pooling gives
    ref["mean_embeddings"] = ref["embeddings"]  # the oracle's own mean pooling
    ref["embeddings"] = ref["st_embeddings"]
    return {"dir": root / "model", "root": root, "sentences": sentences, "ref": ref,
            "family": family, "pooling": pooling}  # fmt: skip


def test_the_encoder_gives_what_sentence_transformers_gives(checkpoint):
    from keras_mha.pretrained import load

    encoder = load(checkpoint["dir"], max_length=64)
    assert (encoder.config.family, encoder.config.pooling) == (
        checkpoint["family"], checkpoint["pooling"]
    )  # fmt: skip
    ref = checkpoint["ref"]
    ids = encoder.tokenize(checkpoint["sentences"], ref["input_ids"].shape[1])
    np.testing.assert_array_equal(ids, ref["input_ids"])  # the tokenizers ids
    diffs = _compare(encoder.embed_ids(ids), encoder.attention(ids), ref)
    assert len(diffs) == 1 + SHAPE["layers"] and max(diffs.values()) <= TOLERANCE, diffs
    # the other poolings differ by far more: the test can tell them apart
    pooled = {"mean": "mean_embeddings", "cls": "cls_embeddings", "max": "max_embeddings"}
    declared = pooled.pop(checkpoint["pooling"])
    assert np.abs(ref[declared] - ref["st_embeddings"]).max() <= TOLERANCE
    for other in pooled.values():
        assert np.abs(ref[other] - ref["st_embeddings"]).max() > 100 * TOLERANCE, other


def test_head_i_of_every_family_is_query_kernel_column_block_i(checkpoint):
    """W_i^Q = query_kernel[:, i, :]: rows i*d_k:(i+1)*d_k of the family's query Linear."""
    from safetensors.numpy import load_file

    from keras_mha.pretrained import load
    from keras_mha.pretrained.bert import NAMES

    encoder = load(checkpoint["dir"], max_length=64)
    names = NAMES[checkpoint["family"]]
    tensors = load_file(str(checkpoint["dir"] / "model.safetensors"))
    dk = SHAPE["hidden"] // SHAPE["heads"]
    for layer in range(SHAPE["layers"]):
        attention = encoder.model.get_layer(f"transformer_layer_{layer}").attention
        weight = tensors[names["layer"].format(layer) + names["query"] + ".weight"]
        for i in range(SHAPE["heads"]):
            np.testing.assert_array_equal(
                np.asarray(attention.query_kernel)[:, i, :], weight[i * dk : (i + 1) * dk].T
            )


@pytest.mark.slow  # children in the JAX and torch venvs
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_give_it_too(checkpoint, backend, tmp_path):
    ref_path = tmp_path / "ref.npz"
    np.savez(ref_path, **checkpoint["ref"])
    diffs = backend_diffs(
        backend, checkpoint["dir"], ref_path, tmp_path / "out.npz", SHAPE["layers"], 64
    )
    assert len(diffs) == 1 + SHAPE["layers"] and max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.slow  # an export of three modes and the device in its venv
def test_import_export_and_the_device_verify_it(checkpoint, tmp_path):
    from keras_mha.pretrained.cli import import_run
    from keras_mha_export.bundle import export_bundle

    import_run(str(checkpoint["dir"]), tmp_path / "run", max_length=64, log=lambda line: None)
    manifest = export_bundle(tmp_path / "run", tmp_path / "bundle", "float32,dynamic,float16")
    assert manifest.verified == ["float32", "dynamic", "float16"]
    assert manifest.models["float32"].parity.max_abs_diff <= 1e-5
    done = _edge(tmp_path / "bundle")
    assert done.returncode == 0 and "PASS: 3 of 3 modes" in done.stdout, done.stdout + done.stderr
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(checkpoint["sentences"][:4]) + "\n")
    done = _edge(tmp_path / "bundle", "--quant", "float32", "--embed", lines,
                 "--out", tmp_path / "v.npy")  # fmt: skip
    assert done.returncode == 0, done.stderr
    vectors = np.load(tmp_path / "v.npy")
    assert np.abs(vectors - checkpoint["ref"]["st_embeddings"][:4]).max() <= TOLERANCE


# --- what an import refuses -----------------------------------------------------------


def _copy(checkpoint, tmp_path) -> pathlib.Path:
    target = tmp_path / "checkpoint"
    shutil.copytree(checkpoint["dir"], target)
    return target


def _refused(directory: pathlib.Path, expected: str) -> str:
    from keras_mha.pretrained.checkpoint import resolve

    with pytest.raises(ValueError, match=expected) as info:
        resolve(str(directory))
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_task_head_the_import_would_drop_is_refused(checkpoint, tmp_path):
    """A token classifier's head (not a sequence classifier's) is refused in one line."""
    directory = _copy(checkpoint, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    head = CLASSIFIERS[checkpoint["family"]].replace("Sequence", "Token")
    config.update(architectures=[head], id2label={"0": "O", "1": "B-PER", "2": "I-PER"})
    (directory / "config.json").write_text(json.dumps(config))
    message = _refused(directory, f"architecture {head} is not imported")
    assert "would drop this one's task head" in message


def test_a_pickled_checkpoint_is_refused_with_how_to_convert_it(checkpoint, tmp_path):
    directory = _copy(checkpoint, tmp_path)
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    message = _refused(directory, "holds pytorch_model.bin, a pickle, which keras-mha never")
    assert "save_pretrained" in message and "model.safetensors" in message


@pytest.mark.parametrize(
    "edit, expected",
    [
        ("no-normalize", "has no Normalize module: its vectors are not unit length"),
        ("dense", "module 'Dense' is not supported"),
        ("two-poolings", "pooling .* is not supported"),
        ("sqrt-len", "pooling .* is not supported"),
    ],
)
def test_sentence_transformers_modules_it_cannot_reproduce_are_refused(
    checkpoint, tmp_path, edit, expected
):
    directory = _copy(checkpoint, tmp_path)
    modules = json.loads((directory / "modules.json").read_text())
    pooling_path = directory / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_path.read_text())
    if edit == "no-normalize":
        modules = [m for m in modules if not m["type"].endswith("Normalize")]
    elif edit == "dense":
        modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                        "type": "sentence_transformers.models.Dense"})  # fmt: skip
    elif edit == "two-poolings":
        pooling.update(pooling_mode_mean_tokens=True, pooling_mode_cls_token=True)
    else:
        pooling = {k: False for k in pooling if k.startswith("pooling_mode")}
        pooling["pooling_mode_mean_sqrt_len_tokens"] = True
    (directory / "modules.json").write_text(json.dumps(modules))
    pooling_path.write_text(json.dumps(pooling))
    _refused(directory, expected)


def test_the_import_command_refuses_a_classifier_with_exit_2(checkpoint, tmp_path):
    directory = _copy(checkpoint, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["BertForTokenClassification"]
    (directory / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha.pretrained", str(directory),
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "BertForTokenClassification is not imported" in lines[0]
    assert not (tmp_path / "run").exists()


def test_the_pooling_module_is_read_where_modules_json_puts_it(checkpoint, tmp_path):
    from keras_mha.pretrained.checkpoint import resolve

    directory = _copy(checkpoint, tmp_path)
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        if module["type"].endswith("Pooling"):
            module["path"] = "pool"
    (directory / "modules.json").write_text(json.dumps(modules))
    _refused(directory, r"pool/config.json: missing; modules.json lists a Pooling module")
    (directory / "1_Pooling").rename(directory / "pool")
    assert resolve(str(directory)).config.pooling == checkpoint["pooling"]


def test_a_task_heads_tensors_are_refused_when_config_json_does_not_say(checkpoint, tmp_path):
    """No `architectures`, but a classifier's tensors: refused, not stripped."""
    from safetensors.numpy import load_file, save_file

    from keras_mha.pretrained import load

    directory = _copy(checkpoint, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    del config["architectures"]
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["classifier.weight"] = np.zeros((3, SHAPE["hidden"]), np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(ValueError, match="holds classifier.weight, a task head's tensor"):
        load(directory, max_length=64)


def test_max_pooling_never_takes_a_padded_position():
    from keras import ops

    from keras_mha.layers import MaskedMaxPooling

    x = np.array([[[1.0, -2.0], [3.0, -1.0], [50.0, 40.0]]], np.float32)  # padding is largest
    mask = np.array([[True, True, False]])
    out = ops.convert_to_numpy(MaskedMaxPooling()(x, mask=mask))
    np.testing.assert_array_equal(out, [[3.0, -1.0]])
    np.testing.assert_array_equal(ops.convert_to_numpy(MaskedMaxPooling()(x)), [[50.0, 40.0]])


def test_roberta_families_pad_with_one_and_number_positions_from_two(checkpoint):
    """RoBERTa and XLM-R: <pad> = 1 is masked, <s> = 0 is a token, token t reads position 2 + t."""
    from keras_mha.pretrained import load

    encoder = load(checkpoint["dir"], max_length=64)
    embedding = encoder.model.get_layer("embedding")
    ref = checkpoint["ref"]
    roberta = checkpoint["family"] in ("roberta", "xlm-roberta")
    pad = 1 if roberta else 0
    assert (embedding.pad_id, embedding.position_offset) == ((1, 2) if roberta else (0, 0))
    assert int(ref.get("pad_id", [0])[0]) == pad == encoder.tokenizer.pad_id
    ids = ref["input_ids"]
    np.testing.assert_array_equal(ids != pad, ref["attention_mask"].astype(bool))
    if roberta:
        assert (ids[:, 0] == 0).all()  # <s> is id 0 and a real token
        with pytest.raises(ValueError, match="exceeds the checkpoint's max_position_embeddings"):
            load(checkpoint["dir"], max_length=65)  # 66 rows, the first two unused
