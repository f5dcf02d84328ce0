"""The contract's arithmetic and files: quantize, parity, thresholds, atomic writes, arrays."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bundle_contract.arrays import check_eval, check_inputs
from bundle_contract.errors import UsageError
from bundle_contract.files import inside, read_inside, tflite_problem, write_json_atomic
from bundle_contract.manifest import MODES
from bundle_contract.parity import (
    Parity,
    Thresholds,
    changes_allowed,
    default_thresholds,
    measure,
    quantized_thresholds,
)
from bundle_contract.tensors import TensorSpec


def spec(dtype: str, scale=None, zero_point=None) -> TensorSpec:
    return TensorSpec("t", (1, 3), dtype, scale, zero_point)


# --- quantize / dequantize --------------------------------------------------------


def test_quantize_known_values_round_half_away_from_zero():
    x = np.array([0.0, 0.25, -0.25, 0.75, 1.0, -1.0, 100.0, -100.0], np.float32)
    q = spec("int8", 0.5, 3).quantize(x)
    # x / 0.5 = 0, 0.5, -0.5, 1.5, 2, -2, 200, -200 -> round half away -> + 3 -> clip
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, [3, 4, 2, 5, 5, 1, 127, -128])


def test_quantize_int16_and_uint8_clip_to_their_ranges():
    x = np.array([-2.0, 0.0, 2.0], np.float32)
    np.testing.assert_array_equal(spec("int16", 1e-5, 0).quantize(x), [-32768, 0, 32767])
    np.testing.assert_array_equal(spec("uint8", 0.01, 128).quantize(x), [0, 128, 255])


@pytest.mark.parametrize(
    "scale,zero_point,dtype",
    [(1 / 255, -128, "int8"), (3.0518509e-05, 0, "int16"), (0.02, 7, "int8")],
    ids=["int8-digits-input", "int16-symmetric", "int8-odd-zero-point"],
)
def test_dequantize_inverts_quantize_within_half_a_step(scale, zero_point, dtype):
    tensor = spec(dtype, scale, zero_point)
    x = np.linspace(0.0, 1.0, 101, dtype=np.float32)
    back = tensor.dequantize(tensor.quantize(x))
    assert back.dtype == np.float32
    assert np.abs(back - x).max() <= scale / 2 + 1e-7


def test_dequantize_int8_softmax_output():
    q = np.array([-128, 0, 127], np.int8)
    np.testing.assert_allclose(spec("int8", 1 / 256, -128).dequantize(q), [0.0, 0.5, 255 / 256])


def test_unquantized_tensors_cast_floats_and_ids_and_refuse_floats_as_ids():
    assert spec("float32").quantize(np.zeros((1, 8, 8), np.float64)).dtype == np.float32
    ids = spec("int32").quantize(np.array([[2, 3, 0]], np.int64))
    assert ids.dtype == np.int32 and ids.tolist() == [[2, 3, 0]]
    with pytest.raises(ValueError, match="takes ids"):
        spec("int32").quantize(np.zeros((1, 3), np.float32))


def test_tensor_spec_from_interpreter_detail_and_differences():
    detail = {"name": "x", "shape": np.array([1, 3]), "dtype": np.int8, "quantization": (0.5, 1)}
    actual = TensorSpec.from_detail(detail)
    assert actual == TensorSpec("x", (1, 3), "int8", 0.5, 1)
    ids = {"name": "x", "shape": [1, 3], "dtype": np.int32, "quantization": (0.0, 0)}
    assert TensorSpec.from_detail(ids).scale is None
    assert actual.differences(TensorSpec("other name", (1, 3), "int8", 0.5, 1)) == []
    assert actual.differences(TensorSpec("x", (1, 4), "int8", 0.25, 1)) == [
        "shape [1, 3] vs [1, 4]",
        "scale 0.5 vs 0.25",
    ]


# --- parity and thresholds ----------------------------------------------------------


def test_measure_figures_and_nan_outputs():
    reference = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    probs = np.array([[0.8, 0.2], [0.3, 0.7], [0.3, 0.7]])
    figures = measure(probs, np.array([0, 1, 1]), reference)
    assert figures.accuracy == 1.0 and figures.agreement == pytest.approx(2 / 3)
    assert figures.max_abs_diff == pytest.approx(0.3) and figures.mean_abs_diff == pytest.approx(
        (0.1 + 0.1 + 0.1 + 0.1 + 0.3 + 0.3) / 6
    )
    probs[0, 0] = np.nan  # argmax would call this row class 0 and "agree"
    nan = measure(probs, np.array([0, 1, 1]), reference)
    assert all(math.isnan(v) for v in (nan.accuracy, nan.agreement, nan.max_abs_diff))


def test_thresholds_pass_fail_and_nan():
    quantized = default_thresholds("int8", 360)  # at most 9 of 360 predictions changed
    assert quantized.failures(Parity(0.975, 351 / 360, 0.1, 0.01), float_accuracy=0.978) == []
    failures = quantized.failures(Parity(0.95, 350 / 360, 0.1, 0.01), float_accuracy=0.978)
    assert len(failures) == 2 and "agreement 0.9722 < 0.9750" in failures[0]
    assert "0.0280 below the float 0.9780 (> 0.0250)" in failures[1]
    float32 = Thresholds(max_abs_diff=1e-5)
    assert float32.failures(Parity(1, 1, 5e-6, 0), 1) == []
    assert float32.failures(Parity(1, 1, 2e-5, 0), 1) != []
    nan = Parity(math.nan, math.nan, math.nan, math.nan)
    for mode in MODES:  # NaN fails every mode's thresholds
        assert default_thresholds(mode, 360).failures(nan, 0.9), mode
    # 359/360 agreement is exactly the kind of ratio that must not fail on rounding
    assert Thresholds(min_agreement=359 / 360).failures(Parity(1, 359 / 360, 0, 0), 1) == []


def _binomial_tail(n: int, p: float, k: int) -> float:
    """P(Binomial(n, p) > k), summed directly (independent of the code under test)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1, n + 1))


@pytest.mark.parametrize("samples", [1, 10, 100, 360, 500])
def test_changes_allowed_is_the_binomial_99th_percentile(samples):
    k = changes_allowed(samples)
    assert _binomial_tail(samples, 0.01, k) <= 0.01
    if k > 0:  # and the smallest such count
        assert _binomial_tail(samples, 0.01, k - 1) > 0.01


def test_quantized_thresholds_scale_with_the_eval_set():
    assert [changes_allowed(n) for n in (1, 10, 100, 360, 1500)] == [0, 1, 4, 9, 25]
    assert quantized_thresholds(360) == Thresholds(min_agreement=0.975, max_accuracy_drop=0.025)
    # More samples resolve the 1 % rate better: the floor climbs towards 0.99.
    floors = [quantized_thresholds(n).min_agreement for n in (100, 360, 1500, 10_000, 200_000)]
    assert floors == sorted(floors) and 0.96 <= floors[0] and floors[-1] < 0.99
    assert 0.989 < floors[-1]  # no overflow for a large eval set
    for mode in ("dynamic", "int8", "int16x8"):
        assert default_thresholds(mode, 360) == quantized_thresholds(360)
    assert default_thresholds("float16", 360) == Thresholds(max_abs_diff=1e-2)
    with pytest.raises(ValueError, match="unknown mode 'int4'"):
        default_thresholds("int4", 360)
    with pytest.raises(ValueError, match="samples must be at least 1"):
        changes_allowed(0)


def test_nine_changed_digits_pass_and_ten_fail():
    """Through `measure`: 360 samples, the float model right on all of them."""
    y = np.arange(360) % 10
    reference = np.eye(10)[y]
    for changed, passes in ((9, True), (10, False)):
        probs = reference.copy()
        probs[:changed] = np.roll(probs[:changed], 1, axis=-1)
        parity = measure(probs, y, reference)
        assert parity.agreement == pytest.approx(1 - changed / 360)
        failures = default_thresholds("int8", 360).failures(parity, float_accuracy=1.0)
        assert (failures == []) is passes, failures


def test_thresholds_json_round_trip_and_description():
    for mode in MODES:
        thresholds = default_thresholds(mode, 360)
        assert Thresholds(**thresholds.to_json()) == thresholds
    assert default_thresholds("int8", 360).describe() == "agree≥0.975, drop≤0.025"
    # 1,500 pronouns allow 25 changes: 0.983333.. shown to four digits.
    assert default_thresholds("int8", 1500).describe() == "agree≥0.9833, drop≤0.01667"
    assert Parity(1.0, 1.0, math.nan, 0.0).to_json()["max_abs_diff"] is None


# --- files ---------------------------------------------------------------------------


def test_write_json_atomic_replaces_or_leaves_the_old_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(ValueError):
        write_json_atomic(target, {"a": math.nan})  # not JSON: the old file stays
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    assert target.stat().st_mode & 0o044  # readable like a normal file, not mkstemp's 0600


def test_inside_refuses_links_and_other_kinds(tmp_path):
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "model.tflite").write_bytes(b"data")
    (tmp_path / "outside.tflite").write_bytes(b"data")
    (root / "link.tflite").symlink_to(tmp_path / "outside.tflite")
    (root / "inner.tflite").symlink_to(root / "model.tflite")
    (root / "dir").mkdir()
    assert read_inside(root, "model.tflite") == b"data"
    for name in ("link.tflite", "inner.tflite"):  # even a link into the bundle
        with pytest.raises(UsageError, match="is a symbolic link"):
            inside(root, name)
    with pytest.raises(UsageError, match="not a regular file"):
        inside(root, "dir")
    with pytest.raises(UsageError, match="not found"):
        inside(root, "missing.tflite")
    with pytest.raises(UsageError, match="does not match manifest.json"):
        read_inside(root, "model.tflite", sha256="0" * 64)


def _flatbuffer(root: int = 16, size: int = 64) -> bytearray:
    """A minimal buffer with a TFL3 identifier, a root table and a 4-byte vtable."""
    data = bytearray(size)
    data[0:4] = root.to_bytes(4, "little")
    data[4:8] = b"TFL3"
    data[8:12] = (4).to_bytes(2, "little") + (8).to_bytes(2, "little")  # vtable at 8
    data[root : root + 4] = (root - 8).to_bytes(4, "little", signed=True)
    return data


def test_tflite_problem_checks_identifier_and_offsets():
    assert tflite_problem(bytes(_flatbuffer())) is None
    assert "too short" in tflite_problem(b"\x00" * 10)
    wrong = _flatbuffer()
    wrong[4:8] = b"TFL2"
    assert "file identifier b'TFL2'" in tflite_problem(bytes(wrong))
    outside = _flatbuffer()
    outside[0:4] = (10_000).to_bytes(4, "little")
    assert "root table offset 10000" in tflite_problem(bytes(outside))
    bad_vtable = _flatbuffer()
    bad_vtable[16:20] = (-5000).to_bytes(4, "little", signed=True)
    assert "vtable offset" in tflite_problem(bytes(bad_vtable))


# --- eval.npz and calibration arrays -----------------------------------------------------


def _eval(n: int = 6, c: int = 3):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(n, c))
    probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    return rng.random((n, 4, 2)).astype(np.float32), probs.argmax(-1).astype(np.int32), probs


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x, y, p: (x, y, p * 3), "probs rows must sum to 1 (softmax outputs); row "),
        (lambda x, y, p: (x, y, np.log(p)), "probs has negative values"),
        (lambda x, y, p: (x, y, np.where(p > 0.5, np.nan, p)), "probs has NaN or infinite"),
        (lambda x, y, p: (x, y, p[:, :1]), "probs must be float (N, classes >= 2)"),
        (lambda x, y, p: (x, y, p[:4]), "probs must be float of shape [6, classes]"),
        (lambda x, y, p: (x, y + 3, p), "y has labels outside 0..2"),
        (lambda x, y, p: (x, y.astype(np.float32), p), "y must be integer labels of shape [6]"),
        (lambda x, y, p: (np.full_like(x, np.nan), y, p), "x is all NaN or infinite"),
        (lambda x, y, p: (x[:0], y, p), "x must be a non-empty batch"),
    ],
    ids=[
        "times-3",
        "log-probs",
        "nan-probs",
        "one-class",
        "rows",
        "labels",
        "y-float",
        "x-nan",
        "empty",
    ],
)
def test_check_eval_refuses(change, message):
    x, y, probs = change(*_eval())
    with pytest.raises(UsageError) as info:
        check_eval(x, y, probs, "run/eval.npz")
    assert str(info.value).startswith("run/eval.npz: ") and message in str(info.value)


def test_check_eval_and_inputs_accept_what_a_model_writes():
    x, y, probs = _eval()
    ev = check_eval(x, y, probs, "eval.npz")
    assert ev.y.dtype == np.int64 and ev.num_classes == 3 and ev.float_accuracy == 1.0
    check_inputs(x, "calibration.npz", sample_shape=(4, 2), dtype="float32")
    with pytest.raises(
        UsageError, match=r"x is float32 \[6, 4, 2\] but the model takes float32 \(N, 4, 3\)"
    ):
        check_inputs(x, "calibration.npz", sample_shape=(4, 3), dtype="float32")
    x[0, 0, 0] = np.inf
    with pytest.raises(UsageError, match="x has 1 NaN or infinite value"):
        check_inputs(x, "calibration.npz")


def test_parity_figures_read_leniently():
    """Figures are informative: a malformed entry reads as None, null as NaN, never a crash."""
    from bundle_contract.attention_parity import AttentionParity

    parity = Parity(0.98, 1.0, math.nan, 0.004)
    again = Parity.from_json(parity.to_json())
    assert again.accuracy == 0.98 and again.agreement == 1.0 and math.isnan(again.max_abs_diff)
    for bad in (None, [0.9], {"accuracy": "0.9"}, {"accuracy": True}):
        assert Parity.from_json(bad) is None, bad
    attention = AttentionParity(0.1, 0.004, 0.97, 4096)
    assert AttentionParity.from_json(attention.to_json()) == attention
    missing = AttentionParity.from_json({"max_abs_diff": 0.1})
    assert missing.rows == 0 and math.isnan(missing.argmax_agreement)
    assert AttentionParity.from_json({"rows": "many"}) is None
