"""keras-mha-export --npu: full-integer models compiled for Arm Ethos-U with Vela.

What Vela maps to the NPU is a property of the graph (its operators, types
and shapes), not of trained weights, so these counts hold on any CPU: the
digits classifier (no embedding, no mask) maps whole to every Ethos-U; a
token classifier, whose mask is 0/1 floats (no boolean operator), keeps only
its two lookups (the embedding and the mask) on a U55's or U65's CPU and
maps whole to the U85, which runs GATHER too.
The figures themselves are Vela's estimates; nothing here runs on an NPU.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from edge_bundle import REPO, export_bundle, export_command, make_text_run

from bundle_contract.bundle import open_bundle
from bundle_contract.errors import UsageError
from keras_mha_export import npu
from keras_mha_export.graph import op_histogram, read_graph
from keras_mha_export.summary import npu_table

pytest_plugins = ["edge_fixtures"]

# A boolean mask's operators, which U55 and U65 have no kernels for (Vela's
# SUPPORTED_OPS.md): ids != pad, the query & key masks ANDed, where(mask, ...),
# the index wrap's LESS and SELECT; and a masked mean's DIV. The token
# classifier's 0/1 float mask (keras_mha.layers.TokenEmbedding) needs none.
BOOLEAN_OPS = {"NOT_EQUAL", "EQUAL", "LESS", "LOGICAL_AND", "SELECT", "SELECT_V2", "CAST", "DIV"}


def test_accelerators_parse_and_unknown_ones_are_refused_naming_the_choices():
    assert npu.parse_accelerators(None) == ()
    assert npu.parse_accelerators("all") == npu.ACCELERATORS
    assert [a.name for a in npu.parse_accelerators("ethos-u85-256, ethos-u55-128")] == [
        "ethos-u55-128",
        "ethos-u85-256",
    ]
    with pytest.raises(UsageError, match="ethos-u55-128, ethos-u65-256, ethos-u85-256") as error:
        npu.parse_accelerators("ethos-u55-999")
    assert "'ethos-u55-999'" in str(error.value)


def test_npu_without_a_full_integer_mode_is_refused(tmp_path):
    with pytest.raises(UsageError, match="--quant asks for none"):
        npu.npu_request("all", ("float32", "dynamic"))
    assert npu.npu_request("ethos-u85-256", ("float32", "int8")) == (npu.BY_NAME["ethos-u85-256"],)
    assert npu.npu_request(None, ("float32",)) == ()
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha_export", str(tmp_path / "none"), "--quant", "float16"]
        + ["--npu", "all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "full-integer modes (int8, int16x8)" in done.stderr


def test_vela_missing_is_one_line_naming_the_package(monkeypatch):
    monkeypatch.setattr(npu, "vela_version", lambda: None)
    with pytest.raises(UsageError, match="pip install ethos-u-vela"):
        npu.require_vela()


def test_command_refuses_an_unknown_accelerator_in_one_line_before_loading(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha_export", str(tmp_path / "none"), "--npu", "u55"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--npu" in lines[0] and "unknown accelerator 'u55'" in lines[0]


def _compile(bundle, mode: str, accelerator, tmp_path):
    entry = open_bundle(bundle).manifest.models[mode]
    model = (bundle / entry.deploy.file).read_bytes()
    return model, npu.compile_for(model, accelerator, tmp_path / f"{mode}-{accelerator.name}")


@pytest.mark.parametrize("accelerator", npu.ACCELERATORS, ids=lambda a: a.name)
def test_digits_int8_maps_whole_to_every_ethos_u(digits_bundle, accelerator, tmp_path):
    model, found = _compile(digits_bundle, "int8", accelerator, tmp_path)
    assert found.reason is None
    assert found.cpu_ops == {}
    assert found.get("npu_partitions") == 1
    assert found.get("npu_tflite_operators") == found.get("tflite_operators") > 0
    assert found.get("npu_macs") == found.get("macs") > 0  # every multiply on the NPU
    assert found.get("cpu_macs") == 0 and found.mac_fraction == 1.0
    assert found.get("sram_kib") > 0 and found.get("inferences_per_second") > 0
    compiled = (tmp_path / f"int8-{accelerator.name}" / found.file).read_bytes()
    assert hashlib.sha256(compiled).hexdigest() == found.sha256 and len(compiled) == found.get(
        "compiled_bytes"
    )
    # cycles at the configuration's clock are the inference time Vela reports
    seconds = found.get("cycles") / found.get("clock_hz")
    assert found.get("inference_seconds") == pytest.approx(seconds, rel=1e-3)


@pytest.mark.parametrize("accelerator", npu.ACCELERATORS, ids=lambda a: a.name)
def test_digits_int16x8_attention_matmuls_stay_on_a_small_npus_cpu(
    digits_bundle, digits_run, accelerator, tmp_path
):
    """Vela 5.2 has no 16-bit BATCH_MATMUL for U55/U65: q k^T and w v of each layer
    run on the CPU there, T * T * d_model multiply-accumulates each (all heads)."""
    config = json.loads((digits_run / "metrics.json").read_text())["config"]
    t, d, layers = config["sequence_length"], config["d_model"], config["num_layers"]
    model, found = _compile(digits_bundle, "int16x8", accelerator, tmp_path)
    assert found.reason is None
    if accelerator.name.startswith("ethos-u85"):
        assert found.cpu_ops == {} and found.get("cpu_macs") == 0
        assert found.mac_fraction == 1.0
    else:
        assert found.cpu_ops == {"BATCH_MATMUL": 2 * layers}
        assert found.get("cpu_macs") == 2 * layers * t * t * d
        assert found.mac_fraction == pytest.approx(
            found.get("npu_macs") / (found.get("npu_macs") + 2 * layers * t * t * d)
        )
        assert found.mac_fraction < 1.0


@pytest.fixture(scope="module")
def per_head_bundle(tmp_path_factory):
    """The token classifier of text_bundle, with the lesson's per-head graph, in int8."""
    root = tmp_path_factory.mktemp("per_head")
    run = make_text_run(root / "run", implementation="per_head")
    return export_bundle(run, root / "bundle", "int8")


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["fused", "per_head"])
@pytest.mark.parametrize("accelerator", npu.ACCELERATORS, ids=lambda a: a.name)
def test_token_classifier_int8_runs_whole_on_the_npu_after_its_lookups(
    request, graph, accelerator, tmp_path
):
    """Fused or the lesson's per-head graph (each head's projections, softmax and
    weighted sum its own operators): everything after the lookups, every head
    included, is one NPU partition."""
    bundle = request.getfixturevalue("text_bundle" if graph == "fused" else "per_head_bundle")
    model, found = _compile(bundle, "int8", accelerator, tmp_path)
    assert found.reason is None
    assert found.get("npu_macs") == found.get("macs")  # the projections and attention: NPU
    assert found.get("cpu_macs") == 0
    assert found.get("npu_partitions") == 1  # everything after the lookups: one NPU graph
    if accelerator.name.startswith("ethos-u85"):
        assert found.cpu_ops == {}
    else:  # the token embedding and its 0/1 mask, looked up on the CPU; no mask op
        assert found.cpu_ops == {"GATHER": 2}
        assert not set(op_histogram(read_graph(model))) & BOOLEAN_OPS
    total = found.get("tflite_operators")
    assert found.get("npu_tflite_operators") == total - sum(found.cpu_ops.values())


def test_export_with_npu_keeps_the_compiled_files_and_vela_report(text_run, tmp_path):
    out = tmp_path / "bundle"
    plain_run = export_command(text_run, out, "int8")  # the bundle without --npu, then with it
    assert plain_run.returncode == 0, plain_run.stderr
    plain = json.loads((out / "manifest.json").read_text())["models"]["int8"]
    assert "npu" not in plain
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_mha_export",
            str(text_run),
            "--out",
            str(out),
            "--quant",
            "float32,int8",
            "--npu",
            "ethos-u55-128,ethos-u85-256",
            "--overwrite",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    manifest = open_bundle(out).manifest
    assert manifest.models["float32"].npu is None  # float models are not for the NPU
    report = manifest.models["int8"].npu
    assert report.vela == npu.require_vela() and report.source == "model_int8.deploy.tflite"
    assert [t.accelerator for t in report.targets] == ["ethos-u55-128", "ethos-u85-256"]
    for target in report.targets:
        assert target.file == f"model_int8.{target.accelerator}.vela.tflite"
        assert hashlib.sha256((out / target.file).read_bytes()).hexdigest() == target.sha256
        assert target.system_config == npu.BY_NAME[target.accelerator].system_config
    assert f"Vela {report.vela}" in done.stdout
    assert npu_table({out.parent.name: manifest}) in done.stdout  # named by the run
    u85 = report.target("ethos-u85-256")
    assert u85.npu_fraction == 1.0 and u85.mac_fraction == 1.0


def test_length_is_checked_before_loading_and_refused_for_a_fixed_model(text_run, tmp_path):
    """--length L is for encoders (a dynamic sequence axis): a bad value is one line
    before TensorFlow; a classifier already fixed at its max_length is refused by name."""
    done = subprocess.run(
        [sys.executable, "-m", "keras_mha_export", str(tmp_path / "none"), "--length", "1"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--length: must be an integer >= 2, got 1" in lines[0]
    from keras_mha_export.bundle import export_bundle as export

    with pytest.raises(UsageError, match=r"already fixed at \(1, \d+\)") as caught:
        export(text_run, tmp_path / "bundle", "int8", length=16)
    assert "--length is for token-id models with a dynamic sequence axis" in str(caught.value)
    assert not (tmp_path / "bundle").exists()
