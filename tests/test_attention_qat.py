"""Quantization-aware models (keras_mha.qat) on every Keras backend.

The points of our layers change nothing until a hook is attached; recorded,
they give a range per tensor; attached, every point rounds to 256 steps of
its range and the model still trains (a straight-through gradient). The
main run covers TensorFlow; tests/keras_suite/run.py runs this file in
.venv-jax and .venv-torch. tests/test_qat_export.py checks that the int8
TFLite export takes the ranges.
"""

from __future__ import annotations

import dataclasses
import json

import keras
import numpy as np
import pytest

from keras_mha import ModelConfig, build_classifier, qat
from keras_mha.qat import points as qat_points

CONFIG = ModelConfig(d_model=16, num_heads=2, ff_dim=16, num_layers=2, num_classes=3, dropout=0.0)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8, 8)).astype("float32")
    y = (x[:, :, 0].mean(-1) > 0).astype("int32") + (x[:, :, 1].mean(-1) > 0.3)
    return x, y.astype("int32")


@pytest.fixture()
def model():
    keras.utils.set_random_seed(0)
    return build_classifier(CONFIG)


def _predict(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def test_points_change_nothing_until_a_hook_is_attached(model, data):
    x, _ = data
    before = _predict(model, x)
    recorder = qat.record(model, x[:4])
    after = _predict(model, x)
    np.testing.assert_array_equal(before, after)  # record() detaches
    names = {key.rsplit("/", 1)[1] for key in recorder.low}
    # every kind of point of the block, the attention and the LayerNorms
    assert {"query", "key", "value", "scores", "weights", "heads"} <= names
    assert {"output", "attention_sum", "ffn_hidden", "ffn", "ffn_sum"} <= names
    assert "ffn_pre" not in names  # a ReLU's input: TFLite fuses the ReLU, no tensor of its own
    assert {"mean", "centred", "variance", "inverse_std", "normalized"} <= names
    blocks = {key.split("/")[0] for key in recorder.low}
    assert len(blocks) == 2  # both blocks, each under its own path


def test_batched_recording_gives_what_one_row_a_call_gives(model, data):
    """record() runs 64 rows a call and hands the recorder each row's values in
    the order the points ran: over 70 rows (two calls) every point's min, max
    and kept values are those of a recorder hooked to one row a call (each
    row's values here are fewer than a call's sample, so all are kept)."""
    x = np.concatenate([data[0], data[0][:6]])  # 70 rows
    batched = qat.record(model, x)
    alone = qat_points.Recorder(0)
    qat_points._set_hook(model, alone)
    try:
        for row in x:
            model(row[None], training=False)
    finally:
        qat.detach(model)
    assert list(batched.samples) == list(alone.samples)  # the same points, in the same order
    for key in alone.low:
        np.testing.assert_allclose(batched.low[key], alone.low[key], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(batched.high[key], alone.high[key], rtol=1e-5, atol=1e-6)
        (got, got_w), (want, want_w) = batched.values(key), alone.values(key)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got_w, want_w)


def test_ranges_by_rule(model, data):
    x, _ = data
    recorder = qat.record(model, x[:16])
    by_rule = {rule: qat.choose_ranges(recorder, rule) for rule in qat.RULES}
    for key, (low, high) in by_rule["minmax"].items():
        if key.endswith("/weights"):
            assert (low, high) == qat.SOFTMAX_RANGE  # TFLite's fixed softmax output
            continue
        # TFLite's range: as wide as what was seen (with 0), shifted so 0 is a step
        assert high - low == pytest.approx(
            max(recorder.high[key], 0) - min(recorder.low[key], 0), rel=1e-6
        )
        step = (high - low) / 255
        assert low / step == pytest.approx(round(low / step), abs=1e-6)
    for key in by_rule["minmax"]:
        if key.endswith("/weights"):
            continue
        values, weights = recorder.values(key)
        errors = {
            rule: np.average(
                (qat.rounded(values, *by_rule[rule][key]) - values) ** 2, weights=weights
            )
            for rule in ("minmax", "mse")
        }
        assert errors["mse"] <= errors["minmax"] + 1e-12  # mse searches minmax's range too


def test_a_point_names_its_head():
    """`point(layer, name, x, i)` is head i's own point, `name_i` (the
    names ranges.json keys on); without a head index it is `name`."""
    from keras_mha import MultiHeadAttention

    layer = MultiHeadAttention(num_heads=2, name="mha")
    x = np.ones((1, 3, 4), "float32")
    layer(x)  # built: its path is its name
    assert qat.point(layer, "scores", x, 0) is x  # no hook: the float model
    seen = []
    object.__setattr__(layer, qat.HOOK, lambda key, y: seen.append(key) or y)
    qat.point(layer, "scores", x, 0)
    qat.point(layer, "query", x, 1)
    qat.point(layer, "scores", x)
    assert seen == ["mha/scores_0", "mha/query_1", "mha/scores"]


def test_mse_range_from_the_weighted_sample_is_the_best_on_all_values():
    """Student's t (4 degrees of freedom), 100,000 values: a few far out, as
    after a GELU. The recorder keeps 1 % of the tail and 4,096 others; the
    range it picks is as good, on all the values, as the best one found
    with all of them."""
    values = np.random.default_rng(0).standard_t(4, 100_000)
    recorder = qat.Recorder()
    recorder("x/y", values)
    assert recorder.values("x/y")[0].size == 1000 + 4096
    low, high = qat.choose_ranges(recorder, "mse")["x/y"]

    def error(lo, hi):
        return np.mean((qat.rounded(values, lo, hi) - values) ** 2)

    best = min(error(c * values.min(), c * values.max()) for c in np.linspace(0.2, 1, 81))
    assert error(low, high) <= 1.05 * best
    assert error(low, high) < error(values.min(), values.max())
    assert high - low < values.max() - values.min()  # the tail is clipped


def test_attached_points_round_to_their_grid(model, data):
    x, _ = data
    ranges = qat.choose_ranges(qat.record(model, x[:16]), "minmax")
    # One block's attention output, rounded: it sits on its range's grid.
    key = next(k for k in ranges if k.endswith("attention/output"))
    qat.attach(model, ranges)
    try:
        seen = {}

        class Spy(qat_points._Rounder):
            def __call__(self, name, value):
                out = super().__call__(name, value)
                if name == key:
                    seen["out"] = keras.ops.convert_to_numpy(out)
                return out

        qat_points._set_hook(model, Spy(ranges))
        rounded = _predict(model, x[:8])
    finally:
        qat.detach(model)
    low, high = qat.nudge(*ranges[key])
    steps = (seen["out"] - low) / ((high - low) / 255)
    np.testing.assert_allclose(steps, np.round(steps), atol=2e-3)
    assert np.unique(np.round(steps)).size > 20  # not collapsed to a few values
    floated = _predict(model, x[:8])
    assert 0 < np.abs(rounded - floated).max() < 0.2  # rounding moves the output, a little


def test_training_with_rounding_lowers_the_loss_on_this_backend(model, data, figure):
    x, y = data
    ranges = qat.choose_ranges(qat.record(model, x[:32]), "mse")
    qat.attach(model, ranges)
    try:
        model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
        history = model.fit(x, y, epochs=6, batch_size=16, verbose=0)
    finally:
        qat.detach(model)
    loss = history.history["loss"]
    assert np.isfinite(loss).all()
    # The straight-through gradient trains it: a separable target, 6 epochs
    # of Adam 1e-2 from log(3) (measured: 0.18 of the start on TF, 0.32 on JAX, 0.17 on torch).
    assert figure("loss last/first", loss[-1] / loss[0], "< 0.8") < 0.8


def test_ranges_file_round_trips_and_bad_ones_are_refused(model, data, tmp_path):
    x, _ = data
    ranges = qat.choose_ranges(qat.record(model, x[:8]), "minmax")
    path = tmp_path / "ranges.json"
    qat.save_ranges(ranges, path, rule="minmax")
    loaded = qat.load_ranges(path)
    assert loaded.keys() == ranges.keys()
    np.testing.assert_allclose([loaded[k] for k in ranges], [ranges[k] for k in ranges])
    assert json.loads(path.read_text())["rule"] == "minmax"
    assert not list(tmp_path.glob("*.tmp"))
    qat.attach(model, qat.load_ranges(path))
    qat.detach(model)
    bad = tmp_path / "bad.json"
    for body in ("{", '{"ranges": {"a/b": [1.0, 2.0]}}', '{"ranges": {"a/b": ["x", 1]}}', "[]"):
        bad.write_text(body)
        with pytest.raises(ValueError, match="not a ranges file") as error:
            qat.load_ranges(bad)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="name no layer of this model"):
        qat.attach(model, {"no_such_layer/query": (-1.0, 1.0)})


def test_predict_follows_attach_and_detach(model, data):
    """`predict` keeps the function it traced: attach and detach drop it."""
    x, _ = data
    floated = model.predict(x, verbose=0)
    ranges = qat.choose_ranges(qat.record(model, x[:16]), "minmax")
    qat.attach(model, ranges)
    rounded = model.predict(x, verbose=0)
    qat.detach(model)
    again = model.predict(x, verbose=0)
    assert np.abs(rounded - floated).max() > 1e-4
    np.testing.assert_allclose(again, floated, atol=1e-6)


def test_the_lessons_per_head_graph_rounds_each_head_on_its_own(data):
    """implementation="per_head" keeps the lesson's path with a hook on: each
    head's projections, scores, masked scores and softmax get their own
    points (the softmax's the fixed TFLite range), the concatenation one."""
    x, _ = data
    keras.utils.set_random_seed(0)
    model = build_classifier(dataclasses.replace(CONFIG, implementation="per_head"))
    recorder = qat.record(model, x[:8])
    names = {key.rsplit("/", 1)[1] for key in recorder.low}
    per_head = {
        f"{kind}_{i}" for kind in ("query", "key", "value", "scores", "weights") for i in (0, 1)
    }
    assert per_head <= names and {"heads", "output"} <= names
    assert not {"query", "scores", "weights"} & names  # the fused graph's names
    ranges = qat.choose_ranges(recorder, "minmax")
    weights = {k: v for k, v in ranges.items() if k.rsplit("/", 1)[1].startswith("weights_")}
    assert len(weights) == 4 and set(weights.values()) == {qat.SOFTMAX_RANGE}
    # each head's scores span their own values, not one range for all
    scores = [ranges[f"transformer_layer_0/attention/scores_{i}"] for i in (0, 1)]
    assert scores[0] != scores[1]
    before = _predict(model, x)
    qat.attach(model, ranges)
    rounded = _predict(model, x)
    qat.detach(model)
    assert 1e-4 < np.abs(rounded - before).max() < 0.1
    np.testing.assert_array_equal(_predict(model, x), before)


def test_ranges_of_the_fused_graph_name_no_point_of_the_per_head_one(model, data):
    x, _ = data
    ranges = qat.choose_ranges(qat.record(model, x[:8]), "minmax")
    assert qat.unused_ranges(model, ranges, x[:1]) == []
    per_head = build_classifier(dataclasses.replace(CONFIG, implementation="per_head"))
    per_head.set_weights(model.get_weights())
    before = _predict(per_head, x)
    unused = qat.unused_ranges(per_head, ranges, x[:1])
    names = {key.rsplit("/", 1)[1] for key in unused}
    # the per-head graph's heads (their concatenation) and output keep theirs
    assert names == {"query", "key", "value", "scores", "weights"}, names
    np.testing.assert_array_equal(_predict(per_head, x), before)  # detached again
    qat.attach(per_head, ranges)  # (what a hook left attached would give: rounded)
    assert np.abs(_predict(per_head, x) - before).max() > 1e-4
    qat.detach(per_head)


def test_per_head_points_with_the_gate_and_a_head_mask(data):
    """The lesson's options under a hook: the gate's logits are each head's
    own point (gate_i); the concatenation's point comes after the gate and
    the head mask, where the per-head graph concatenates; a silenced head
    stays silenced with rounding."""
    from keras_mha import MultiHeadAttention

    x, _ = data
    keras.utils.set_random_seed(0)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, use_gate=True, implementation="per_head")
    inputs = keras.Input((8, 8))
    model = keras.Model(inputs, layer(inputs, inputs, head_mask=np.array([1.0, 0.0])))
    recorder = qat.record(model, x[:8])
    names = {key.rsplit("/", 1)[1] for key in recorder.low}
    assert {"gate_0", "gate_1", "query_1", "scores_0", "heads", "output"} <= names
    ranges = qat.choose_ranges(recorder, "minmax")
    qat.attach(model, ranges)
    try:
        concat = layer.concat_heads(x[:4], x[:4], head_mask=np.array([1.0, 0.0]))
    finally:
        qat.detach(model)
    concat = keras.ops.convert_to_numpy(concat)
    low, high = ranges[f"{layer.path}/heads"]
    steps = (concat - low) / ((high - low) / 255)  # rounded: whole steps of its range
    assert np.abs(steps - np.round(steps)).max() < 1e-3 and steps.min() > -1e-3
    assert np.abs(concat[..., 4:]).max() == 0.0  # head 1 silenced: its columns, rounded, stay 0
