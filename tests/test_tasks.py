"""The task interface (bundle_contract/tasks/): what each task owns, asked for,
never tested by name (tests/test_import_graph.py counts the names)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from bundle_contract import tasks
from bundle_contract.arrays import check_eval
from bundle_contract.parity import Parity
from bundle_contract.tasks.embedding import check_embedding_eval
from edge_demo.app.report import parity_table
from edge_demo.runtimes.score import ModeResult

OWN = ("check_eval", "measure", "thresholds", "describe", "figures")
ATTRIBUTES = ("name", "output", "labelled", "attention_samples", "summary")


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_every_task_implements_the_interface(name):
    task = tasks.TASKS[name]
    assert task.name == name and tasks.get(name) is task
    for method in OWN:
        assert getattr(type(task), method) is not getattr(tasks.Task, method), (name, method)
    for attribute in ATTRIBUTES:
        assert hasattr(task, attribute), (name, attribute)
    # export's summary names figures a Parity has; the device's table, a mode's result's
    from edge_demo.runtimes.score import ModeResult

    fields = {f.name for f in dataclasses.fields(Parity)}
    assert {c.field for c in task.summary} <= fields
    assert {c.field for c in task.columns} <= {f.name for f in dataclasses.fields(ModeResult)}


def test_each_task_names_device_commands_the_app_has():
    from edge_demo.app.cli import ACTIONS, build_parser

    flags = {o for action in build_parser()._actions for o in action.option_strings}
    for task in tasks.TASKS.values():
        assert set(task.commands.values()) <= set(ACTIONS), task.name
        assert set(task.commands) <= flags, task.name
    assert tasks.TASKS["pair-scoring"].commands["--rerank"] == "rank"
    assert "--text" not in tasks.TASKS["pair-scoring"].commands


def test_the_registry_looks_a_name_up_and_refuses_others():
    assert tasks.get(None) is tasks.DEFAULT is tasks.TASKS["classification"]
    for bad in ("ranking", 3, ""):
        with pytest.raises(ValueError, match="must be one of classification, embedding"):
            tasks.get(bad)


def _classification():
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], np.float32)
    return check_eval(np.zeros((3, 4), np.float32), np.array([0, 1, 1]), probs, "eval.npz")


def _embedding():
    angles = np.array([0.0, 0.3, 2.0, 3.5])
    vectors = np.stack([np.cos(angles), np.sin(angles)], 1).astype(np.float32)
    return check_embedding_eval(np.array([[5, 6, 0]] * 4, np.int32), vectors, "eval.npz")


def test_each_task_judges_its_own_outputs():
    classifier, encoder = tasks.TASKS["classification"], tasks.TASKS["embedding"]
    ev = _classification()
    flipped = ev.probs[:, ::-1].copy()
    parity = classifier.measure(flipped, ev)
    assert parity.agreement == 0.0 and parity.accuracy == pytest.approx(1 / 3)
    assert classifier.float_accuracy(ev) == pytest.approx(2 / 3)
    assert classifier.thresholds("int8", 360).min_agreement == pytest.approx(351 / 360)
    ev = _embedding()
    parity = encoder.measure(ev.probs.copy(), ev)
    assert parity.min_cosine == pytest.approx(1.0) and parity.top1 == 1.0
    assert math.isnan(parity.accuracy) and encoder.float_accuracy(ev) is None
    assert encoder.thresholds("int8", 360).min_cosine == 0.98
    assert "min" in encoder.figures(parity, None) and "agreement" in classifier.figures(
        classifier.measure(_classification().probs, _classification()), 0.5
    )


def test_the_device_table_takes_the_tasks_columns():
    result = ModeResult("float32", "passed", agreement=1.0, max_abs_diff=1e-7, min_cosine=0.9999)
    header = parity_table([result], task=tasks.TASKS["embedding"]).splitlines()[0].split()
    assert header[2:4] == ["min", "cos"] and "accuracy" not in header
    header = parity_table([result]).splitlines()[0].split()
    assert header[2:4] == ["accuracy", "agreement"] and "cos" not in header
    # a text classifier: accuracy only when its eval has labels (a fine-tuned one's)
    text = tasks.TASKS["text-classification"]
    header = parity_table([result], task=text).splitlines()[0].split()
    assert header[2] == "agreement" and "accuracy" not in header
    header = parity_table([result], task=text, labelled=True).splitlines()[0].split()
    assert header[2:4] == ["accuracy", "agreement"]


def test_the_export_table_shows_accuracy_when_the_eval_has_labels():
    """Export's summary table: the task's figures, and accuracy first when a
    text classifier's eval carries gold labels (the manifest's float_accuracy)."""
    from types import SimpleNamespace

    from keras_mha_export.summary import _figures

    def fields(task, float_accuracy):
        manifest = SimpleNamespace(
            task=tasks.TASKS[task], eval=SimpleNamespace(float_accuracy=float_accuracy)
        )
        return [c.field for c in _figures(manifest)]

    assert fields("text-classification", None) == ["agreement", "max_abs_diff"]
    assert fields("text-classification", 0.9) == ["accuracy", "agreement", "max_abs_diff"]
    assert fields("classification", 0.9) == ["agreement", "accuracy", "max_abs_diff"]  # once


def _text_eval(y=None):
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3]], np.float32)
    ids = np.array([[101, 7, 102, 0], [101, 8, 9, 102], [101, 5, 102, 0]], np.int32)
    return tasks.TASKS["text-classification"].check_eval(
        {"x": ids, "probs": probs, **({} if y is None else {"y": y})}, "eval.npz"
    )


def test_a_text_classifier_takes_held_out_labels_when_it_has_them():
    """An imported checkpoint's classifier has no labels (judged against the
    float model only); one fine-tuned on the user's labels carries its held-out
    gold labels: eval.npz's y, the manifest's float_accuracy, each mode's accuracy."""
    from bundle_contract.entries import EvalSpec
    from bundle_contract.errors import UsageError
    from bundle_contract.fields import Fields

    task = tasks.TASKS["text-classification"]
    bare, labelled = _text_eval(), _text_eval(np.array([0, 2, 2]))
    assert not bare.labelled and task.float_accuracy(bare) is None
    assert labelled.labelled and task.float_accuracy(labelled) == pytest.approx(2 / 3)
    # the same outputs: the same agreement; the labels add an accuracy
    assert math.isnan(task.measure(bare.probs, bare).accuracy)
    parity = task.measure(labelled.probs[:, [0, 2, 1]], labelled)  # rows 2 and 3 swap classes
    assert parity.agreement == pytest.approx(1 / 3) and parity.accuracy == pytest.approx(2 / 3)
    assert "accuracy 0.6667 (float 0.6667)" in task.figures(parity, 2 / 3)
    assert "accuracy" not in task.figures(parity, None)
    # The manifest says whether eval.npz holds y: the device reads it only then.
    spec = EvalSpec("eval.npz", "0" * 64, 3, (3, 4), "int32", 3, None, task.name)
    assert set(task.eval_arrays(spec)) == {"x", "probs"}
    spec = dataclasses.replace(spec, float_accuracy=2 / 3)
    assert set(task.eval_arrays(spec)) == {"x", "probs", "y"}
    fields = Fields("manifest.json")
    assert task.read_accuracy(fields, {"float_accuracy": 0.5}) == 0.5
    assert task.read_accuracy(fields, {}) is None
    with pytest.raises(UsageError, match="float_accuracy.*finite number"):
        task.read_accuracy(fields, {"float_accuracy": "high"})
    for y, fragment in (
        (np.array([0, 3, 1]), "y has labels outside 0..2"),
        (np.array([0, 1]), r"y must be integer labels of shape \[3\]"),
        (np.array([0.0, 1.0, 1.0]), "y must be integer labels"),
    ):
        with pytest.raises(UsageError, match=fragment):
            _text_eval(y)


# --- a new task is one module: one written here, in the test, and nothing else ---


def _example_task():
    """A task this test defines (what a new task's module holds): a model that
    gives one value per sample, judged by its largest difference."""
    from bundle_contract.arrays import EvalData, check_inputs
    from bundle_contract.errors import UsageError
    from bundle_contract.parity import Thresholds
    from bundle_contract.tasks import Column, Task, register

    @register
    class Regression(Task):
        name = "example-regression"
        output = "values"
        labelled = False
        classes = False
        attention_samples = 0
        min_outputs = 1
        commands = {}  # the device runs its parity run only
        columns = (Column("max|Δ|", "max_abs_diff", ".2e"),)
        summary = (Column("max|Δ|", "max_abs_diff", ".2g"),)
        drops = ("accuracy", "agreement", "max|Δp|", "mean|Δp|", "attn max|Δ|", "attn agree")

        def check_eval(self, arrays, where, pad_id=0):
            x, values = arrays["x"], arrays[self.output]
            check_inputs(x, where, "x")
            if values.shape != (len(x), 1):
                raise UsageError(f"values must be [{len(x)}, 1], got {values.shape}", where)
            return EvalData(x, np.zeros(len(x), np.int64), values, labelled=False)

        def measure(self, outputs, evaluation):
            diff = np.abs(np.asarray(outputs, np.float64) - evaluation.probs)
            return Parity(math.nan, math.nan, float(diff.max()), float(diff.mean()))

        def thresholds(self, mode, samples):
            return Thresholds(max_abs_diff=1e-5)

        def describe(self, num_classes, float_accuracy, max_length):
            return "one value per sample"

        def figures(self, parity, float_accuracy):
            return f"max|Δ| {parity.max_abs_diff:.2g}"

    return Regression


@pytest.fixture
def example_task():
    task = _example_task()
    yield task
    tasks.unregister(task.name)


def _example_bundle(root, task, values_from_model: bool = True):
    """A bundle of `task` written with the contract's own classes: a converted
    y = x w model (float32), eval.npz and manifest.json."""
    import tensorflow as tf

    from bundle_contract.entries import EvalSpec, ModelEntry
    from bundle_contract.files import sha256_file
    from bundle_contract.manifest import Manifest
    from bundle_contract.parity import Parity as Figures
    from bundle_contract.tensors import TensorSpec

    w = tf.constant(np.arange(1, 5, dtype=np.float32).reshape(4, 1))
    fn = tf.function(lambda x: tf.matmul(x, w), input_signature=[tf.TensorSpec([1, 4])])
    model = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()]).convert()
    root.mkdir()
    (root / "model_float32.tflite").write_bytes(model)
    x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    values = x @ np.arange(1, 5, dtype=np.float32)[:, None]
    np.savez(root / "eval.npz", x=x, values=values if values_from_model else values + 0.5)
    entry = ModelEntry(
        mode="float32",
        file="model_float32.tflite",
        sha256=sha256_file(root / "model_float32.tflite"),
        bytes=len(model),
        input=TensorSpec("x", (1, 4), "float32", None, None),
        output=TensorSpec("y", (1, 1), "float32", None, None),
        thresholds=tasks.get(task.name).thresholds("float32", 6),
        runtimes={"ai-edge-litert": True},
        verified=True,
        parity=Figures(math.nan, math.nan, 0.0, 0.0),
        ops={"FULLY_CONNECTED": 1},
    )
    spec = EvalSpec(
        "eval.npz", sha256_file(root / "eval.npz"), 6, (6, 4), "float32", 1, None, task.name
    )
    Manifest(eval=spec, models={"float32": entry}).write(root)
    return root


@pytest.mark.slow  # converts a (tiny) model
def test_a_new_task_is_one_module(example_task, tmp_path, capsys):
    """A task defined and registered in this test alone: its bundle is read,
    checked and run by the device, judged by the task's own measure and
    thresholds, reported in its own columns, and summarized as export does.
    Nothing else of the contract, export or the device knows it."""
    from bundle_contract.bundle import open_bundle
    from edge_demo.app.cli import main
    from keras_mha_export.summary import summary_table

    assert tasks.get("example-regression").name == "example-regression"
    bundle = _example_bundle(tmp_path / "bundle", example_task)
    opened = open_bundle(bundle, None)
    assert type(opened.task) is example_task and opened.eval.probs.shape == (6, 1)
    assert "max|Δ|" in summary_table(opened.manifest)
    assert main([str(bundle), "--runtime", "litert"]) == 0
    out = capsys.readouterr().out
    assert "one value per sample" in out and "PASS: 1 of 1" in out
    row = next(line for line in out.splitlines() if line.startswith("float32"))
    assert float(row.split()[2]) < 1e-5  # its max|Δ| column, from its measure
    # the same bundle whose float values are off by 0.5: its thresholds fail it
    broken = _example_bundle(tmp_path / "broken", example_task, values_from_model=False)
    assert main([str(broken), "--runtime", "litert"]) == 1
    assert "max|Δ|" in capsys.readouterr().out
    # the device takes the commands the task names, and no other
    assert main([str(bundle), "--runtime", "litert", "--sample", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--sample: a example-regression bundle takes only the parity run" in err
