"""The project's sentence corpus and the PyTorch oracle for the imported encoders.

keras_mha/pretrained/corpus.py: enough sentences, none twice, the lesson's
sentence, long ones, a deterministic disjoint split. tests/oracle/bert_oracle.py
runs in the torch venv (KERAS_MHA_TORCH_PYTHON, default .venv-torch/bin/python):
`tiny` builds a random BERT in tmp_path and `reference` writes its outputs,
whose shapes and invariants are checked here (~15 s, most of it importing
torch and transformers twice).
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np
import pytest
from environment import missing

from keras_mha.pretrained import corpus

REPO = pathlib.Path(__file__).resolve().parents[1]
ORACLE = REPO / "tests" / "oracle" / "bert_oracle.py"
LESSON = "The animal didn't cross the street because it was too tired."
TINY = dict(layers=2, heads=2, hidden=32, intermediate=64)
TINY_IDS = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}


def torch_python() -> pathlib.Path:
    path = pathlib.Path(
        os.environ.get("KERAS_MHA_TORCH_PYTHON") or REPO / ".venv-torch" / "bin" / "python"
    )
    if not path.exists():
        missing(f"{path} (make backend-venvs, plus transformers and sentence-transformers)")
    return path


def oracle(python, *argv, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(python), str(ORACLE), *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


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
        ["sentences", "input_ids", "attention_mask", "last_hidden_state", "embeddings"]
        + [f"attention_{i}" for i in range(TINY["layers"])]
    )  # no modules.json: no st_embeddings
    assert list(z["sentences"]) == tiny_reference["sentences"]
    assert z["input_ids"].dtype == z["attention_mask"].dtype == np.int32
    assert z["attention_mask"].shape == (n, t)
    assert z["last_hidden_state"].shape == (n, t, TINY["hidden"])
    assert z["embeddings"].shape == (n, TINY["hidden"])
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
        ["unknown"],
    ],
)
def test_oracle_refuses_bad_input_with_one_line(tmp_path, argv):
    done = oracle(torch_python(), *(a.format(tmp=tmp_path) for a in argv), check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("bert_oracle.py: error: ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "m").exists()
