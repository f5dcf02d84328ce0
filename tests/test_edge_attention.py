"""Attention weights out of every exported mode, verified, and the head view from the device.

The session bundles (tests/edge_fixtures.py) are exported by the command, so
they carry the `view` signature and `attention.npz`. In process, LiteRT (the
.venv has ai-edge-litert) runs `score.run_mode` and the app; tflite-runtime
runs in its own venv.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil

import numpy as np
import pytest
from edge_bundle import edge_python, edit_manifest, match_file, one_error_line, run_main

from bundle_contract import attention, attention_parity
from bundle_contract.attention_parity import DEFAULT_THRESHOLDS, AttentionThresholds
from bundle_contract.bundle import open_bundle
from bundle_contract.errors import UsageError
from bundle_contract.fields import Fields
from edge_demo.app.cli import main
from edge_demo.runtimes.model import EdgeModel
from edge_demo.runtimes.runtime import select_runtime
from edge_demo.runtimes.score import run_mode

pytest_plugins = ["edge_fixtures"]

PROG = "keras-mha-edge"


def _page_data(path) -> dict:
    text = path.read_text()
    found = re.search(
        r'<script type="application/json" id="attention-data">(.*?)</script>', text, re.S
    )
    assert found, "no attention-data element"
    return json.loads(found.group(1))


@pytest.mark.parametrize("fixture", ["digits_bundle", "text_bundle"])
def test_every_mode_carries_verified_attention(fixture, request):
    bundle = open_bundle(request.getfixturevalue(fixture))
    manifest = bundle.manifest
    assert manifest.attention is not None
    assert manifest.attention.samples == min(manifest.eval.samples, attention.MAX_SAMPLES)
    for mode, entry in manifest.models.items():
        assert entry.verified, (mode, entry.failures)
        view = entry.signatures[entry.attention.signature]
        assert list(view.outputs) == [attention.output_name(i) for i in range(len(view.outputs))]
        for layer, spec in enumerate(view.outputs.values()):
            reference = bundle.attention[layer]
            assert spec.shape == (1, *reference.shape[1:])  # (1, h, T, S)
            # Integer modes keep the attention integer: softmax's fixed scale.
            if mode in ("int8", "int16x8"):
                assert spec.dtype == {"int8": "int8", "int16x8": "int16"}[mode]
                assert spec.scale is not None
        figures = entry.attention.parity
        thresholds = entry.attention.thresholds
        assert thresholds == attention_parity.DEFAULT_THRESHOLDS[mode]
        assert figures is not None and thresholds.failures(figures) == []
        assert entry.attention.faithful is True  # export's verdict on the view, written
        assert figures.rows > 0
        # int8's tail was counted (a finite share); the other modes have none.
        assert math.isfinite(figures.tail_share) == (mode == "int8"), (mode, figures)


def test_reference_is_the_keras_models_own_attention(digits_bundle, digits_run):
    """attention.npz equals forward(..., return_attention_scores=True) of the run's model."""
    import keras

    from keras_mha.model import forward

    bundle = open_bundle(digits_bundle)
    model = keras.models.load_model(digits_run / "model.keras")
    x = bundle.eval.x[: bundle.manifest.attention.samples]
    _, scores = forward(model, x, return_attention_scores=True)
    for mine, theirs in zip(bundle.attention, scores, strict=True):
        # Same float32 graph, other batch size: a few ulps of a value <= 1.
        np.testing.assert_allclose(mine, np.asarray(theirs), atol=1e-6)


def test_run_signature_is_the_manifests_outputs(digits_bundle):
    bundle = open_bundle(digits_bundle, "int8")
    entry = bundle.manifest.models["int8"]
    model = EdgeModel(select_runtime("litert"), bundle.model_bytes["int8"])
    model.check_manifest(entry)
    out = model.run_signature("view", bundle.eval.x[:3])
    spec = entry.signatures["view"].outputs["attention_0"]
    assert out["attention_0"].shape == (3, *spec.shape[1:])
    assert out["attention_0"].dtype == np.float32
    # Dequantized int8: multiples of the scale in [0, 1], rows summing to ~1.
    steps = out["attention_0"] / spec.scale  # (q - zero_point): whole numbers
    assert np.allclose(steps, np.round(steps), atol=1e-3)
    np.testing.assert_allclose(out["attention_0"].sum(-1), 1.0, atol=0.05)
    with pytest.raises(UsageError, match="no signature 'nope'"):
        model.run_signature("nope", bundle.eval.x[:1])


def _tamper_reference(bundle_dir, change) -> None:
    path = bundle_dir / "attention.npz"
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays = change(arrays)
    np.savez_compressed(path, **arrays)
    match_file(bundle_dir, "attention")


def test_float32_bound_fails_a_reference_off_by_twice_the_bound(bundle_copy):
    """float32 passes at ~1e-7 (measured); a reference 2e-5 off must fail it."""
    _tamper_reference(bundle_copy, lambda a: {k: v + np.float32(2e-5) for k, v in a.items()})
    result = run_mode(open_bundle(bundle_copy, "float32"), "float32", select_runtime("litert"))
    assert result.status == "failed"
    assert result.attention_status == "failed"
    assert any(f.startswith("attention max |Δ|") for f in result.failures)
    # The classification figures are untouched by the attention check.
    assert result.agreement == 1.0 and not any("prob" in f for f in result.failures)


@pytest.mark.parametrize("faithful", ["absent", True, False])
def test_a_view_fails_the_mode_unless_the_manifest_marks_it_not_faithful(faithful, bundle_copy):
    """A reference 2e-5 off: float32's view misses its 1e-5 bound. A manifest
    without `faithful` (older bundles, whose verified modes all met it) or with
    `true` fails the mode as before; `false` (export kept a mode whose
    predictions hold) reports the miss and passes the mode on its predictions."""
    _tamper_reference(bundle_copy, lambda a: {k: v + np.float32(2e-5) for k, v in a.items()})

    def mark(m):
        view = m["models"]["float32"]["attention"]
        view.pop("faithful", None)
        if faithful != "absent":
            view["faithful"] = faithful

    edit_manifest(bundle_copy, mark)
    bundle = open_bundle(bundle_copy, "float32")
    assert bundle.manifest.models["float32"].attention.faithful == (
        None if faithful == "absent" else faithful
    )
    result = run_mode(bundle, "float32", select_runtime("litert"))
    assert result.attention_status == "failed"
    assert [f[:17] for f in result.attention_failures] == ["attention max |Δ|"]
    assert result.task_failures == [] and result.agreement == 1.0
    if faithful is False:
        assert result.passed and result.failures == [] and result.view_excused
    else:
        assert not result.passed and result.failures == result.attention_failures
        assert not result.view_excused


def test_faithful_must_be_true_or_false():
    with pytest.raises(UsageError) as info:
        attention.AttentionCheck.from_json(
            Fields("manifest.json"),
            {
                "attention": {
                    "signature": "view",
                    "thresholds": DEFAULT_THRESHOLDS["int8"].to_json(),
                    "faithful": "yes",
                }
            },
            "attention",
            "models.int8.",
        )
    assert "'models.int8.attention.faithful' must be" in str(info.value)


def test_integer_agreement_fails_when_keys_are_shifted(bundle_copy):
    """Each query's weights moved to the next key: the most-attended key disagrees."""
    _tamper_reference(bundle_copy, lambda a: {k: np.roll(v, 1, axis=-1) for k, v in a.items()})
    result = run_mode(open_bundle(bundle_copy, "int8"), "int8", select_runtime("litert"))
    assert result.attention_status == "failed"
    assert (
        result.attention_agreement
        < attention_parity.DEFAULT_THRESHOLDS["int8"].min_argmax_agreement
    )
    assert any("most-attended key agreement" in f for f in result.failures)


def _one_hot_at_least_attended(arrays, samples):
    """The first `samples` samples' reference rows all weight on the key the
    float model attends to least: |Δ| near 1 on every one of those rows."""
    out = {}
    for name, a in arrays.items():
        a = a.copy()
        rows = a[:samples]
        rows[...] = np.eye(a.shape[-1], dtype=a.dtype)[rows.argmin(-1)]
        out[name] = a
    return out


@pytest.mark.parametrize("samples,fails", [(2, False), (5, True)])
def test_int8_tail_bound_counts_the_rows_beyond_64_quanta(samples, fails, bundle_copy):
    """int8's max |Δ| bound: at most 1 % of rows beyond 64 quanta. Rows of
    2 of 256 samples made to differ (0.78 %) pass, 5 (1.95 %) fail."""
    _tamper_reference(bundle_copy, lambda a: _one_hot_at_least_attended(a, samples))
    bundle = open_bundle(bundle_copy, "int8")
    result = run_mode(bundle, "int8", select_runtime("litert"))
    share = samples / bundle.attention[0].shape[0]  # every query row of a digit is valid
    # The untouched rows of the tests' digits model stay within 64 quanta
    # (its worst weight over 11 seeds: 0.12; abs=1e-3 leaves 4 of 4,096 rows).
    assert result.attention_tail_share == pytest.approx(share, abs=1e-3)
    tail = [f for f in result.failures if f.startswith("attention rows with |Δ| > 0.25")]
    assert bool(tail) == fails, result.failures
    assert result.attention_max_abs_diff > 0.9  # no whole-row bound: only the share counts


def test_a_wrong_output_scale_in_the_manifest_is_refused(bundle_copy):
    def edit(m):
        out = m["models"]["int8"]["signatures"]["view"]["outputs"]["attention_0"]
        out["scale"] *= 2

    edit_manifest(bundle_copy, edit)
    bundle = open_bundle(bundle_copy, "int8")
    with pytest.raises(UsageError, match="attention_0 differs from manifest.json: scale"):
        run_mode(bundle, "int8", select_runtime("litert"))


def test_measure_ignores_padding_rows_and_ties():
    ref = np.zeros((1, 1, 3, 3))
    ref[0, 0, 0] = [0.5, 0.5 - 1e-3, 0.0 + 1e-3]  # two keys within a tie
    ref[0, 0, 1] = [0.0, 1.0, 0.0]
    ref[0, 0, 2] = [1.0, 0.0, 0.0]  # a padding query row
    dev = ref.copy()
    dev[0, 0, 0] = [0.49, 0.51, 0.0]  # picks the tied key: agrees
    dev[0, 0, 2] = [0.0, 0.0, 1.0]  # padding: not compared
    valid = np.array([[True, True, False]])
    figures = attention_parity.measure([dev], [ref], valid, tie=1 / 256)
    assert figures.argmax_agreement == 1.0 and figures.rows == 2
    assert figures.max_abs_diff == pytest.approx(0.011)
    assert attention_parity.measure(
        [dev], [ref], None, tie=1 / 256
    ).argmax_agreement == pytest.approx(2 / 3)
    assert math.isnan(attention_parity.measure([dev * np.nan], [ref], None, 0.0).max_abs_diff)
    # The tail: valid rows with a weight off by more than `tail`.
    assert math.isnan(figures.tail_share)
    assert attention_parity.measure([dev], [ref], valid, 1 / 256, tail=0.01).tail_share == 0.5
    assert attention_parity.measure([dev], [ref], valid, 1 / 256, tail=0.012).tail_share == 0.0
    assert attention_parity.measure([dev], [ref], None, 1 / 256, tail=0.01).tail_share == 2 / 3
    # Per layer, the worst: a deeper layer's drifting rows are not diluted
    # by a clean first layer (pooled, this would be 1 of 4).
    clean = attention_parity.measure([ref, dev], [ref, ref], valid, 1 / 256, tail=0.01)
    assert clean.tail_share == 0.5 and clean.rows == 4


def test_tail_threshold_is_a_share_of_rows():
    t = AttentionThresholds(0.8, 1 / 256, tail_abs_diff=0.25, max_tail_share=0.01)
    figures = attention_parity.AttentionParity(0.9, 0.001, 0.95, rows=1000, tail_share=0.01)
    assert t.failures(figures) == []
    over = t.failures(dataclasses.replace(figures, tail_share=0.011))
    assert over == ["attention rows with |Δ| > 0.25 (worst layer): 1.1 % > 1 %"]
    unknown = t.failures(dataclasses.replace(figures, tail_share=math.nan))
    assert unknown == ["attention rows with |Δ| > 0.25 (worst layer): not counted"]
    assert "attn rows|Δ|>0.25≤1%/layer" in t.describe()
    with pytest.raises(ValueError, match="`tail_abs_diff` and `max_tail_share` come together"):
        AttentionThresholds(0.8, 1 / 256, max_tail_share=0.01)
    # Figures from before the tail bound read as unknown, not as zero.
    old = {"max_abs_diff": 0.5, "mean_abs_diff": 0.001, "argmax_agreement": 0.9, "rows": 10}
    assert math.isnan(attention_parity.AttentionParity.from_json(old).tail_share)
    # JSON allows Infinity: a row count that is not finite reads as unknown (0).
    assert attention_parity.AttentionParity.from_json({**old, "rows": math.inf}).rows == 0


@pytest.mark.parametrize("mode", ["int8", "float32"])
def test_view_page_holds_the_devices_attention(mode, digits_bundle, tmp_path):
    page = tmp_path / "view.html"
    status, out, err = run_main(
        main, [digits_bundle, "--sample", 5, "--quant", mode, "--view", page, "--runtime", "litert"]
    )
    assert status == 0, err
    data = _page_data(page)
    assert data["mode"] == mode
    bundle = open_bundle(digits_bundle, mode)
    model = EdgeModel(select_runtime("litert"), bundle.model_bytes[mode])
    model.check_manifest(bundle.manifest.models[mode])
    device = model.run_signature("view", bundle.eval.x[5:6])
    for layer, values in enumerate(data["device"]):
        expected = np.round(device[attention.output_name(layer)][0].astype(np.float64), 4)
        np.testing.assert_array_equal(np.array(values), expected)
        np.testing.assert_allclose(
            np.array(data["reference"][layer]), np.round(bundle.attention[layer][5], 4)
        )
    assert data["input"]["kind"] == "pixels" and data["tokens"][0] == "row 0"


def test_view_default_mode_is_int8(digits_bundle, tmp_path):
    page = tmp_path / "view.html"
    status, _, err = run_main(main, [digits_bundle, "--sample", 0, "--view", page])
    assert status == 0, err
    assert _page_data(page)["mode"] == "int8"


def test_text_view_opens_on_the_pronoun(text_bundle, tmp_path):
    page = tmp_path / "text.html"
    status, out, err = run_main(
        main, [text_bundle, "--text", "the dog sat it was happy", "--view", page]
    )
    assert status == 0, err
    data = _page_data(page)
    assert data["tokens"] == ["the", "dog", "sat", "it", "was", "happy"]
    assert data["initial_query"] == 3
    assert data["reference"] is None  # no Keras on the device for typed text
    assert "no float Keras reference" in " ".join(data["notes"])


def test_view_of_an_old_bundle_is_exit_2(bundle_copy, tmp_path):
    def edit(m):
        m["attention"] = None
        for entry in m["models"].values():
            entry.pop("attention", None)
            entry.pop("signatures", None)

    edit_manifest(bundle_copy, edit)
    (bundle_copy / "attention.npz").unlink()
    page = tmp_path / "v.html"
    status, _, err = run_main(main, [bundle_copy, "--sample", 0, "--view", page])
    assert status == 2
    one_error_line(err, PROG, "--view", "attention signature", "re-export")
    assert not page.exists()


@pytest.mark.parametrize(
    "argv_tail, fragment",
    [
        (["--view", "{tmp}/v.html"], "--view needs --sample"),
        (["--sample", "0", "--view", "{tmp}"], "is a directory"),
        (["--sample", "0", "--view", "{ro}/v.html"], "cannot write in"),
    ],
)
def test_view_bad_input_is_one_line(argv_tail, fragment, digits_bundle, tmp_path, read_only_dir):
    argv = [digits_bundle, *[a.format(tmp=tmp_path, ro=read_only_dir) for a in argv_tail]]
    status, _, err = run_main(main, argv)
    assert status == 2
    one_error_line(err, PROG, fragment)


def test_tflite_runtime_runs_or_reports_attention(text_bundle, app_dir, tmp_path):
    """tflite-runtime 2.14: every mode it runs has attention figures or "n/a" with a note."""
    import subprocess

    report = tmp_path / "r.json"
    proc = subprocess.run(
        [str(edge_python("tflite-runtime")), "-m", "edge_demo", str(text_bundle),
         "--runtime", "tflite-runtime", "--json", str(report)],
        cwd=app_dir, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    modes = json.loads(report.read_text())["modes"]
    for mode, result in modes.items():
        if result["skipped"]:
            continue
        assert result["attention_status"] in ("passed", "n/a"), (mode, result)
        if result["attention_status"] == "n/a":
            assert result["attention_note"] and f"{mode}: attention n/a" in proc.stdout
            assert result["passed"]  # classification still runs and passes


def test_tflite_runtime_view_page(digits_bundle, app_dir, tmp_path):
    import subprocess

    page = tmp_path / "t.html"
    device = app_dir / "bundle"
    shutil.copytree(digits_bundle, device)
    proc = subprocess.run(
        [str(edge_python("tflite-runtime")), "-m", "edge_demo", "bundle", "--runtime",
         "tflite-runtime", "--sample", "2", "--quant", "int8", "--view", str(page)],
        cwd=app_dir, capture_output=True, text=True, check=False,
    )  # fmt: skip
    shutil.rmtree(device)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = _page_data(page)
    reference = open_bundle(digits_bundle).attention[0][2]
    # int8 on another runtime: within the int8 bound of the float reference.
    assert np.abs(np.array(data["device"][0]) - np.round(reference, 4)).mean() < (
        attention_parity.DEFAULT_THRESHOLDS["int8"].max_mean_abs_diff
    )


class _NoSignatures:
    """A LiteRT interpreter whose signature runner fails, as an older runtime's may."""

    def __init__(self, **kwargs):
        from ai_edge_litert.interpreter import Interpreter

        self._inner = Interpreter(**kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def get_signature_runner(self, name):
        raise ValueError(f"SignatureDef {name!r} is not supported here")


def test_a_runtime_that_cannot_run_the_view_reports_na(digits_bundle):
    """The device: classification as before, attention "n/a" with a note; export: a failure."""
    from edge_demo.app.report import parity_table
    from keras_mha_export.entry import judge

    litert = select_runtime("litert")
    runtime = dataclasses.replace(litert, name="old-runtime", interpreter=_NoSignatures)
    bundle = open_bundle(digits_bundle, "int8")
    result = run_mode(bundle, "int8", runtime)
    reference = run_mode(bundle, "int8", litert)
    assert result.status == "passed" and result.attention_status == "n/a"
    assert "not supported here" in result.attention_note
    assert result.parity == reference.parity  # the classification figures are unchanged
    table = parity_table([result])
    assert "n/a" in table.splitlines()[2] and "int8: attention n/a:" in table
    entry, failure = judge(bundle.manifest.models["int8"], [], result, runtime.name)
    assert not entry.verified and "attention not verified" in failure.reasons[0]


def test_the_parity_table_is_narrow_unless_asked(digits_bundle):
    """The default table fits a terminal; --wide adds latency tails, memory and thresholds."""
    from edge_demo.app.report import parity_table

    bundle = open_bundle(digits_bundle, "float32,int8")
    results = [run_mode(bundle, mode, select_runtime("litert")) for mode in ("float32", "int8")]
    narrow, wide = parity_table(results), parity_table(results, wide=True)
    header = narrow.splitlines()[0].split()
    assert header[:4] == ["mode", "result", "accuracy", "agreement"] and "p50" in header
    assert "thresholds" not in header and "p99" not in header
    assert max(map(len, narrow.splitlines())) <= 120, narrow
    wide_header = wide.splitlines()[0]
    for column in ("mean|Δp|", "attn tail", "p99 µs", "peak MB", "thresholds"):
        assert column in wide_header
    assert "agree≥0.975" in wide.splitlines()[3]  # int8's row carries its thresholds
    for narrow_row, wide_row in zip(narrow.splitlines()[2:], wide.splitlines()[2:], strict=True):
        assert narrow_row.split()[:4] == wide_row.split()[:4]  # the same figures


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"argmax_tie": 0.004}, "missing field 'm.attention.thresholds.min_argmax_agreement'"),
        ({"min_argmax_agreement": 0.8, "argmax_tie": 0.004, "max": 1}, "unknown key 'max'"),
        (
            {"min_argmax_agreement": 0.8, "argmax_tie": 0.004, "max_abs_diff": None},
            "'m.attention.thresholds.max_abs_diff' must be a finite number, got None",
        ),
        ({}, "field 'm.attention.thresholds' is empty"),
        (
            {"min_argmax_agreement": 0.8, "argmax_tie": 0.004, "tail_abs_diff": 0.25},
            "'m.attention.thresholds' `tail_abs_diff` and `max_tail_share` come together",
        ),
    ],
)
def test_attention_thresholds_refuse_bad_json(raw, message):
    with pytest.raises(UsageError) as info:
        AttentionThresholds.from_json(
            Fields("manifest.json"), {"thresholds": raw}, "thresholds", "m.attention."
        )
    assert message in str(info.value)


def test_attention_thresholds_read_what_they_write():
    for mode, thresholds in DEFAULT_THRESHOLDS.items():
        again = AttentionThresholds.from_json(
            Fields("manifest.json"), {"t": thresholds.to_json()}, "t", ""
        )
        assert again == thresholds, mode
