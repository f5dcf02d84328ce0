"""A language model's bundle: keras-mha-export on a run of keras-mha-import, verified by
the device's code, then run by the device app (`python -m edge_demo BUNDLE`, its
parity table, `--generate`, `--chat`); its refusals are one line and exit 2.

The model is a random Llama (2 blocks, 4 query heads in 2 key/value groups, the 256
byte tokens) whose final norm is scaled so that its logits are decided, as a trained
model's are: a random model's top two logits lie within a nat nearly everywhere,
and the verdict bounds the decided positions (tasks/language_model.py)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from tests.gguf_files import byte_tokens, write_llama_gguf
from tests.test_decoder import random_decoder

CONTEXT = 128  # the byte model's eval sentences: 58 of the 64 fit
FINAL_NORM = 4.0  # logits of std ~7: most positions decided (1 nat ahead)


def decided_decoder(seed: int = 5):
    model = random_decoder(vocab_size=len(byte_tokens()), seed=seed, max_position_embeddings=512)
    for weight in model.weights:
        if weight.path.endswith("final_norm/scale"):
            weight.assign(np.full(weight.shape, FINAL_NORM, "float32"))
    return model


@pytest.fixture(scope="module")
def lm_bundle(tmp_path_factory):
    """(run, bundle, export's stdout) of the decided random decoder, every mode."""
    import contextlib
    import io

    from keras_mha.pretrained.cli import main as import_main
    from keras_mha_export.cli import main as export_main

    root = tmp_path_factory.mktemp("lm-bundle")
    write_llama_gguf(root / "m.gguf", decided_decoder())
    assert import_main([str(root / "m.gguf"), "--out", str(root / "run")]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = export_main([str(root / "run"), "--out", str(root / "bundle"),
                            "--context", str(CONTEXT)])  # fmt: skip
    assert code == 0, out.getvalue()
    return root / "run", root / "bundle", out.getvalue()


def edge(argv, capsys) -> tuple[int, str, str]:
    from edge_demo.app.cli import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_export_verifies_every_mode_with_the_device_s_code(lm_bundle):
    from bundle_contract.manifest import Manifest
    from bundle_contract.parity import changes_allowed

    _, bundle, log = lm_bundle
    manifest = Manifest.read(bundle)
    assert manifest.task.name == "language-model"
    assert manifest.verified == ["float32", "dynamic", "float16"], log
    settings = manifest.settings
    # (L, 2, 1, S, h_kv, d): 2 blocks, keys and values, 2 key/value heads of 8
    assert settings.cache_shape == (2, 2, 1, CONTEXT, 2, 8)
    assert (settings.context, settings.prefill) == (CONTEXT, 16)
    # GQA: 4 query heads read 2 key/value heads, so the cache is half of plain MHA's
    assert settings.cache_bytes_per_token == 2 * 2 * 2 * 8 * 4 == 256
    assert settings.cache_bytes_per_token_all_heads == 512
    assert settings.chat_before == "<|end|>user\n" and settings.chat_after == "<|end|>assistant\n"
    with np.load(bundle / "eval.npz") as arrays:
        scored = np.arange(arrays["x"].shape[1]) < arrays["lengths"][:, None] - 1
        decided = int((scored & (arrays["margin"] >= 1.0)).sum())
    assert decided > 1000  # the final norm makes most of the ~2,700 positions decided
    for mode in manifest.verified:
        t = manifest.models[mode].thresholds
        assert t.min_decided_agreement == (decided - changes_allowed(decided)) / decided
        assert t.min_greedy_prefix == (7 / 8 if mode == "float32" else None)
    f32 = manifest.models["float32"].parity
    # float32 is Keras's computation in another order (logits within 1e-5 of their
    # spread, tests/test_decoder_export.py): no decided token and no greedy token
    # changes, and each NLL moves by rounding only
    assert f32.decided_agreement == 1.0 and f32.greedy_prefix == 1.0
    assert abs(f32.perplexity_ratio - 1) < 1e-4 and f32.max_abs_diff < 1e-3
    for mode, stored in (("float16", "float16"), ("dynamic", "int8")):
        entry = manifest.models[mode]
        assert stored in entry.weights, (mode, entry.weights)  # the mode's weights, stored
        assert entry.parity.perplexity_ratio <= entry.thresholds.max_perplexity_ratio
    # dynamic range stores int8 weights: about a quarter of float32's bytes plus the
    # float32 norms and biases the quantizer leaves (this model is tiny: 0.6x)
    sizes = {m: manifest.models[m].bytes for m in manifest.verified}
    assert sizes["dynamic"] < sizes["float16"] < sizes["float32"]
    assert "float32" in log and "verified" in log and "attn" not in log


@pytest.mark.slow
def test_the_device_s_parity_table_passes_with_tokens_a_second(lm_bundle, capsys, tmp_path):
    _, bundle, _ = lm_bundle
    code, out, err = edge([bundle, "--json", tmp_path / "r.json", "--raw", tmp_path / "r.npz"],
                          capsys)  # fmt: skip
    assert code == 0, out + err
    with np.load(bundle / "eval.npz") as reference, np.load(tmp_path / "r.npz") as raw:
        assert sorted(raw.files) == ["dynamic", "float16", "float32"]
        scored = np.arange(reference["x"].shape[1]) < reference["lengths"][:, None] - 1
        # each position's NLL of its next token, as the device computed it
        assert np.abs(raw["float32"] - reference["nll"])[scored].max() < 1e-3
    assert "next-token logits over 257 tokens" in out
    assert "PASS: 3 of 3 modes" in out and "decode tok/s" in out and "p50" not in out
    report = json.loads((tmp_path / "r.json").read_text())
    for mode, result in report["modes"].items():
        assert result["passed"] is True, (mode, result)
        assert result["prefill_tokens_per_s"] > 0 and result["decode_tokens_per_s"] > 0
        assert result["decided_agreement"] >= result["thresholds"]["min_decided_agreement"]


@pytest.mark.slow
def test_generate_streams_what_the_float_model_generates(lm_bundle, capsys):
    """The device's greedy answer in float32, streamed, is the Keras model's."""
    import keras_mha.decoder as decoder_lib

    run, bundle, _ = lm_bundle
    prompt = "The animal didn't cross the street"
    code, out, err = edge([bundle, "--generate", prompt, "--quant", "float32",
                           "--max-new-tokens", 24], capsys)  # fmt: skip
    assert code == 0, out + err
    lm = decoder_lib.load(run)
    made = lm.generate_ids(lm.encode(prompt), 24, stop_at_eos=False)
    lines = out.splitlines()
    header = lines.index(f"float32, {len(made.prompt_ids)} prompt tokens:")
    assert lines[header + 1] == lm.decode(made.new_ids)
    assert lines[header + 2].startswith("24 new tokens; prefill ")
    assert "decode" in lines[header + 2] and "tokens/s" in lines[header + 2]


@pytest.mark.slow
def test_chat_wraps_the_message_in_the_template(lm_bundle, capsys):
    import keras_mha.decoder as decoder_lib

    run, bundle, _ = lm_bundle
    code, out, err = edge([bundle, "--chat", "Hi", "--max-new-tokens", 5], capsys)
    assert code == 0, out + err
    lm = decoder_lib.load(run)
    ids = lm.encode(lm.chat_prompt("Hi"))
    assert f"float32, {len(ids)} prompt tokens:" in out
    made = lm.generate_ids(ids, 5)
    assert lm.answer(made.new_ids) in out


def one_line(code, out, err, *words):
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


@pytest.mark.slow
def test_a_prompt_beyond_the_context_is_one_line(lm_bundle, capsys):
    _, bundle, _ = lm_bundle
    one_line(*edge([bundle, "--generate", "x" * 120], capsys),
             "--generate", "120 tokens", "context of 128 holds 96")  # fmt: skip
    one_line(*edge([bundle, "--chat", "   "], capsys), "--chat", "empty")
    one_line(*edge([bundle, "--text", "hello"], capsys), "--text", "takes --generate, --chat")
    one_line(*edge([bundle, "--debug", "dynamic"], capsys), "--debug", "language model's bundle")


def tampered(bundle, tmp_path, change) -> str:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    data = json.loads((copy / "manifest.json").read_text())
    change(data)
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


@pytest.mark.slow
def test_a_manifest_that_disagrees_with_the_file_is_one_line(lm_bundle, capsys, tmp_path):
    _, bundle, _ = lm_bundle

    def no_decode(data):
        del data["models"]["float32"]["signatures"]["decode"]

    one_line(*edge([tampered(bundle, tmp_path / "a", no_decode)], capsys),
             "models.float32.signatures", "no 'decode' signature")  # fmt: skip

    def other_cache(data):  # a manifest at one with itself, not with the files
        for entry in data["models"].values():
            for signature in entry["signatures"].values():
                signature["inputs"]["cache"]["shape"][5] = 4
                signature["outputs"]["cache"]["shape"][5] = 4
        data["generation"]["cache_shape"][5] = 4
        data["generation"]["cache_bytes_per_token"] //= 2
        data["generation"]["cache_bytes_per_token_all_heads"] //= 2

    one_line(*edge([tampered(bundle, tmp_path / "b", other_cache), "--quant", "float32"],
                   capsys),
             "model_float32.tflite", "cache is float32 [2, 2, 1, 128, 2, 8] but manifest.json "
             "says float32 [2, 2, 1, 128, 2, 4]")  # fmt: skip

    def disagreeing(data):  # the entry's cache is not the generation entry's
        data["generation"]["context"] = 127
        data["generation"]["cache_shape"][3] = 127

    one_line(*edge([tampered(bundle, tmp_path / "c", disagreeing)], capsys),
             "cache.shape", "generation.cache_shape is [2, 2, 1, 127, 2, 8]")  # fmt: skip


@pytest.mark.slow
def test_export_refuses_what_a_language_model_cannot_be(lm_bundle, capsys, tmp_path):
    from keras_mha_export.cli import main as export_main

    run, _, _ = lm_bundle
    out = tmp_path / "never"
    for argv, words in (
        (["--quant", "int8"], ("--quant", "float32, float16, dynamic", "'int8'")),
        (["--context", "1"], ("--context", "between 2 and the model's 512")),
        (["--context", "64", "--prefill", "65"], ("--prefill", "between 1 and the context")),
        (["--length", "8"], ("--length", "does not apply to a language model")),
        (["--context", "20"], ("--context 20", "holds none of the eval sentences")),
    ):
        code = export_main([str(run), "--out", str(out), *argv])
        one_line(code, "", capsys.readouterr().err, *words)
        assert not out.exists()
    (tmp_path / "classifier").mkdir()
    code = export_main([str(tmp_path / "classifier"), "--context", "64"])
    one_line(code, "", capsys.readouterr().err, "--context", "language model's run")


# --- the task's figures, on numbers worked by hand ------------------------------------


def toy_eval():
    from bundle_contract.tasks.language_model import check_language_eval

    x = np.array([[5, 6, 7, 8], [9, 4, 0, 0]], np.int32)
    arrays = {
        "x": x, "lengths": np.array([4, 2]),
        "top1": np.array([[6, 7, 8, 1], [4, 3, -1, -1]], np.int32),
        "margin": np.array([[2.0, 0.5, 3.0, 0], [1.0, 0, 0, 0]], np.float32),
        "nll": np.array([[1.0, 2.0, 3.0, 0], [0.5, 0, 0, 0]], np.float32),
        "prompts": np.array([[5, 6], [9, 0]], np.int32), "prompt_lengths": np.array([2, 1]),
        "greedy": np.array([[7, 8, 1, 2], [4, 4, 4, 4]], np.int32),
    }  # fmt: skip
    return arrays, check_language_eval(arrays, "eval.npz")


def test_measure_language_on_numbers_worked_by_hand():
    from bundle_contract.tasks.language_model import LanguageOutputs, measure_language

    _, evaluation = toy_eval()
    # scored: row 0 positions 0-2, row 1 position 0; decided (margin >= 1): (0,0), (0,2), (1,0)
    assert evaluation.scored.sum() == 4 and evaluation.decided.sum() == 3
    outputs = LanguageOutputs(
        top1=np.array([[6, 2, 9, 0], [4, 0, 0, 0]]),  # (0,1) near-tie changed, (0,2) decided
        nll=np.array([[1.5, 2.0, 3.0, 9], [0.5, 9, 9, 9]]),  # unscored positions ignored
        greedy=np.array([[7, 8, 3, 3], [5, 4, 4, 4]]),  # 2 of 4 shared; 0 of 4
    )
    p = measure_language(outputs, evaluation)
    assert p.agreement == 2 / 4 and p.decided_agreement == 2 / 3
    assert math.isclose(p.perplexity_ratio, math.exp(0.5 / 4))
    assert p.max_abs_diff == 0.5 and math.isclose(p.mean_abs_diff, 0.5 / 4)
    assert p.greedy_prefix == (2 / 4 + 0 / 4) / 2
    nan = LanguageOutputs(outputs.top1, np.full((2, 4), np.nan), outputs.greedy)
    assert math.isnan(measure_language(nan, evaluation).perplexity_ratio)


def test_language_thresholds_miss_what_they_should():
    from bundle_contract.parity import Parity
    from bundle_contract.tasks.language_model import language_thresholds

    t = language_thresholds("dynamic", 1000)  # changes_allowed(1000) = 18
    assert t.min_decided_agreement == 982 / 1000 and t.max_perplexity_ratio == 1.02
    assert t.min_greedy_prefix is None and language_thresholds("float32", 1000).min_greedy_prefix
    good = Parity(math.nan, 0.9, 0.1, 0.01, decided_agreement=0.99, perplexity_ratio=1.01,
                  greedy_prefix=0.1)  # fmt: skip
    assert t.failures(good, math.nan) == []
    bad = Parity(math.nan, 0.9, 0.1, 0.01, decided_agreement=0.98, perplexity_ratio=1.03)
    assert t.failures(bad, math.nan) == [
        "decided next-token agreement 0.9800 < 0.9820",
        "perplexity ratio 1.03000 > 1.02000",
    ]
    with pytest.raises(ValueError, match="no 'int8' mode"):
        language_thresholds("int8", 10)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda a: a.update(lengths=np.array([4, 1])), "lengths must be 2 values from 2 to 4"),
        (lambda a: a.update(nll=a["nll"][:, :3]), "nll must have x's shape"),
        (lambda a: a.update(greedy=a["greedy"][:1]), "same 1 to 256 rows"),
        (lambda a: a["margin"].__setitem__((0, 0), np.nan), "margin"),
        (lambda a: a["top1"].__setitem__((0, 1), -1), "top1 has no token at a scored position"),
        (lambda a: a["x"].__setitem__((0, 1), -3), "x holds a negative token id"),
    ],
)
def test_a_broken_eval_npz_is_one_line(change, words):
    from bundle_contract.errors import UsageError
    from bundle_contract.tasks.language_model import check_language_eval

    arrays, _ = toy_eval()
    arrays = {k: v.copy() for k, v in arrays.items()}
    change(arrays)
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        check_language_eval(arrays, "eval.npz")
