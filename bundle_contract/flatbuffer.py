"""The index fields of a TFLite flatbuffer, checked before any runtime sees the model.

Runtimes trust a model's indices: a signature's `subgraph_index`, a
signature's or subgraph's tensor index, an operator's input or output, a
tensor's buffer, an operator's opcode index. One out of range (-1 as an
output, a subgraph that does not exist) reads outside an array in native
code: a crash, or worse, one that does not always happen, so a child-process
probe cannot rule it out (runtimes/probe.py). `index_problem` walks the
schema's tables (tensorflow/lite/schema/schema.fbs) with every read bounds
checked, and the whole walk within one budget of reads (`_READS_PER_BYTE`
per byte of the file, plus `_MIN_READS`): tables may be shared, so a small
file whose vectors all point at one table would otherwise multiply the work
(a sound model needs far fewer reads than it has bytes: every table and
vector item it reads takes 4 bytes or more). Standard library only.
"""

from __future__ import annotations

import struct

# field ids of schema.fbs
_MODEL_OPCODES, _MODEL_SUBGRAPHS, _MODEL_BUFFERS, _MODEL_SIGNATURES = 1, 2, 4, 7
_SUB_TENSORS, _SUB_INPUTS, _SUB_OUTPUTS, _SUB_OPERATORS = 0, 1, 2, 3
_TENSOR_BUFFER = 2
_OP_OPCODE, _OP_INPUTS, _OP_OUTPUTS, _OP_INTERMEDIATES = 0, 1, 2, 7
_SIG_INPUTS, _SIG_OUTPUTS, _SIG_SUBGRAPH = 0, 1, 4
_MAP_TENSOR = 1
_MAX_ITEMS = 1 << 22
_READS_PER_BYTE = 1
_MIN_READS = 1 << 16


class _Corrupt(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.budget = _READS_PER_BYTE * len(data) + _MIN_READS

    def unpack(self, fmt: str, at: int):
        self.budget -= 1
        if self.budget < 0:
            raise _Corrupt(
                f"its tables take more than {_READS_PER_BYTE * len(self.data) + _MIN_READS} "
                "reads to walk (shared or looping references)"
            )
        if at < 0 or at + struct.calcsize(fmt) > len(self.data):
            raise _Corrupt(f"offset {at} is outside the file")
        return struct.unpack_from(fmt, self.data, at)[0]

    def field(self, table: int, index: int) -> int | None:
        vtable = table - self.unpack("<i", table)
        size = self.unpack("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        rel = self.unpack("<H", vtable + slot)
        return table + rel if rel else None

    def ref(self, at: int) -> int:
        return at + self.unpack("<I", at)

    def vector(self, table: int, index: int) -> tuple[int, int]:
        at = self.field(table, index)
        if at is None:
            return 0, 0
        vec = self.ref(at)
        n = self.unpack("<I", vec)
        if n > _MAX_ITEMS or vec + 4 + 4 * n > len(self.data):
            raise _Corrupt(f"a vector of {n} items runs past the end of the file")
        return vec + 4, n

    def tables(self, table: int, index: int) -> list[int]:
        start, n = self.vector(table, index)
        return [self.ref(start + 4 * i) for i in range(n)]

    def ints(self, table: int, index: int) -> list[int]:
        start, n = self.vector(table, index)
        return [self.unpack("<i", start + 4 * i) for i in range(n)]

    def scalar(self, table: int, index: int, fmt: str = "<I", default: int = 0) -> int:
        at = self.field(table, index)
        return default if at is None else self.unpack(fmt, at)


def index_problem(data: bytes) -> str | None:
    """Why a TFLite model's indices cannot be trusted, or None (header checked first:
    files.tflite_problem)."""
    try:
        return _check(_Reader(data))
    except _Corrupt as exc:
        return f"corrupt TFLite flatbuffer: {exc}"


def _check(fb: _Reader) -> str | None:
    root = fb.ref(0)
    opcodes = fb.vector(root, _MODEL_OPCODES)[1]
    buffers = fb.vector(root, _MODEL_BUFFERS)[1]
    subgraphs = fb.tables(root, _MODEL_SUBGRAPHS)
    if not subgraphs:
        return "corrupt TFLite flatbuffer: no subgraph"
    counts = []
    for s, sub in enumerate(subgraphs):
        tensors = fb.tables(sub, _SUB_TENSORS)
        counts.append(len(tensors))
        for t, tensor in enumerate(tensors):
            buffer = fb.scalar(tensor, _TENSOR_BUFFER)
            if buffer >= max(buffers, 1):
                return f"subgraph {s} tensor {t} names buffer {buffer}, the model has {buffers}"
        for side, index in (("input", _SUB_INPUTS), ("output", _SUB_OUTPUTS)):
            for i in fb.ints(sub, index):
                if not 0 <= i < len(tensors):
                    return (
                        f"subgraph {s} {side} tensor {i} is not one of its {len(tensors)} tensors"
                    )
        for o, op in enumerate(fb.tables(sub, _SUB_OPERATORS)):
            code = fb.scalar(op, _OP_OPCODE)
            if code >= opcodes:
                return f"subgraph {s} operator {o} has opcode index {code} of {opcodes}"
            for side, index in (
                ("input", _OP_INPUTS),
                ("output", _OP_OUTPUTS),
                ("intermediate", _OP_INTERMEDIATES),
            ):
                for i in fb.ints(op, index):
                    low = -1 if side == "input" else 0  # -1: an optional input left out
                    if not low <= i < len(tensors):
                        return (
                            f"subgraph {s} operator {o} {side} tensor {i} is not one of its "
                            f"{len(tensors)} tensors"
                        )
    for g, signature in enumerate(fb.tables(root, _MODEL_SIGNATURES)):
        sub = fb.scalar(signature, _SIG_SUBGRAPH)
        if sub >= len(subgraphs):
            return f"signature {g} names subgraph {sub}, the model has {len(subgraphs)}"
        for side, index in (("input", _SIG_INPUTS), ("output", _SIG_OUTPUTS)):
            for tmap in fb.tables(signature, index):
                i = fb.scalar(tmap, _MAP_TENSOR)
                if i >= counts[sub]:
                    return (
                        f"signature {g} {side} tensor {i} is not one of subgraph {sub}'s "
                        f"{counts[sub]} tensors"
                    )
    return None
