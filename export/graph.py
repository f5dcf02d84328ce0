"""Read a .tflite flatbuffer and check the graph an edge device will run.

Parses the model with the TFLite schema (LiteRT's copy, TensorFlow's as a
fallback), without an interpreter:

- `read_graph(model)`: ops (name, version, tensors) and tensors (name, shape,
  dtype, quantization, constant or not) of the main subgraph;
- `op_histogram(graph)`: `{"FULLY_CONNECTED": 8, ...}`;
- `check_graph(graph, mode)`: what is wrong with it for an edge runtime:
  custom/Flex ops, a batch other than 1, and for `int8` (and `int16x8`) any
  float tensor entering or leaving a compute op (a DEQUANTIZE -> float op ->
  QUANTIZE island, or a float model input/output);
- `tflite_runtime_214_can_load(graph)`: whether tflite-runtime 2.14, the last
  release of the old runtime, has kernels for every op (docs/field_notes.md).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from . import tflite_schema
from .tflite_schema import enum_names

# Ops that only move numbers between the float and the integer domain.
QUANTIZE_OPS = frozenset({"QUANTIZE", "DEQUANTIZE"})
FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16"})
# Full-integer modes and their activation dtype (token-id inputs stay int32).
INTEGER_IO = {"int8": "int8", "int16x8": "int16"}


@dataclasses.dataclass(frozen=True)
class GraphTensor:
    """One tensor of the subgraph."""

    index: int
    name: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...] | None  # -1 marks a dynamic dimension
    dtype: str  # numpy-style name: "float32", "int8", "bool", ...
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    constant: bool  # backed by data in the flatbuffer (a weight)


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """One operator: builtin name (or `CUSTOM:<code>`), version, tensors."""

    name: str
    version: int
    inputs: tuple[int, ...]  # tensor indices; -1 marks an omitted optional input
    outputs: tuple[int, ...]

    @property
    def custom(self) -> bool:
        return self.name.startswith("CUSTOM:")


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    """The main subgraph of a TFLite model."""

    ops: tuple[OpInfo, ...]
    tensors: tuple[GraphTensor, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    num_subgraphs: int
    signatures: dict[str, int] = dataclasses.field(default_factory=dict)  # name -> subgraph

    def tensor(self, index: int) -> GraphTensor:
        return self.tensors[index]


def _dtype_name(tensor_type: int) -> str:
    """TensorType.FLOAT32 -> "float32" (numpy's spelling)."""
    return enum_names()[1].get(tensor_type, f"type{tensor_type}").lower()


def read_graph(model: bytes, subgraph: int = 0) -> GraphInfo:
    """Parse subgraph `subgraph` of the flatbuffer `model` (bytes of a .tflite file)."""
    schema = tflite_schema.schema()
    builtin_names, _ = enum_names()
    buf = bytearray(model)
    if len(buf) < 8 or bytes(buf[4:8]) != b"TFL3":
        raise ValueError("not a TFLite flatbuffer (missing the 'TFL3' identifier)")
    root = schema.Model.GetRootAs(buf, 0)
    opcodes = []
    for i in range(root.OperatorCodesLength()):
        code = root.OperatorCodes(i)
        # Codes < 127 live in deprecated_builtin_code; newer ones in builtin_code.
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            custom = code.CustomCode()
            name = "CUSTOM:" + (custom.decode() if custom else "?")
        else:
            name = builtin_names.get(builtin, f"BUILTIN_{builtin}")
        opcodes.append((name, code.Version()))

    graph = root.Subgraphs(subgraph)
    tensors = []
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        quant = t.Quantization()
        scales: tuple[float, ...] = ()
        zero_points: tuple[int, ...] = ()
        if quant is not None and quant.ScaleLength():
            scales = tuple(float(s) for s in quant.ScaleAsNumpy())
            zero_points = tuple(int(z) for z in quant.ZeroPointAsNumpy())
        buffer = root.Buffers(t.Buffer()) if t.Buffer() < root.BuffersLength() else None
        constant = buffer is not None and (buffer.DataLength() > 0 or buffer.Offset() > 1)
        signature = (
            tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else None
        )
        tensors.append(
            GraphTensor(
                index=i,
                name=(t.Name() or b"").decode(errors="replace"),
                shape=tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else (),
                shape_signature=signature,
                dtype=_dtype_name(t.Type()),
                scales=scales,
                zero_points=zero_points,
                constant=constant,
            )
        )
    ops = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        name, version = opcodes[op.OpcodeIndex()]
        ops.append(
            OpInfo(
                name=name,
                version=version,
                inputs=tuple(int(x) for x in op.InputsAsNumpy()) if op.InputsLength() else (),
                outputs=tuple(int(x) for x in op.OutputsAsNumpy()) if op.OutputsLength() else (),
            )
        )
    return GraphInfo(
        ops=tuple(ops),
        tensors=tuple(tensors),
        inputs=tuple(int(x) for x in graph.InputsAsNumpy()),
        outputs=tuple(int(x) for x in graph.OutputsAsNumpy()),
        num_subgraphs=root.SubgraphsLength(),
        signatures={
            root.SignatureDefs(i).SignatureKey().decode(): root.SignatureDefs(i).SubgraphIndex()
            for i in range(root.SignatureDefsLength())
        },
    )


def op_histogram(graph: GraphInfo) -> dict[str, int]:
    """Op name -> count, most frequent first (ties by name)."""
    counts = Counter(op.name for op in graph.ops)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def weight_dtypes(graph: GraphInfo) -> dict[str, int]:
    """How many constant tensors (weights, biases, tables) of each dtype."""
    counts = Counter(t.dtype for t in graph.tensors if t.constant)
    return dict(sorted(counts.items()))


def _float_tensors_of_compute_ops(graph: GraphInfo) -> list[str]:
    """'OP(tensor)' for each float tensor entering or leaving a non-(DE)QUANTIZE op."""
    found = []
    for op in graph.ops:
        if op.name in QUANTIZE_OPS:
            continue
        for index in (*op.inputs, *op.outputs):
            if index < 0:
                continue
            tensor = graph.tensor(index)
            if tensor.dtype in FLOAT_DTYPES:
                found.append(f"{op.name}({tensor.name or index}: {tensor.dtype})")
    return found


def dynamic_length(graph: GraphInfo) -> bool:
    """Whether the model's one input is token ids `[1, -1]`: a dynamic sequence axis."""
    if len(graph.inputs) != 1:
        return False
    signature = graph.tensor(graph.inputs[0]).shape_signature
    return signature is not None and len(signature) == 2 and signature[0] == 1 and signature[1] < 0


def check_graph(graph: GraphInfo, mode: str) -> dict[str, list[str]]:
    """Problems found per check; every list empty means the graph is fine.

    Checks: `builtin_only` (no custom or Flex ops: a plain runtime has no
    kernels for them), `batch_one` (inputs and outputs have a fixed batch of
    1 and no dynamic dimension but an embedding model's sequence axis,
    `dynamic_length`), `single_subgraph` (one subgraph per
    signature: the classifier's, and the attention `view`), and for `int8` (and
    `int16x8`) `fully_integer`: model input/output int8 (int16; int32 token
    ids as input) and no float tensor read or written by any op other than
    QUANTIZE/DEQUANTIZE.
    """
    problems: dict[str, list[str]] = {
        "builtin_only": [f"custom op {op.name[7:]}" for op in graph.ops if op.custom],
        "batch_one": [],
        "single_subgraph": [],
    }
    expected = max(1, len(set(graph.signatures.values())))
    if graph.num_subgraphs != expected:
        problems["single_subgraph"].append(
            f"{graph.num_subgraphs} subgraphs for {len(graph.signatures)} signature(s)"
        )
    dynamic = dynamic_length(graph)
    for kind, indices in (("input", graph.inputs), ("output", graph.outputs)):
        for index in indices:
            tensor = graph.tensor(index)
            dims = tensor.shape_signature or tensor.shape
            if dynamic:  # [1, -1]: resized to each sentence's length on the device
                dims = dims[:1]
            if not tensor.shape or tensor.shape[0] != 1 or any(d < 0 for d in dims):
                problems["batch_one"].append(
                    f"{kind} {tensor.name} has shape {list(dims)}, expected [1, ...] with fixed dims"
                )
    if mode in INTEGER_IO:
        fully = []
        activation = INTEGER_IO[mode]
        for kind, indices in (("input", graph.inputs), ("output", graph.outputs)):
            for index in indices:
                tensor = graph.tensor(index)
                allowed = (activation,) if kind == "output" else (activation, "int32")
                if tensor.dtype not in allowed:
                    fully.append(f"model {kind} {tensor.name} is {tensor.dtype}")
        fully.extend(_float_tensors_of_compute_ops(graph))
        problems["fully_integer"] = fully
    return problems


def tflite_runtime_214_can_load(graph: GraphInfo) -> bool:
    """Whether tflite-runtime 2.14 has a kernel for every op of the graph.

    Known gaps, measured (docs/field_notes.md; tests/test_export_graph.py checks them
    against tflite-runtime 2.14 when `.venv-edge-tflite` exists):
    FULLY_CONNECTED version 12 (TF 2.21's dynamic-range kernel: "Didn't find
    op"), RSQRT on int16 ("Type INT16 is unsupported by op Rsqrt") and DIV on
    int8/int16 (a token model's masked mean: "Div only supports FLOAT32,
    INT32 and quantized UINT8").
    """
    for op in graph.ops:
        dtypes = {graph.tensor(i).dtype for i in op.inputs if i >= 0}
        if op.custom:
            return False
        if op.name == "FULLY_CONNECTED" and op.version >= 12:
            return False
        if op.name == "RSQRT" and "int16" in dtypes:
            return False
        if op.name == "DIV" and dtypes & {"int8", "int16"}:
            return False
    return True
