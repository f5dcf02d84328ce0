"""The graph checks of keras_mha_export.graph, on hand-made graphs."""

from __future__ import annotations

from keras_mha_export.graph import GraphInfo, GraphTensor, OpInfo, check_graph


def _tensor(index, dtype, shape=(1, 4), signature=None, name=None):
    return GraphTensor(index, name or f"t{index}", shape, signature, dtype, (), (), False)


def test_check_graph_finds_float_islands_custom_ops_and_dynamic_batch():
    # int8 in -> DEQUANTIZE -> NEG (float) -> QUANTIZE -> int8 out
    tensors = (
        _tensor(0, "int8"),
        _tensor(1, "float32"),
        _tensor(2, "float32"),
        _tensor(3, "int8", shape=(1, 4), signature=(-1, 4)),
    )
    ops = (
        OpInfo("DEQUANTIZE", 1, (0,), (1,)),
        OpInfo("NEG", 1, (1,), (2,)),
        OpInfo("QUANTIZE", 1, (2,), (3,)),
        OpInfo("CUSTOM:FlexEinsum", 1, (3,), (3,)),
    )
    graph = GraphInfo(ops, tensors, (0,), (3,), 1)
    problems = check_graph(graph, "int8")
    assert problems["fully_integer"] == ["NEG(t1: float32)", "NEG(t2: float32)"]
    assert problems["builtin_only"] == ["custom op FlexEinsum"]
    assert len(problems["batch_one"]) == 1 and "t3" in problems["batch_one"][0]
    # Float models may be float; a float int8 model input is not allowed.
    assert "fully_integer" not in check_graph(graph, "float32")
    float_io = GraphInfo((OpInfo("ADD", 1, (1, 1), (2,)),), tensors, (1,), (2,), 1)
    assert "model input t1 is float32" in check_graph(float_io, "int8")["fully_integer"]
