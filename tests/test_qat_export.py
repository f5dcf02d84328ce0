"""The int8 export takes keras_mha.qat's ranges, and its int8 matches the rounded model.

A small classifier, its points' ranges chosen on calibration inputs, is
written to a SavedModel with the ranges attached (FakeQuant ops) and
converted to full int8: every point's range becomes its tensor's int8
scale and zero point (a ReLU's input excepted: TFLite fuses the ReLU into
the layer before it, and the point is not made). Both implementations: the
lesson's per-head graph gives each head's tensors their own ranges.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from export_checks import litert_outputs

from keras_mha import ModelConfig, build_classifier, qat

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="the TFLite export runs on TensorFlow"
)

CONFIG = dict(d_model=16, num_heads=2, ff_dim=32, num_layers=2, num_classes=3, dropout=0.0)


@pytest.fixture(scope="module", params=["fused", "per_head"])
def converted(request, tmp_path_factory):
    from keras_mha_export.convert import convert, write_saved_model
    from keras_mha_export.graph import read_graph

    keras.utils.set_random_seed(0)
    model = build_classifier(ModelConfig(**CONFIG, implementation=request.param))
    rng = np.random.default_rng(0)
    calibration = rng.standard_normal((64, 8, 8)).astype("float32")
    x = rng.standard_normal((40, 8, 8)).astype("float32")
    ranges = qat.choose_ranges(qat.record(model, calibration), "minmax")
    scratch = tmp_path_factory.mktemp("qat")
    qat.attach(model, ranges)
    try:
        write_saved_model(model, scratch / "saved")
        rounded = keras.ops.convert_to_numpy(model(x, training=False))
    finally:
        qat.detach(model)
    floated = keras.ops.convert_to_numpy(model(x, training=False))
    tflite = convert(scratch / "saved", "int8", calibration)
    (scratch / "model.tflite").write_bytes(tflite)
    int8, _, _ = litert_outputs(scratch / "model.tflite", x)
    return {
        "implementation": request.param,
        "ranges": ranges,
        "graph": read_graph(tflite),
        "int8": int8,
        "rounded": rounded,
        "floated": floated,
    }


def test_every_range_is_a_tensor_scale_of_the_int8_file(converted):
    graph = converted["graph"]
    found = [
        (t.scales[0], int(t.zero_points[0]))
        for t in graph.tensors
        if t.dtype == "int8" and len(t.scales) == 1
    ]
    names = {key.rsplit("/", 1)[1] for key in converted["ranges"]}
    if converted["implementation"] == "per_head":  # each head its own
        assert {"query_0", "query_1", "key_1", "value_0", "scores_1", "heads"} <= names
        assert "query" not in names and "scores" not in names and "heads_0" not in names
    else:
        assert {"query", "key", "value", "scores", "heads"} <= names
    missing = []
    for key, (low, high) in converted["ranges"].items():
        low, high = qat.nudge(low, high)
        scale = (high - low) / 255
        zero_point = int(round(-low / scale)) - 128
        # the file stores the scale as a float32
        if not any(abs(s / scale - 1) < 1e-6 and z == zero_point for s, z in found):
            missing.append(key)
    assert not missing, f"{len(missing)} of {len(converted['ranges'])} ranges not in the file"


def test_int8_gap_to_the_model_with_its_rounding(converted):
    """The gap docs/quantization.md states: the points leave the int8 input,
    the weights and the tensors between them to the converter, so the int8
    file is about as far from the rounded model as from the float one
    (measured 0.026 and 0.015 fused, 0.024 and 0.026 per head, on this
    untrained model). Fused, it picks the rounded model's class on all 40
    inputs. Per head, 2 of the 40 change class: this untrained model's top
    two probabilities are 0.005 and 0.042 apart there, and a gap of 0.024
    moves each, so no class check beyond the gap says more."""
    int8, rounded, floated = converted["int8"], converted["rounded"], converted["floated"]
    assert np.abs(int8 - rounded).max() < 0.05
    assert np.abs(rounded - floated).max() > 1e-3  # the rounding does something
    if converted["implementation"] == "fused":
        assert (int8.argmax(-1) == rounded.argmax(-1)).all()
