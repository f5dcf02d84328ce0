"""One mode's manifest entry: converted and its graph checked, then judged by the device's score.

`convert_mode` converts the batch-1 SavedModel into the staging directory and
describes the file as a `ModelEntry` (tensors read from the flatbuffer; the
device's wrapper later checks them against the interpreter's). `judge` folds
the graph problems and the device's `ModeResult` into the entry's verdict.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time

import numpy as np

from bundle_contract.attention import AttentionCheck
from bundle_contract.attention_parity import DEFAULT_THRESHOLDS as ATTENTION_THRESHOLDS
from bundle_contract.attention_parity import AttentionThresholds
from bundle_contract.bundle import add_file
from bundle_contract.entries import ModeFailure, ModelEntry, Signature
from bundle_contract.tasks import DEFAULT, Task
from bundle_contract.tensors import TensorSpec
from edge_demo.runtimes.score import ModeResult

from .verify import TENSORFLOW_RUNTIME


def convert_mode(
    saved_model: pathlib.Path,
    mode: str,
    calibration: np.ndarray,
    staging: pathlib.Path,
    attention_saved_model: pathlib.Path | None = None,
    *,
    eval_samples: int,
    task: Task = DEFAULT,
    sequence_length: int | None = None,
    pad_id: int = 0,
    attention_thresholds: AttentionThresholds | None = None,
) -> tuple[ModelEntry | None, list[str]]:
    """Convert one mode into `staging` and check its graph: (entry, graph problems).

    The entry's thresholds are the mode's defaults for `eval_samples`
    (`Task.thresholds`: a classifier's by default), its attention's
    `attention_thresholds` (default: the mode's, `DEFAULT_THRESHOLDS`).

    With `attention_saved_model` the model also has the attention signature
    (`convert.VIEW_SIGNATURE`), described in the entry's `signatures` and
    `attention`, and its subgraph is checked like the classifier's.
    A model whose input is token ids with a dynamic sequence axis (an
    embedding model) is described at `sequence_length` (eval.npz's width)
    with `dynamic_length`: the device resizes it to each sentence's length,
    and calibration runs each sentence without its trailing `pad_id`s.

    The entry is None when the converter cannot produce the mode.
    """
    from .convert import ConversionError, attention_signature, convert
    from .graph import (
        check_graph,
        dynamic_length,
        op_histogram,
        read_graph,
        tflite_runtime_214_can_load,
        weight_dtypes,
    )

    start = time.perf_counter()
    try:
        model = convert(
            saved_model,
            mode,
            calibration,
            attention_saved_model_dir=attention_saved_model,
            pad_id=None if sequence_length is None else pad_id,
        )
    except ConversionError as error:
        return None, [f"the converter cannot produce {mode}: {error}"]
    seconds = time.perf_counter() - start
    graph = read_graph(model)
    problems = check_graph(graph, mode)
    dynamic = dynamic_length(graph)
    signatures, check = {}, None
    described = attention_signature(model)
    if described is not None:
        signatures = {described["signature"]: _signature(described, dynamic and sequence_length)}
        check = AttentionCheck(
            described["signature"], attention_thresholds or ATTENTION_THRESHOLDS[mode]
        )
        view = check_graph(read_graph(model, described["subgraph"]), mode)
        for name, found in view.items():
            problems.setdefault(name, []).extend(f"view: {item}" for item in found)
    ref = add_file(staging, f"model_{mode}.tflite", model)

    def spec(index: int) -> TensorSpec:
        tensor = graph.tensor(index)
        quantized = bool(tensor.scales) and not tensor.dtype.startswith("float")
        return TensorSpec(
            tensor.name,
            tensor.shape,
            tensor.dtype,
            tensor.scales[0] if quantized else None,
            tensor.zero_points[0] if quantized else None,
        )

    weights = weight_dtypes(graph)
    model_input = spec(graph.inputs[0])
    if dynamic:
        model_input = dataclasses.replace(model_input, shape=(1, int(sequence_length)))
    entry = ModelEntry(
        mode=mode,
        file=ref.file,
        sha256=ref.sha256,
        bytes=len(model),
        input=model_input,
        output=spec(graph.outputs[0]),
        thresholds=task.thresholds(mode, eval_samples),
        dynamic_length=dynamic,
        runtimes={"tflite-runtime": tflite_runtime_214_can_load(graph)},
        ops=op_histogram(graph),
        signatures=signatures,
        attention=check,
        checks={check: not found for check, found in problems.items()},
        weights=weights,
        convert_seconds=round(seconds, 3),
        note=(
            "no weight tensor has the 1024 elements TFLite's dynamic-range quantizer "
            "needs, so this is the float32 graph"
            if mode == "dynamic" and "int8" not in weights
            else None
        ),
    )
    return entry, [f"{check}: {'; '.join(found)}" for check, found in problems.items() if found]


def _signature(described: dict, sequence_length: int | None = None) -> Signature:
    """`convert.attention_signature`'s description as the manifest's `Signature`.

    A dynamic-length model's tensors are described at `sequence_length`:
    input (1, T), outputs (1, h, T, T), as the device runs the eval samples.
    """

    def shape(tensor: dict) -> tuple[int, ...]:
        dims = tuple(tensor["shape"])
        if not sequence_length:
            return dims
        return (1, sequence_length) if len(dims) == 2 else (*dims[:2], *(sequence_length,) * 2)

    def spec(tensor: dict) -> TensorSpec:
        return TensorSpec(
            tensor["name"],
            shape(tensor),
            tensor["dtype"],
            tensor["scale"],
            tensor["zero_point"],
        )

    inputs = described["input"]
    inputs = inputs if isinstance(inputs, list) else [inputs]
    return Signature(
        inputs={t["name"]: spec(t) for t in inputs},
        outputs={t["name"]: spec(t) for t in described["outputs"]},
    )


def judge(
    entry: ModelEntry, graph_problems: list[str], result: ModeResult, runtime: str
) -> tuple[ModelEntry, ModeFailure | None]:
    """The entry with the device's figures and verdict, and why it failed (None if verified).

    The verdict is the task's: the graph checks and the task outputs against
    the thresholds. The attention view gets its own, `attention.faithful`: a
    mode whose predictions hold and whose view misses its thresholds is
    verified, its view marked not faithful (docs/artifacts.md says why). A
    view the runtime cannot run at all still fails the mode.

    `runtimes` records the verifying runtime (LiteRT) as able to load the
    model, or not; TensorFlow's interpreter says nothing about LiteRT.
    """
    loaded = math.isfinite(result.load_ms)
    reasons = graph_problems + result.task_failures
    attention = entry.attention
    if attention is not None and loaded:
        if result.attention_status not in ("passed", "failed"):
            reasons.append(f"attention not verified: {result.attention_note or 'not run'}")
        attention = dataclasses.replace(
            attention,
            parity=result.attention_parity,
            faithful=None
            if result.attention_status not in ("passed", "failed")
            else not result.attention_failures,
        )
        if reasons:  # a failed mode's reasons name everything it misses, its view's too
            reasons.extend(result.attention_failures)
    runtimes = dict(entry.runtimes)
    if runtime != TENSORFLOW_RUNTIME:
        runtimes[runtime] = loaded
    entry = dataclasses.replace(
        entry,
        parity=result.parity if loaded else None,
        attention=attention,
        verified=not reasons,
        failures=tuple(reasons),
        verified_with=runtime,
        runtimes=dict(sorted(runtimes.items())),
    )
    if not reasons:
        return entry, None
    stage = "graph" if graph_problems else ("parity" if loaded else "verify")
    return entry, ModeFailure(stage, tuple(reasons), entry.parity, entry.bytes, entry.ops)
