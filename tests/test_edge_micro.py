"""TFLite Micro and the deploy files, wired into export, the manifest and the edge demo.

The bundle is the session's digits bundle (edge_fixtures), exported with
every mode; `keras-mha-export` ran TFLM itself (tflite-micro is in .venv).
The device side runs as on a microcontroller's host: a copy of edge_demo/
alone in the TensorFlow-free .venv-edge-micro (tests/test_micro.py's venv).
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from edge_bundle import edge_python, one_error_line, run_main
from test_micro import micro_python

from bundle_contract.bundle import open_bundle
from bundle_contract.files import sha256_file
from bundle_contract.parity import default_thresholds
from edge_demo.app.cli import main
from edge_demo.runtimes.model import EdgeModel
from edge_demo.runtimes.policy import runtime_content, runtime_entry
from edge_demo.runtimes.runtime import select_runtime

pytest_plugins = ["edge_fixtures"]

# What TFLM's kernels run (docs/field_notes.md): float32 and the integer modes;
# float16 weights need DEQUANTIZE from float16, which TFLM lacks. `dynamic` of
# this small model is the float32 graph (no weight has 1024 elements), so it runs.
TFLM_RUNS = {"float32": True, "dynamic": True, "float16": False, "int8": True, "int16x8": True}


def _device(app_dir, python, *argv, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        [str(python), "-m", "edge_demo", *map(str, argv)],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def manifest(digits_bundle) -> dict:
    return json.loads((digits_bundle / "manifest.json").read_text())


def test_manifest_records_tflm_from_its_own_run(manifest):
    """runtimes["tflite-micro"] is what TFLM did at export: ran and met thresholds, or why not."""
    for mode, entry in manifest["models"].items():
        micro = entry["micro"]
        assert entry["runtimes"]["tflite-micro"] is TFLM_RUNS[mode], (mode, micro)
        assert entry["runtimes"]["ai-edge-litert"] is True
        if TFLM_RUNS[mode]:
            assert micro["flash_bytes"] == entry["deploy"]["bytes"]
            # The digits model is ~3 K parameters: its arena is tens of KB, not MB.
            assert 1024 < micro["reported_arena_bytes"] <= micro["arena_bytes"] < 256 * 1024
            assert 0 < micro["weight_bytes"] < micro["flash_bytes"]
            assert micro["named_flash_bytes"] == entry["bytes"]
            # true = TFLM met the mode's thresholds: at least the quantized modes' agreement
            floor = default_thresholds("int8", manifest["eval"]["samples"]).min_agreement
            assert micro["agreement"] >= floor - 1e-9
            assert "tflite-micro" in entry["deploy"]["verified_with"]
            assert "reason" not in micro
        else:
            reason = micro["reason"]
            assert "\n" not in reason and "DEQUANTIZE" in reason, reason
            assert entry["deploy"]["verified_with"] == ["ai-edge-litert"]


def test_deploy_files_are_smaller_and_bit_identical_on_litert(digits_bundle, manifest):
    """Same raw outputs (every eval sample) from the deploy file as from the named model."""
    bundle = open_bundle(digits_bundle)
    litert = select_runtime("litert")

    class Micro:  # what runtimes/policy.py keys on: the runtime's name
        name = "tflite-micro"

    for mode, entry in manifest["models"].items():
        deploy = entry["deploy"]
        path = digits_bundle / deploy["file"]
        assert sha256_file(path) == deploy["sha256"] and path.stat().st_size == deploy["bytes"]
        assert deploy["bytes"] < entry["bytes"] - 4096, mode  # names and the view subgraph
        raw = []
        for content in (bundle.model_bytes[mode], runtime_content(bundle, mode, Micro)):
            model = EdgeModel(litert, content)
            raw.append(model.run(model.prepare(bundle.eval.x))[0])
        assert raw[0].dtype == raw[1].dtype and np.array_equal(raw[0], raw[1]), mode
        stripped = runtime_entry(bundle.manifest.models[mode], Micro)
        assert stripped.input.name == "" and stripped.signatures == {}


def test_demo_on_tflm_passes_what_it_runs_and_skips_the_rest(digits_bundle, app_dir, tmp_path):
    """`--runtime tflite-micro` in its TensorFlow-free venv from a copied edge_demo/."""
    report = tmp_path / "micro.json"
    done = _device(
        app_dir, micro_python(), digits_bundle, "--runtime", "tflite-micro", "--json", report
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tflite-micro" in done.stdout and "Traceback" not in done.stderr
    modes = json.loads(report.read_text())["modes"]
    for mode, result in modes.items():
        if TFLM_RUNS[mode]:
            assert result["passed"] is True, (mode, result)
            assert result["samples"] == 360
        else:
            assert result["skipped"] is True and "DEQUANTIZE" in result["reason"], result
            assert f"{mode}: skipped: " in done.stdout


# TFLM's accuracy and agreement against LiteRT's, on the 360 digits: at most 7
# samples apart (0.0194), the bound tests/test_micro.py sets on the same effect
# seen in the raw outputs (RAW_MIN_TOP1_SAME: 3x the worst of the 2 flips
# measured over seeds 0-4 and two CPUs). The former 1 % (3 samples) was 1.5x.
TFLM_GAP = 7  # samples of 360


def test_tflm_parity_is_litert_parity_within_a_few_samples(
    digits_bundle, app_dir, tmp_path, figure
):
    """TFLM's reference kernels and XNNPACK round integer ops differently: a top-1
    flip or two on 360 digits (tests/test_micro.py), never more than 7."""
    figures = {}
    for runtime, python in (("tflite-micro", micro_python()), ("litert", edge_python("litert"))):
        report = tmp_path / f"{runtime}.json"
        done = _device(
            app_dir,
            python,
            digits_bundle,
            "--runtime",
            runtime,
            "--quant",
            "int8,float32",
            "--json",
            report,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        figures[runtime] = json.loads(report.read_text())["modes"]
    for mode in ("int8", "float32"):
        a, b = figures["tflite-micro"][mode], figures["litert"][mode]
        gap = max(abs(a["accuracy"] - b["accuracy"]), abs(a["agreement"] - b["agreement"]))
        samples = round(gap * 360)  # whole samples: 7/360 compared as floats can miss 7
        figure(f"{mode} TFLM vs LiteRT, samples apart", samples, f"<= {TFLM_GAP} of 360")
        assert samples <= TFLM_GAP, (mode, a, b)


def test_tflm_without_a_deploy_file_is_bad_input(bundle_copy, app_dir):
    data = json.loads((bundle_copy / "manifest.json").read_text())
    del data["models"]["int8"]["deploy"]
    (bundle_copy / "manifest.json").write_text(json.dumps(data))
    done = _device(
        app_dir, micro_python(), bundle_copy, "--runtime", "tflite-micro", "--quant", "int8"
    )
    assert done.returncode == 2
    one_error_line(done.stderr, "keras-mha-edge", "models.int8.deploy is missing")


# --- --debug MODE --------------------------------------------------------------


def test_debug_int8_prints_the_table_in_process(digits_bundle):
    status, out, err = run_main(main, [digits_bundle, "--debug", "int8"])
    assert status == 0, err
    lines = out.splitlines()
    assert "int8 against float32 on all 360 eval samples" in lines[0] and "heads 2" in lines[0]
    assert lines[1].split()[:3] == ["tensor", "op", "head"]
    rows = [ln for ln in lines[3:] if not ln.startswith("...")]
    assert len(rows) == 30 and lines[-1].startswith("... ")
    errors = [float(r.split()[-3]) for r in rows]
    assert errors == sorted(errors, reverse=True) and errors[0] > 0  # worst first
    assert any(r.split()[2] == "1" for r in rows)  # per-head rows of a (1, 2, 8, 8) tensor


def test_debug_json_writes_every_row(digits_bundle, tmp_path):
    """The table shows the worst 30; --json FILE holds every row, worst first."""
    out_path = tmp_path / "debug.json"
    status, out, err = run_main(main, [digits_bundle, "--debug", "int8", "--json", out_path])
    assert status == 0, err
    data = json.loads(out_path.read_text())
    rows = data["rows"]
    more = next(line for line in out.splitlines() if line.startswith("... "))
    assert more == f"... {len(rows) - 30} more rows (all {len(rows)} in {out_path})"
    assert len(rows) > 30 and data["mode"] == "int8" and data["samples"] == 360
    errors = [r["rel_rmse"] for r in rows]
    assert errors == sorted(errors, reverse=True) and errors[0] > 0
    table = [line.split() for line in out.splitlines()[3:33]]
    assert [t[0] for t in table] == [r["name"] for r in rows[:30]]  # the same rows, in order
    status, out, _ = run_main(main, [digits_bundle, "--debug", "int8"])
    assert "more rows (--json FILE writes every row)" in out
    status, _, err = run_main(main, [digits_bundle, "--debug", "int8", "--json", digits_bundle])
    assert status == 2 and "--json" in err


def test_debug_one_sample_in_the_edge_venv(digits_bundle, app_dir):
    done = _device(
        app_dir, edge_python("litert"), digits_bundle, "--debug", "int16x8", "--sample", 3
    )
    assert done.returncode == 0, done.stderr
    assert "int16x8 against float32 on eval sample 3" in done.stdout
    rows = done.stdout.splitlines()[3:-1]
    assert len(rows) == 30 and all(r.split()[4] in ("int16", "float32") for r in rows), rows
    assert any(r.split()[4] == "int16" for r in rows)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--debug", "int9"], "mode 'int9' is not in this bundle"),
        (["--debug", "int8", "--sample", "360"], "--sample: 360 is out of range"),
        (["--debug", "int8", "--text", "hi"], "--debug cannot be combined with --text"),
        (["--debug", "int8", "--wide"], "--debug cannot be combined with --wide"),
        (["--debug", "int8", "--runtime", "tflite-micro"], "the debugger runs on ai-edge-litert"),
    ],
)
def test_debug_bad_use_is_exit_2_in_one_line(digits_bundle, argv, fragment):
    status, _, err = run_main(main, [digits_bundle, *argv])
    assert status == 2
    one_error_line(err, "keras-mha-edge", fragment)


def test_debug_needs_the_float32_model(bundle_copy):
    data = json.loads((bundle_copy / "manifest.json").read_text())
    del data["models"]["float32"]
    (bundle_copy / "manifest.json").write_text(json.dumps(data))
    status, _, err = run_main(main, [bundle_copy, "--debug", "int8"])
    assert status == 2
    one_error_line(err, "keras-mha-edge", "needs the bundle's float32 model")


# --- text models: the embedding's index wrap --------------------------------


def _ops(content: bytes) -> dict[str, int]:
    from keras_mha_export.graph import op_histogram, read_graph

    return op_histogram(read_graph(content))


def test_drop_index_wrap_removes_only_the_wrap_in_front_of_the_gather(text_bundle, digits_bundle):
    """Keras's `take` puts LESS, ADD, SELECT in front of the embedding's GATHER
    and the mask's (keras_mha.layers.TokenEmbedding: one wrap of the same ids
    feeds both); the deploy file has none of them and otherwise the same ops."""
    from keras_mha_export.deploy import deploy_bytes, without_index_wrap

    named = (text_bundle / "model_int8.tflite").read_bytes()
    classifier, stripped = deploy_bytes(named)
    before, after = _ops(named), _ops(stripped)
    assert before["SELECT"] == before["LESS"] == 1 and before["GATHER"] == 2
    assert "SELECT" not in after and "LESS" not in after and after["GATHER"] == 2
    assert after["ADD"] == before["ADD"] - 1
    assert sum(before.values()) - sum(after.values()) == 3
    assert _ops(classifier) == after  # the named reference TFLM can run
    digits = (digits_bundle / "model_int8.tflite").read_bytes()
    assert without_index_wrap(digits) is digits  # no embedding: nothing to remove


def test_text_bundle_runs_on_tflm_with_its_arena(text_bundle, app_dir, tmp_path):
    """float32 and int8 of a token model run on TFLite Micro: export measured the
    arena, and the device's `--runtime tflite-micro` meets the thresholds."""
    manifest = json.loads((text_bundle / "manifest.json").read_text())
    for mode in ("float32", "int8"):
        entry = manifest["models"][mode]
        assert entry["runtimes"]["tflite-micro"] is True, entry["micro"]
        micro = entry["micro"]
        assert 1024 < micro["reported_arena_bytes"] <= micro["arena_bytes"] < 256 * 1024
        assert entry["deploy"]["verified_with"] == ["ai-edge-litert", "tflite-micro"]
    report = tmp_path / "micro.json"
    done = _device(
        app_dir, micro_python(), text_bundle, "--runtime", "tflite-micro", "--json", report
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    modes = json.loads(report.read_text())["modes"]
    assert modes["float32"]["passed"] is True and modes["int8"]["passed"] is True, modes
    assert modes["float32"]["agreement"] == 1.0
