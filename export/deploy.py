"""Deploy files for flash-limited targets: each mode's classifier without its strings.

`deploy_bytes(model)` keeps subgraph 0 (the classifier; the attention
signature's subgraph goes, since TFLite Micro crashes on any model with two
subgraphs: `convert.without_view_signature`), drops the buffers only the
dropped subgraph used, then TensorFlow's `flatbuffer_utils.strip_strings`
removes the description, subgraph and tensor names and the signature defs:
nothing a runtime needs to run subgraph 0 by input and output position
(docs/field_notes.md has the sizes). A deploy file must compute exactly what
the named model does: `verify_stripped` runs both on the same inputs through
the device's `EdgeModel` and requires bit-identical raw outputs. Without
names a file cannot be debugged (`keras-mha-edge --debug`): debug the named file.

Export side (TensorFlow present); the bundle entry is
`keras_mha_edge.contract.deploy.DeployFile`, written by `devices.add_devices`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from keras_mha_edge.runtimes.model import EdgeModel
from keras_mha_edge.runtimes.runtime import Runtime


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


def strip_model(content: bytes) -> bytes:
    """`content` without description, subgraph and tensor names, and signature defs."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    _prune_buffers(model)
    flatbuffer_utils.strip_strings(model)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def deploy_bytes(model: bytes) -> tuple[bytes, bytes]:
    """(the classifier alone with its names, the deploy file) for a bundle model."""
    from .convert import without_view_signature

    classifier = without_view_signature(model)
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
