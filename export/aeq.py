"""int16x8 for token-id models with Google's ai-edge-quantizer (AEQ).

TF's converter cannot make int16x8 of a model whose input is int32 token ids
(its 16x8 quantizer wants float inputs). AEQ quantizes the float32 .tflite
op by op instead. What this module does (docs/quantization.md, "Int16
where int8 loses most", has the measurements behind each step):

1. `unique_names`: AEQ refuses a file whose tensor names repeat; TF's
   converter gives some a bias constant and a reshape output the same name.
   Repeats get a `#2`, `#3` suffix.
2. Quantize with int8 weights and int16 activations everywhere
   (`static_wi8_ai16`) but the embedding lookups (GATHER: an int16 table
   would cost 12 MB more and gains nothing), calibrated with the absolute
   min/max of every tensor (AEQ's default moving average clips MiniLM's
   outliers), each sentence at its own length on a dynamic-length model
   (the device's rule, `own_lengths`), padded rows on a fixed one.
3. `integerize`: on a dynamic-length model AEQ leaves float islands (a
   DEQUANTIZE feeding SHAPE, DEQUANTIZE -> EXPAND_DIMS -> QUANTIZE, which it
   has no integer mapping for): they run on the integer tensors instead,
   bit-identical, so every tensor stays integer.

AEQ imports only here, and only when a token-id model's int16x8 is asked.
"""

from __future__ import annotations

import collections
import copy
import pathlib
import tempfile

import numpy as np

from bundle_contract.arrays import own_lengths

from .tflite_schema import enum_names, pack_aligned, schema, unpack

SIGNATURE = "serving_default"


class AeqMissing(Exception):
    """ai-edge-quantizer is not installed."""


def available() -> bool:
    try:
        import ai_edge_quantizer  # noqa: F401
    except ImportError:
        return False
    return True


def _unpack(model: bytes):
    """The schema module and the model as its object tree (`ModelT`)."""
    return schema(), unpack(model)


def unique_names(model: bytes) -> bytes:
    """The model with every repeated tensor name (per subgraph) given a `#k` suffix."""
    _, root = _unpack(model)
    changed = False
    for graph in root.subgraphs:
        seen: collections.Counter = collections.Counter()
        for tensor in graph.tensors:
            name = tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)
            seen[name] += 1
            if seen[name] > 1:
                tensor.name = f"{name}#{seen[name]}".encode()
                changed = True
    return pack_aligned(root, len(model)) if changed else model


def _rows(model_path: str, samples: np.ndarray, pad_id: int | None) -> list[dict]:
    """Calibration inputs: each sentence at its own length (dynamic), else as given."""
    from ai_edge_litert.interpreter import Interpreter

    detail = Interpreter(model_path=model_path).get_signature_runner(SIGNATURE).get_input_details()
    ((name, spec),) = detail.items()
    samples = np.asarray(samples)
    dtype = spec["dtype"]  # the float model's own input type: int32 ids or float32
    lengths = None if pad_id is None else own_lengths(samples, pad_id)
    return [
        {name: (x[None] if lengths is None else x[None, : int(lengths[i])]).astype(dtype)}
        for i, x in enumerate(samples)
    ]


def quantize_int16x8(model: bytes, calibration: np.ndarray, pad_id: int | None) -> bytes:
    """The float32 `model` (one signature, token ids in) as full-integer int16x8."""
    if not available():
        raise AeqMissing(
            "ai-edge-quantizer is not installed "
            "(pip install ai-edge-quantizer==0.10.0, setup.cfg's quantizer extra)"
        )
    from ai_edge_quantizer import calibrator, quantizer, recipe
    from ai_edge_quantizer.qtyping import TFLOperationName
    from ai_edge_quantizer.utils import qsv_utils

    from keras_mha.quiet_tensorflow import captured_output

    with tempfile.TemporaryDirectory(prefix="keras-mha-aeq-") as scratch:
        path = pathlib.Path(scratch) / "float.tflite"
        path.write_bytes(unique_names(model))
        with captured_output():
            job = quantizer.Quantizer(str(path), recipe.static_wi8_ai16())
            job.add_static_config(".*", TFLOperationName.GATHER, 8, 8)  # the lookups' tables
            rows = _rows(str(path), calibration, pad_id)
            found = calibrator.Calibrator(
                str(path), num_threads=1, qsv_update_func=qsv_utils.min_max_update
            )
            found.calibrate({SIGNATURE: rows}, job._recipe_manager)  # noqa: SLF001 (AEQ's own)
            result = job.quantize(found.get_model_qsvs(), enable_progress_report=False)
            out = pathlib.Path(scratch) / "int16x8.tflite"
            result.export_model(str(out), overwrite=True)
        return integerize(out.read_bytes())


def integerize(model: bytes) -> bytes:
    """Run AEQ's float islands on the integer tensors (module docstring, step 3).

    A DEQUANTIZE whose float output only feeds SHAPE (the dynamic reshapes
    around each Dense) is dropped and SHAPE reads the integer tensor; a
    DEQUANTIZE -> EXPAND_DIMS [-> EXPAND_DIMS ...] -> QUANTIZE chain runs
    EXPAND_DIMS on the integer tensor (a copy of it) and drops the QUANTIZE
    when its scale and zero point are the input's. Anything else is kept.
    """
    schema, root = _unpack(model)
    names, _ = enum_names()
    inlined = _inline_buffers(root, model)
    graph = root.subgraphs[0]
    codes = root.operatorCodes

    def name(op) -> str:
        code = codes[op.opcodeIndex]
        return names[max(code.builtinCode, code.deprecatedBuiltinCode)]

    def consumers() -> dict[int, list]:
        found = collections.defaultdict(list)
        for op in graph.operators:
            for index in op.inputs:
                if index >= 0:
                    found[index].append(op)
        return found

    def same_quantization(a: int, b: int) -> bool:
        qa, qb = graph.tensors[a].quantization, graph.tensors[b].quantization
        return (
            graph.tensors[a].type == graph.tensors[b].type
            and np.allclose(qa.scale, qb.scale, rtol=1e-6)
            and np.array_equal(qa.zeroPoint, qb.zeroPoint)
        )

    drop: set[int] = set()
    users = consumers()

    def chain_ends_integer(op) -> bool:  # a float EXPAND_DIMS chain ending in QUANTIZE/SHAPE
        out = op.outputs[0]
        return out not in graph.outputs and all(
            name(u) in ("QUANTIZE", "SHAPE") or (name(u) == "EXPAND_DIMS" and chain_ends_integer(u))
            for u in users[out]
        )

    def run_on_integer(op, source: int) -> None:
        out = op.outputs[0]
        op.inputs[0] = source
        graph.tensors[out].type = graph.tensors[source].type
        graph.tensors[out].quantization = copy.deepcopy(graph.tensors[source].quantization)
        quantizes = [u for u in users[out] if name(u) == "QUANTIZE"]
        if len(users[out]) == 1 and quantizes and same_quantization(out, quantizes[0].outputs[0]):
            op.outputs[0] = quantizes[0].outputs[0]
            drop.add(id(quantizes[0]))
            return
        for user in users[out]:
            if name(user) == "EXPAND_DIMS":
                run_on_integer(user, out)

    for op in list(graph.operators):
        if name(op) != "DEQUANTIZE":
            continue
        source, floats = op.inputs[0], op.outputs[0]
        integer = (schema.TensorType.INT8, schema.TensorType.INT16)
        if graph.tensors[source].type not in integer or floats in graph.outputs:
            continue
        for user in users[floats]:
            if name(user) == "SHAPE":
                user.inputs[0] = source
            elif name(user) == "EXPAND_DIMS" and chain_ends_integer(user):
                run_on_integer(user, source)
        users = consumers()
        if not users[floats]:
            drop.add(id(op))
    if not drop and not inlined:
        return model
    graph.operators = [op for op in graph.operators if id(op) not in drop]
    return pack_aligned(root, len(model))


def _inline_buffers(root, model: bytes) -> bool:
    """AEQ writes weights after the flatbuffer (each buffer an offset and a size),
    which TFLite's own writer does only past 2 GB: move them back into the
    buffers' data, where every other tool here reads them. Whether any moved."""
    moved = False
    for buffer in root.buffers:
        offset, size = int(getattr(buffer, "offset", 0) or 0), int(getattr(buffer, "size", 0) or 0)
        if offset > 1 and size:
            buffer.data = np.frombuffer(model[offset : offset + size], np.uint8).copy()
            buffer.offset, buffer.size = 0, 0
            moved = True
    return moved
