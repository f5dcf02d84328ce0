"""The TFLite schema, read and written in one place.

TFLite files are flatbuffers of `schema.fbs`; LiteRT (and TensorFlow) ship its
generated Python module. Export edits models through it: convert.py adds the
attention (`view`) signature, aeq.py makes ai-edge-quantizer's int16x8 model
integer-only, deploy.py strips a deploy file, graph.py reads a graph. Each
takes from here:

- `schema()`: the generated module (LiteRT's, else TensorFlow's copy);
- `enum_names()`: builtin operator and tensor type names by value;
- `unpack(model)`: a model's object API (`ModelT`), after checking its identifier;
- `pack_aligned(model, size_hint)`: a `ModelT` back to bytes, every weight buffer
  on `BUFFER_ALIGNMENT` bytes, as TFLite's own writer places them.
"""

from __future__ import annotations

import functools
import types

import numpy as np

BUFFER_ALIGNMENT = 16  # weight buffers start on 16 bytes, as TFLite's own writer places them


def schema() -> types.ModuleType:
    """The generated schema module: LiteRT's, else the same module TensorFlow ships."""
    try:
        from ai_edge_litert import schema_py_generated as module
    except ImportError:
        from tensorflow.lite.python import schema_py_generated as module
    return module


@functools.lru_cache(maxsize=1)
def enum_names() -> tuple[dict[int, str], dict[int, str]]:
    """({builtin operator value: name}, {tensor type value: name})."""
    module = schema()

    def names(enum_class) -> dict[int, str]:
        return {
            value: key
            for key, value in vars(enum_class).items()
            if not key.startswith("_") and isinstance(value, int)
        }

    return names(module.BuiltinOperator), names(module.TensorType)


def unpack(model: bytes, what: str = "model"):
    """`model`'s object API root (`ModelT`); ValueError if it is not a TFLite flatbuffer."""
    buf = bytearray(model)
    if len(buf) < 8 or bytes(buf[4:8]) != b"TFL3":
        raise ValueError(f"the {what} is not a TFLite flatbuffer (no 'TFL3' identifier)")
    module = schema()
    return module.ModelT.InitFromObj(module.Model.GetRootAs(buf, 0))


@functools.lru_cache(maxsize=1)
def _aligned_buffer_type() -> type:
    module = schema()

    class AlignedBuffer(module.BufferT):
        """A BufferT whose data starts on `BUFFER_ALIGNMENT` bytes when packed."""

        def Pack(self, builder):  # noqa: N802  (the generated API's name)
            if self.data is None or len(self.data) == 0:
                return super().Pack(builder)
            payload = np.asarray(self.data, dtype=np.uint8).tobytes()
            builder.StartVector(1, len(payload), BUFFER_ALIGNMENT)
            builder.head -= len(payload)
            builder.Bytes[builder.head : builder.head + len(payload)] = payload
            builder.vectorNumElems = len(payload)
            data = builder.EndVector()
            module.BufferStart(builder)
            module.BufferAddData(builder, data)
            return module.BufferEnd(builder)

    return AlignedBuffer


def pack_aligned(model, size_hint: int) -> bytes:
    """An unpacked model (the schema's `ModelT`) as flatbuffer bytes, every weight
    buffer starting on `BUFFER_ALIGNMENT` bytes (what TFLite's own writer does)."""
    import flatbuffers

    aligned = _aligned_buffer_type()
    copies = []
    for buffer in model.buffers:
        copy = aligned()
        copy.data = buffer.data
        copies.append(copy)
    model.buffers = copies
    builder = flatbuffers.Builder(size_hint)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
