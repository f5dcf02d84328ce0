"""The project's sentence corpus and the PyTorch oracle for the imported encoders.

keras_mha/pretrained/corpus.py: enough sentences, none twice, the lesson's
sentence, long ones, a deterministic disjoint split. tests/oracle/bert_oracle.py
runs in the torch venv (KERAS_MHA_TORCH_PYTHON, default .venv-torch/bin/python):
`tiny` builds a random model in tmp_path and `reference` writes its outputs,
whose shapes and invariants are checked here: a plain BERT, a DistilBERT with
sentence-transformers' files (CLS pooling, normalised) and a BERT with max
pooling, not normalised. The oracle's commands are answered by one server
process per test process (`bert_oracle.py serve`), so torch and transformers
are imported once, not twice per model.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
from environment import missing

from keras_mha.pretrained import corpus
from tests.oracle import serving

REPO = pathlib.Path(__file__).resolve().parents[1]
ORACLE = REPO / "tests" / "oracle" / "bert_oracle.py"
LESSON = "The animal didn't cross the street because it was too tired."
TINY = dict(layers=2, heads=2, hidden=32, intermediate=64)
TINY_IDS = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
ST_TOLERANCE = 1e-5  # the oracle's own bound between sentence-transformers and its pooling
HF_FILES = ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt"]
ST_FILES = ["1_Pooling", "modules.json", "sentence_bert_config.json"]


def torch_python() -> pathlib.Path:
    path = pathlib.Path(
        os.environ.get("KERAS_MHA_TORCH_PYTHON") or REPO / ".venv-torch" / "bin" / "python"
    )
    if not path.exists():
        missing(f"{path} (make backend-venvs, plus transformers and sentence-transformers)")
    return path


def oracle(python, *argv, check=True) -> subprocess.CompletedProcess:
    """`python tests/oracle/bert_oracle.py ARGV...`, answered by the oracle's server
    (tests/oracle/serving.py: the same code, exit status and output as a process of
    its own; torch and transformers imported once per test process)."""
    done = serving.ask(python, ORACLE, argv)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def tiny_and_reference(root: pathlib.Path, sentences: list[str], *tiny_options) -> dict:
    """`tiny` with TINY's shape and `tiny_options`, then `reference` (--max-length 64)."""
    python = torch_python()
    (root / "sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    options = [f"--{k}={v}" for k, v in TINY.items()]
    built = oracle(python, "tiny", root / "model", *options, *tiny_options)
    done = oracle(
        python, "reference", root / "model", root / "sentences.txt", root / "ref.npz",
        "--max-length", 64,
    )  # fmt: skip
    with np.load(root / "ref.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return {
        "dir": root / "model",
        "sentences": sentences,
        "arrays": arrays,
        "built": built.stdout,
        "done": done.stdout,
    }


def normalised(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def check_attention(z: dict) -> None:
    """Every layer: rows of real queries sum to 1 over the real keys, 0 on padding."""
    mask = z["attention_mask"].astype(bool)
    for i in range(TINY["layers"]):
        weights = z[f"attention_{i}"]  # (N, h, T, T)
        queries = np.broadcast_to(mask[:, None, :], weights.shape[:3])
        keys = np.broadcast_to(mask[:, None, None, :], weights.shape)
        np.testing.assert_allclose(np.where(keys, weights, 0).sum(-1)[queries], 1, atol=1e-5)
        assert np.where(keys, 0, weights).max() == 0


# the corpus ------------------------------------------------------------------------


def test_corpus_is_large_varied_and_without_duplicates():
    every = corpus.sentences()
    assert len(every) >= 350
    assert len(set(every)) == len(every)
    assert LESSON in every
    assert all(s == s.strip() and s and not s.startswith("#") for s in every)
    words = [len(s.split()) for s in every]
    assert min(words) >= 3 and max(words) <= 65
    assert sum(n >= 40 for n in words) >= 10  # long sentences: > 64 word pieces for some
    assert sum(n <= 6 for n in words) >= 30  # and short ones


def test_split_is_deterministic_disjoint_and_complete():
    every = corpus.sentences()
    calibration, evaluation = corpus.split()
    assert (calibration, evaluation) == corpus.split(seed=0, calibration=100)
    assert len(calibration) == 100 and len(evaluation) == len(every) - 100
    assert set(calibration).isdisjoint(evaluation)
    assert sorted(calibration + evaluation) == sorted(every)
    assert calibration != every[:100]  # shuffled
    other, _ = corpus.split(seed=1)
    assert other != calibration
    small, rest = corpus.split(seed=0, calibration=10)
    assert small + rest == calibration + evaluation  # the same order, cut elsewhere


@pytest.mark.parametrize(
    "kwargs", [{"seed": -1}, {"seed": 1.5}, {"calibration": 0}, {"calibration": 10_000}]
)
def test_split_refuses_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        corpus.split(**kwargs)


def test_the_corpus_ships_with_the_package():
    setup = (REPO / "setup.cfg").read_text()
    assert "keras_mha.pretrained = corpus.txt" in setup
    assert corpus.CORPUS.parent == pathlib.Path(corpus.__file__).parent


# the oracle ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory):
    """A tiny random BERT (vocabulary from the corpus) and its reference outputs
    for 30 short sentences and the 3 longest (> 64 word pieces: truncated)."""
    python = torch_python()
    root = tmp_path_factory.mktemp("oracle")
    every = corpus.sentences()
    chosen = every[:30] + sorted(every, key=len)[-3:]
    text = "# a comment\n\n" + "\n".join(chosen) + "\n"
    (root / "sentences.txt").write_text(text, encoding="utf-8")
    options = [f"--{k}={v}" for k, v in TINY.items()]
    built = oracle(python, "tiny", root / "model", *options, "--seed", 3)
    assert built.stdout.startswith("tiny: 2 layers, 2 heads, hidden 32"), built.stdout
    done = oracle(
        python, "reference", root / "model", root / "sentences.txt", root / "ref.npz",
        "--max-length", 64,
    )  # fmt: skip
    assert "33 sentences, T 64" in done.stdout, done.stdout
    with np.load(root / "ref.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return {"dir": root / "model", "sentences": chosen, "arrays": arrays}


def test_tiny_writes_a_hugging_face_model_directory(tiny_reference):
    model = tiny_reference["dir"]
    names = sorted(p.name for p in model.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt"]
    vocab = (model / "vocab.txt").read_text().splitlines()
    assert vocab[:5] == list(TINY_IDS)
    assert len(set(vocab)) == len(vocab)


def test_reference_arrays_have_consistent_shapes(tiny_reference):
    z = tiny_reference["arrays"]
    n, t = z["input_ids"].shape
    assert (n, t) == (33, 64)
    assert sorted(z) == sorted(
        ["sentences", "input_ids", "attention_mask", "last_hidden_state"]
        + ["embeddings", "cls_embeddings", "max_embeddings"]
        + [f"attention_{i}" for i in range(TINY["layers"])]
    )  # no modules.json: no st_embeddings, pooling, normalize, pooled
    assert list(z["sentences"]) == tiny_reference["sentences"]
    assert z["input_ids"].dtype == z["attention_mask"].dtype == np.int32
    assert z["attention_mask"].shape == (n, t)
    assert z["last_hidden_state"].shape == (n, t, TINY["hidden"])
    for key in ("embeddings", "cls_embeddings", "max_embeddings"):
        assert z[key].shape == (n, TINY["hidden"]) and z[key].dtype == np.float32
    for i in range(TINY["layers"]):
        assert z[f"attention_{i}"].shape == (n, TINY["heads"], t, t)
        assert z[f"attention_{i}"].dtype == np.float32


def test_reference_tokens_are_cls_text_sep_then_padding(tiny_reference):
    z = tiny_reference["arrays"]
    ids, mask = z["input_ids"], z["attention_mask"]
    lengths = mask.sum(1)
    assert (mask == (np.arange(ids.shape[1]) < lengths[:, None])).all()  # 1s, then 0s
    assert (ids[mask == 0] == TINY_IDS["[PAD]"]).all()
    assert (ids[:, 0] == TINY_IDS["[CLS]"]).all()
    assert (ids[np.arange(len(ids)), lengths - 1] == TINY_IDS["[SEP]"]).all()
    assert (lengths == 64).sum() >= 3  # the long sentences, truncated at --max-length
    assert lengths.min() < 20


def test_reference_attention_and_embeddings(tiny_reference):
    z = tiny_reference["arrays"]
    mask = z["attention_mask"].astype(bool)
    for i in range(TINY["layers"]):
        weights = z[f"attention_{i}"]  # (N, h, T, T)
        queries = np.broadcast_to(mask[:, None, :], weights.shape[:3])  # real query rows
        keys = np.broadcast_to(mask[:, None, None, :], weights.shape)
        np.testing.assert_allclose(weights.sum(-1)[queries], 1, atol=1e-5)
        assert np.where(keys, 0, weights).max() == 0  # no weight on padding
        # initializer_range 0.2: far from uniform over the real keys
        real = np.broadcast_to(mask.sum(1)[:, None, None], weights.shape[:3])[queries]
        assert weights[queries].max(-1).mean() > 2 * (1 / real).mean()
    embeddings = z["embeddings"]
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1, atol=1e-5)
    state = z["last_hidden_state"]
    mean = (state * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    expected = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    np.testing.assert_allclose(embeddings, expected, atol=1e-5)
    np.testing.assert_allclose(z["cls_embeddings"], normalised(state[:, 0]), atol=1e-5)
    largest = np.where(mask[..., None], state, -np.inf).max(1)  # padding excluded
    np.testing.assert_allclose(z["max_embeddings"], normalised(largest), atol=1e-5)


# DistilBERT with CLS pooling, normalised ----------------------------------------


@pytest.fixture(scope="module")
def distil_cls_reference(tmp_path_factory):
    """A tiny random DistilBERT with sentence-transformers' files (CLS pooling,
    Normalize) and its reference outputs for 10 short sentences and the longest."""
    every = corpus.sentences()
    chosen = every[:10] + sorted(every, key=len)[-1:]
    root = tmp_path_factory.mktemp("oracle-distilbert")
    ref = tiny_and_reference(
        root, chosen, "--seed", 5, "--family", "distilbert", "--pooling", "cls"
    )
    assert ref["built"].startswith("tiny: 2 layers, 2 heads, hidden 32"), ref["built"]
    assert "distilbert, cls pooling, normalised" in ref["built"], ref["built"]
    assert "11 sentences, T 64" in ref["done"], ref["done"]
    assert "sentence-transformers (cls pooling, normalised)" in ref["done"], ref["done"]
    return ref


def test_tiny_distilbert_writes_a_sentence_transformers_directory(distil_cls_reference):
    model = distil_cls_reference["dir"]
    names = sorted(p.name for p in model.iterdir())
    assert names == sorted(HF_FILES + ST_FILES + ["2_Normalize"])
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["DistilBertModel"]
    assert config["model_type"] == "distilbert"
    assert (config["dim"], config["n_layers"], config["n_heads"], config["hidden_dim"]) == (
        TINY["hidden"], TINY["layers"], TINY["heads"], TINY["intermediate"],
    )  # fmt: skip
    assert config["max_position_embeddings"] == 64 and config["activation"] == "gelu"
    assert config["sinusoidal_pos_embds"] is False and config["pad_token_id"] == 0
    assert config["initializer_range"] == 0.2
    modules = json.loads((model / "modules.json").read_text())
    assert [(m["path"], m["type"].rsplit(".", 1)[-1]) for m in modules] == [
        ("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize"),
    ]  # fmt: skip
    assert json.loads((model / "1_Pooling" / "config.json").read_text()) == {
        "word_embedding_dimension": TINY["hidden"],
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    assert not any((model / "2_Normalize").iterdir())
    settings = json.loads((model / "sentence_bert_config.json").read_text())
    assert settings == {"max_seq_length": 64, "do_lower_case": False}
    vocab = (model / "vocab.txt").read_text().splitlines()
    assert vocab[:5] == list(TINY_IDS)
    assert len(set(vocab)) == len(vocab)


def test_distilbert_reference_arrays_have_consistent_shapes(distil_cls_reference):
    z = distil_cls_reference["arrays"]
    n, t = z["input_ids"].shape
    assert (n, t) == (11, 64)  # the longest sentence, truncated at --max-length
    assert sorted(z) == sorted(
        ["sentences", "input_ids", "attention_mask", "last_hidden_state"]
        + ["embeddings", "cls_embeddings", "max_embeddings"]
        + ["st_embeddings", "pooling", "normalize"]
        + [f"attention_{i}" for i in range(TINY["layers"])]
    )  # normalised: no pooled
    assert list(z["sentences"]) == distil_cls_reference["sentences"]
    assert z["pooling"].tolist() == ["cls"] and z["normalize"].tolist() == [True]
    assert z["input_ids"].dtype == z["attention_mask"].dtype == np.int32
    assert z["last_hidden_state"].shape == (n, t, TINY["hidden"])
    for key in ("embeddings", "cls_embeddings", "max_embeddings", "st_embeddings"):
        assert z[key].shape == (n, TINY["hidden"]) and z[key].dtype == np.float32
    for i in range(TINY["layers"]):
        assert z[f"attention_{i}"].shape == (n, TINY["heads"], t, t)
        assert z[f"attention_{i}"].dtype == np.float32
    ids, mask = z["input_ids"], z["attention_mask"]
    lengths = mask.sum(1)
    assert (ids[:, 0] == TINY_IDS["[CLS]"]).all()
    assert (ids[np.arange(n), lengths - 1] == TINY_IDS["[SEP]"]).all()
    assert (ids[mask == 0] == TINY_IDS["[PAD]"]).all()


def test_distilbert_st_embeddings_are_cls_pooling(distil_cls_reference):
    z = distil_cls_reference["arrays"]
    cls = z["cls_embeddings"]
    np.testing.assert_allclose(cls, normalised(z["last_hidden_state"][:, 0]), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(cls, axis=1), 1, atol=1e-5)
    assert np.abs(z["st_embeddings"] - cls).max() <= ST_TOLERANCE
    assert np.abs(z["st_embeddings"] - z["embeddings"]).max() > 1e-2  # not mean pooling


def test_distilbert_attention_rows_sum_to_one_over_real_keys(distil_cls_reference):
    check_attention(distil_cls_reference["arrays"])


# BERT with max pooling, not normalised --------------------------------------------


@pytest.fixture(scope="module")
def bert_max_reference(tmp_path_factory):
    """A tiny random BERT with sentence-transformers' files (max pooling, no
    Normalize) and its reference outputs for 10 short sentences and the longest."""
    every = corpus.sentences()
    chosen = every[10:20] + sorted(every, key=len)[-2:-1]
    root = tmp_path_factory.mktemp("oracle-max")
    ref = tiny_and_reference(root, chosen, "--seed", 6, "--pooling", "max", "--no-normalize")
    assert "bert, max pooling ->" in ref["built"], ref["built"]
    assert "sentence-transformers (max pooling, not normalised)" in ref["done"], ref["done"]
    return ref


def test_tiny_bert_max_pooling_without_normalize(bert_max_reference):
    model = bert_max_reference["dir"]
    assert sorted(p.name for p in model.iterdir()) == sorted(HF_FILES + ST_FILES)
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["model_type"] == "bert"
    modules = json.loads((model / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling"]  # no Normalize
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text())
    assert [k for k, v in pooling.items() if v is True] == ["pooling_mode_max_tokens"]


def test_bert_st_embeddings_are_max_pooling_not_normalised(bert_max_reference):
    z = bert_max_reference["arrays"]
    assert z["pooling"].tolist() == ["max"] and z["normalize"].tolist() == [False]
    mask = z["attention_mask"].astype(bool)
    assert (~mask).any()  # padding present: it must not win the max
    state = z["last_hidden_state"]
    largest = np.where(mask[..., None], state, -np.inf).max(1)
    pooled = z["pooled"]
    assert pooled.shape == (len(state), TINY["hidden"]) and pooled.dtype == np.float32
    np.testing.assert_allclose(pooled, largest, atol=1e-5)
    assert np.abs(z["st_embeddings"] - pooled).max() <= ST_TOLERANCE
    assert (np.abs(np.linalg.norm(pooled, axis=1) - 1) > 1e-2).all()  # not unit norm
    np.testing.assert_allclose(z["max_embeddings"], normalised(pooled), atol=1e-5)


# bad input -----------------------------------------------------------------------

SMALL = ["--layers=1", "--heads=1", "--hidden=8", "--intermediate=4"]


@pytest.mark.parametrize(
    "argv",
    [
        ["reference", "{tmp}/absent", "{tmp}/s.txt", "{tmp}/o.npz"],
        ["reference", "{tmp}", "{tmp}/s.txt", "{tmp}/o.npz"],  # no config.json
        [
            "tiny",
            "{tmp}/m",
            "--layers",
            "1",
            "--heads",
            "3",
            "--hidden",
            "8",
            "--intermediate",
            "4",
        ],
        ["tiny", "{tmp}/m", "--layers", "1"],  # missing --heads ...
        [
            "tiny",
            "{tmp}/m",
            "--layers",
            "x",
            "--heads",
            "1",
            "--hidden",
            "8",
            "--intermediate",
            "4",
        ],
        ["tiny", "{tmp}/m", *SMALL, "--no-normalize"],  # without --pooling
        ["tiny", "{tmp}/m", *SMALL, "--family", "gpt2"],
        ["tiny", "{tmp}/m", *SMALL, "--pooling", "weightedmean"],
        ["unknown"],
    ],
)
def test_oracle_refuses_bad_input_with_one_line(tmp_path, argv):
    done = oracle(torch_python(), *(a.format(tmp=tmp_path) for a in argv), check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("bert_oracle.py: error: ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "m").exists()
