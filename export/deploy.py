"""Deploy files for flash-limited targets: each mode's classifier without its strings.

`deploy_bytes(model)` keeps subgraph 0 (the classifier; the attention
signature's subgraph goes, since TFLite Micro crashes on any model with two
subgraphs: `convert.without_view_signature`), removes the negative-index
wrap Keras puts in front of a token embedding's GATHER (`drop_index_wrap`:
its SELECT has no TFLite Micro kernel), drops the buffers only the
dropped subgraph used, then TensorFlow's `flatbuffer_utils.strip_strings`
removes the description, subgraph and tensor names and the signature defs:
nothing a runtime needs to run subgraph 0 by input and output position
(docs/field_notes.md has the sizes). A deploy file must compute exactly what
the named model does: `verify_stripped` runs both on the same inputs through
the device's `EdgeModel` and requires bit-identical raw outputs. Without
names a file cannot be debugged (`keras-mha-edge --debug`): debug the named file.

Export side (TensorFlow present); the bundle entry is
`bundle_contract.deploy.DeployFile`, written by `devices.add_devices`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edge_demo.runtimes.model import EdgeModel
from edge_demo.runtimes.runtime import Runtime

from . import tflite_schema


def _prune_buffers(model) -> None:
    """Drop buffers no tensor of the remaining subgraphs and no metadata uses (in place)."""
    used = {0}  # buffer 0 is the schema's empty sentinel
    for graph in model.subgraphs or []:
        used.update(t.buffer for t in graph.tensors or [])
    used.update(m.buffer for m in model.metadata or [])
    keep = sorted(used)
    index = {old: new for new, old in enumerate(keep)}
    model.buffers = [model.buffers[i] for i in keep]
    for graph in model.subgraphs or []:
        for tensor in graph.tensors or []:
            tensor.buffer = index[tensor.buffer]
    for metadata in model.metadata or []:
        metadata.buffer = index[metadata.buffer]


def _builtin(model, op) -> int:
    code = model.operatorCodes[op.opcodeIndex]
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def _int_constant(model, graph, tensor: int):
    """A constant tensor's int32 values, or None if the tensor is computed."""
    schema = tflite_schema.schema()

    t = graph.tensors[tensor]
    data = model.buffers[t.buffer].data
    if t.type != schema.TensorType.INT32 or data is None or len(data) == 0:
        return None
    return np.frombuffer(bytes(data), "<i4")


def _remove_tensors(model, number: int, unused: set[int]) -> None:
    """Drop subgraph `number`'s `unused` tensors and renumber the rest (in place)."""
    graph = model.subgraphs[number]
    keep = [i for i in range(len(graph.tensors)) if i not in unused]
    index = {old: new for new, old in enumerate(keep)}
    graph.tensors = [graph.tensors[i] for i in keep]
    for op in graph.operators:
        op.inputs = [index[t] if t >= 0 else t for t in op.inputs]
        op.outputs = [index[t] for t in op.outputs]
    graph.inputs = [index[t] for t in graph.inputs]
    graph.outputs = [index[t] for t in graph.outputs]
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == number:
            for item in (*(signature.inputs or []), *(signature.outputs or [])):
                item.tensorIndex = index[item.tensorIndex]


def drop_index_wrap(model) -> int:
    """Remove the negative-index wrap in front of each embedding GATHER (in place).

    One wrap may feed several GATHERs (the token embedding and its 0/1 mask,
    `keras_mha.layers.TokenEmbedding`, look up the same ids): all are rewired.

    Keras's `ops.take` on TensorFlow turns every index i into
    `where(i < 0, i + V, i)` (numpy's wrap-around), which converts to LESS,
    ADD and SELECT in front of the GATHER. TFLite Micro has no SELECT kernel,
    and token ids are never negative: the contract checks every id is in
    [0, vocabulary) before a model sees it. Returns the number of wraps removed.
    """
    schema = tflite_schema.schema()

    op_ = schema.BuiltinOperator
    removed = 0
    for number, graph in enumerate(model.subgraphs or []):
        ops = graph.operators or []
        producer = {t: i for i, op in enumerate(ops) for t in op.outputs}
        readers: dict[int, int] = {}
        gathered: dict[int, int] = {}  # tensor -> GATHERs reading it as their indices
        for op in ops:
            for t in op.inputs:
                readers[t] = readers.get(t, 0) + 1
            if _builtin(model, op) == op_.GATHER and len(op.inputs) == 2:
                gathered[op.inputs[1]] = gathered.get(op.inputs[1], 0) + 1
        drop: set[int] = set()
        for op in ops:
            if _builtin(model, op) != op_.GATHER or len(op.inputs) != 2:
                continue
            select = producer.get(op.inputs[1])
            if select is None or _builtin(model, ops[select]) not in (op_.SELECT, op_.SELECT_V2):
                continue
            condition, wrapped, index = ops[select].inputs
            less, add = producer.get(condition), producer.get(wrapped)
            if less is None or add is None:
                continue
            if _builtin(model, ops[less]) != op_.LESS or _builtin(model, ops[add]) != op_.ADD:
                continue
            if ops[less].inputs[0] != index or ops[add].inputs[0] != index:
                continue
            zero = _int_constant(model, graph, ops[less].inputs[1])
            if zero is None or zero.size != 1 or int(zero[0]) != 0:
                continue
            if _int_constant(model, graph, ops[add].inputs[1]) is None:
                continue
            if any(readers.get(t, 0) != 1 for t in (condition, wrapped)):
                continue  # the wrap feeds something else too: leave it
            if readers.get(op.inputs[1], 0) != gathered.get(op.inputs[1], 0):
                continue  # the wrapped ids feed more than GATHERs' indices: leave it
            removed += select not in drop  # one wrap may feed several lookups (ids and mask)
            op.inputs = [op.inputs[0], index]
            drop.update((select, less, add))
        if drop:
            graph.operators = [op for i, op in enumerate(ops) if i not in drop]
            used = {t for op in graph.operators for t in (*op.inputs, *op.outputs)}
            used.update(graph.inputs, graph.outputs)
            _remove_tensors(model, number, {t for t in range(len(graph.tensors)) if t not in used})
    return removed


def without_index_wrap(content: bytes) -> bytes:
    """`content` with `drop_index_wrap` applied (unchanged bytes if it has none)."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    if not drop_index_wrap(model):
        return content
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def strip_model(content: bytes) -> bytes:
    """`content` without description, subgraph and tensor names, and signature defs."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    _prune_buffers(model)
    flatbuffer_utils.strip_strings(model)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def deploy_bytes(model: bytes) -> tuple[bytes, bytes]:
    """(the classifier alone with its names, the deploy file) for a bundle model.

    Both without the embedding's index wrap (`drop_index_wrap`), so that
    TFLite Micro can run the named one as the deploy file's reference; the
    LiteRT check against the bundle's own file covers the wrap's removal.
    """
    from .convert import without_view_signature

    classifier = without_index_wrap(without_view_signature(model))
    return classifier, strip_model(classifier)


def _raw(runtime: Runtime, content: bytes, x: np.ndarray) -> tuple[EdgeModel, np.ndarray]:
    model = EdgeModel(runtime, content)
    try:
        raw, _ = model.run(model.prepare(x))
    finally:
        model.close()
    return model, raw


def verify_stripped(
    named: bytes, stripped: bytes, x: np.ndarray, runtimes: Sequence[Runtime]
) -> list[str]:
    """The runtimes on which `stripped` gives raw outputs bit-identical to `named` on `x`.

    `x`: samples as eval.npz holds them (quantized with the input's own
    parameters). Raises ValueError naming the runtime if the tensors' shapes,
    dtypes or quantization differ, or any raw output differs.
    """
    checked = []
    for runtime in runtimes:
        reference, want = _raw(runtime, named, x)
        other, got = _raw(runtime, stripped, x)
        for role in ("input", "output"):
            found = getattr(other, role).differences(getattr(reference, role))
            if found:
                raise ValueError(
                    f"{runtime.name}: the deploy file's {role} differs: {'; '.join(found)}"
                )
        if want.dtype != got.dtype or not np.array_equal(want, got):
            raise ValueError(
                f"{runtime.name}: the deploy file's raw outputs differ in "
                f"{int((want != got).sum())} of {want.size} values"
            )
        checked.append(runtime.name)
    return checked
