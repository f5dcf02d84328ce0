"""Make the last float step of a token model's integer graph integer.

A token classifier's masked mean pooling divides by the number of real
tokens: Keras computes it as `sum(cast(mask, float32))`. In a full-integer
model the converter keeps that as

    CAST(bool -> float32) -> QUANTIZE(float32 -> int8 (s, z)) -> SUM ...

so the "int8" graph still needs float32 support. Both steps together only map
`False -> z` and `True -> round(1 / s) + z`, which one integer op does exactly:

    SELECT_V2(mask, [round(1 / s) + z], [z]) -> int8 (s, z) -> SUM ...

`integerize_mask_casts(model)` makes that replacement (and nothing else) on
the flatbuffer. The numbers are the same (verification checks them anyway).
"""

from __future__ import annotations

import numpy as np


def _schema():
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:
        from tensorflow.lite.python import schema_py_generated as schema
    return schema


def _builtin(code) -> int:
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def integerize_mask_casts(model: bytes) -> tuple[bytes, int]:
    """Replace CAST(bool->float32) + QUANTIZE(->int8/int16) pairs by SELECT_V2.

    Returns the new flatbuffer and how many pairs were replaced; the input
    bytes unchanged when there is none.
    """
    import flatbuffers

    schema = _schema()
    ops_enum, types = schema.BuiltinOperator, schema.TensorType
    root = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    integer_types = {types.INT8: np.int8, types.INT16: np.int16}
    replaced = 0
    for graph in root.subgraphs:
        consumers: dict[int, list[int]] = {}
        for position, op in enumerate(graph.operators):
            for index in op.inputs if op.inputs is not None else ():
                consumers.setdefault(int(index), []).append(position)
        graph_outputs = {int(i) for i in graph.outputs}
        drop: set[int] = set()
        for op in graph.operators:
            if _builtin(root.operatorCodes[op.opcodeIndex]) != ops_enum.CAST:
                continue
            source, cast_out = int(op.inputs[0]), int(op.outputs[0])
            if (
                graph.tensors[source].type != types.BOOL
                or graph.tensors[cast_out].type != types.FLOAT32
                or cast_out in graph_outputs
                or len(consumers.get(cast_out, [])) != 1
            ):
                continue
            quantize = graph.operators[consumers[cast_out][0]]
            if _builtin(root.operatorCodes[quantize.opcodeIndex]) != ops_enum.QUANTIZE:
                continue
            target = graph.tensors[int(quantize.outputs[0])]
            quant = target.quantization
            if (
                target.type not in integer_types
                or quant is None
                or quant.scale is None
                or len(quant.scale) != 1
            ):
                continue
            dtype = integer_types[target.type]
            scale, zero_point = float(quant.scale[0]), int(quant.zeroPoint[0])
            info = np.iinfo(dtype)
            one = int(np.clip(np.floor(1.0 / scale + 0.5) + zero_point, info.min, info.max))
            zero = int(np.clip(zero_point, info.min, info.max))
            constants = []
            for value, label in ((one, "one"), (zero, "zero")):
                buffer = schema.BufferT()
                buffer.data = np.array([value], dtype=dtype).tobytes()
                root.buffers.append(buffer)
                tensor = schema.TensorT()
                tensor.shape = []
                tensor.type = target.type
                tensor.buffer = len(root.buffers) - 1
                tensor.name = f"{(target.name or b'mask').decode()}/integer_{label}".encode()
                tensor.quantization = schema.QuantizationParametersT()
                tensor.quantization.scale = [scale]
                tensor.quantization.zeroPoint = [zero_point]
                graph.tensors.append(tensor)
                constants.append(len(graph.tensors) - 1)
            op.opcodeIndex = _opcode_index(root, schema, ops_enum.SELECT_V2)
            op.inputs = [source, *constants]
            op.outputs = [int(quantize.outputs[0])]
            op.builtinOptionsType = schema.BuiltinOptions.SelectV2Options
            op.builtinOptions = schema.SelectV2OptionsT()
            drop.add(consumers[cast_out][0])
            replaced += 1
        if drop:
            graph.operators = [op for i, op in enumerate(graph.operators) if i not in drop]
    if not replaced:
        return model, 0
    builder = flatbuffers.Builder(len(model) + 1024)
    builder.Finish(root.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), replaced


def _opcode_index(root, schema, builtin: int) -> int:
    """Index of the operator code for `builtin`, added (version 1) if missing."""
    for index, code in enumerate(root.operatorCodes):
        if _builtin(code) == builtin:
            return index
    code = schema.OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = 1
    root.operatorCodes.append(code)
    return len(root.operatorCodes) - 1
