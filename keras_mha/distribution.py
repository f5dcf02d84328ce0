"""Our layers on many devices with `keras.distribution` (docs/distribution.md).

A query, key or value kernel is (d_in, h, d) and the output kernel W^O is
(h, d_v, d_out): head i owns `kernel[:, i, :]` and `output_kernel[i]`.
Sharding the h axis over the mesh's model axis gives each device whole heads:
it projects and attends with its own heads, and only W^O's sum over heads
crosses devices (Megatron-LM's split; keras-hub's layout maps for Gemma do
the same). A feed-forward's first kernel is split by its columns and the
second by its rows, so each device contracts the hidden units it computed.
Embeddings, norms and heads of a classifier stay whole on every device.

    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"),
                                         keras.distribution.list_devices())
    layouts = layout_map(model, mesh)          # model: built, on one device
    distribution = keras.distribution.ModelParallel(layout_map=layouts,
                                                    batch_dim_name="batch")
    keras.distribution.set_distribution(distribution)
    sharded = keras.models.clone_model(model)  # the same names, so the same paths
    sharded.set_weights(model.get_weights())

Keras's distribution API shards on JAX (TensorFlow and PyTorch users use
tf.distribute or torch.distributed instead: docs/distribution.md).
"""

from __future__ import annotations

import re

import keras

from keras_mha.train.presets import MESH_DISTRIBUTE as TRAINING  # --distribute KIND

MODEL_AXIS = "model"


def layout_map(model, mesh, model_axis: str = MODEL_AXIS):
    """A `keras.distribution.LayoutMap` for `model` (built) on `mesh`.

    Every attention layer of ours (and Keras's MultiHeadAttention, whose
    kernels are laid out alike) is split by query heads over `model_axis`; its
    key/value heads too when the axis divides them, else they stay whole on
    every device (grouped-query attention with fewer key/value heads than
    devices, as Megatron-LM does). The feed-forward of our encoder and decoder
    blocks is split by its hidden units when the axis divides them, else kept
    whole. Query heads the axis does not divide are refused in one line
    (ValueError) naming the layer and the counts.
    """
    from keras_mha.attention.layer import MultiHeadAttention
    from keras_mha.decoder.layers import SwiGLU
    from keras_mha.layers import TransformerEncoderBlock

    if model_axis not in mesh.axis_names:
        raise ValueError(
            f"the mesh has no axis {model_axis!r} to split heads on; its axes are "
            f"{', '.join(map(repr, mesh.axis_names))}"
        )
    if not model.built:
        raise ValueError(f"{model.name} is not built: build it (call it once) before its layout")
    devices = int(mesh.shape[list(mesh.axis_names).index(model_axis)])
    layouts = keras.distribution.LayoutMap(mesh)
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, (MultiHeadAttention, keras.layers.MultiHeadAttention)):
            specs = _attention_specs(layer, model_axis, devices)
        elif isinstance(layer, TransformerEncoderBlock):
            specs = _ffn_specs([layer._ffn_in], [layer._ffn_out], model_axis, devices)
        elif isinstance(layer, SwiGLU):
            specs = _ffn_specs([layer.gate, layer.up], [layer.down], model_axis, devices)
        else:
            continue
        for variable, axes in specs:
            check_divides(layer.path, variable.path, tuple(variable.shape), axes, mesh)
            layouts[re.escape(variable.path)] = axes
    return layouts


def training_distribution(model, kind: str, devices=None, local: int | None = None):
    """The distribution `keras-mha-train --distribute KIND` trains `model` (built) under,
    over `devices` (default: every device Keras sees), and its mesh shape
    (batch devices, model devices).

    `data`: DataParallel, every weight on every device, the batch split.
    `heads`: ModelParallel on a (batch, model) mesh whose model axis is the
    largest count that divides both the devices and every attention layer's
    query heads (MiniLM's 12 heads on 8 devices: 4, a mesh of 2 x 4), laid out
    by `layout_map`. ValueError (one line) for another kind or a model with no
    attention layer to split, or heads no count above 1 divides with the devices.

    `local`: the devices of each process when several train together (Keras
    lists them process by process). The model axis then divides it too, so a
    layer's heads stay within one process and only the batch axis crosses
    between them, as on a cluster of hosts: heads within a host, data across.
    """
    if kind not in TRAINING:
        raise ValueError(f"unknown distribution {kind!r}; expected one of {', '.join(TRAINING)}")
    devices = list(devices or keras.distribution.list_devices())
    count = len(devices)
    if kind == "data":
        return keras.distribution.DataParallel(devices=devices), (count, 1)
    from keras_mha.attention.layer import MultiHeadAttention

    heads = [
        _kernel(sub).shape[1]
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, (MultiHeadAttention, keras.layers.MultiHeadAttention))
        for sub in _sublayers(layer)
        if sub.name == "query"
    ]
    if not heads:
        raise ValueError(f"{model.name} has no attention layer whose heads could be split")
    within = local or count
    split = max(
        d for d in range(1, within + 1) if within % d == 0 and all(h % d == 0 for h in heads)
    )
    if split == 1:
        where = f"{count} devices" if local is None else f"{local} devices of each process"
        raise ValueError(
            f"no count above 1 divides both the {where} and the heads "
            f"({', '.join(map(str, sorted(set(heads))))}): the heads cannot be split; "
            "use data parallel"
        )
    mesh = keras.distribution.DeviceMesh((count // split, split), ("batch", MODEL_AXIS), devices)
    distribution = keras.distribution.ModelParallel(
        layout_map=layout_map(model, mesh), batch_dim_name="batch"
    )
    return distribution, (count // split, split)


def rows_left_out(rows: int, batch_size: int, batch_devices: int) -> int:
    """The rows of an array a distributed fit leaves out: the last batch (`rows`
    mod `batch_size`) must split over the batch axis too, so it loses its rows
    past the last multiple of `batch_devices` (fewer than `batch_devices`)."""
    return rows % batch_size % batch_devices


def _kernel(dense):
    """The kernel variable (`.kernel` is a computed array once LoRA is on)."""
    kernel = getattr(dense, "_kernel", None)
    return dense.kernel if kernel is None else kernel


def _attention_specs(layer, axis: str, devices: int):
    """(variable, axes) of an attention layer's projections: heads on `axis`.

    Query (and gate) heads and W^O always (check_divides refuses a count the
    axis does not divide); key/value heads when the axis divides them."""
    out = []
    for dense in _sublayers(layer):
        kernel = _kernel(dense)
        if dense.name == "attention_output":  # (h, d_v, *d_out); its bias stays whole
            out.append((kernel, (axis,) + (None,) * (len(kernel.shape) - 1)))
            continue
        heads = kernel.shape[1]  # (d_in, h, d), its bias (h, d)
        if dense.name in ("key", "value") and heads % devices:
            continue  # fewer key/value heads than the axis splits: whole on every device
        out.append((kernel, (None, axis) + (None,) * (len(kernel.shape) - 2)))
        if getattr(dense, "bias", None) is not None:
            out.append((dense.bias, (axis,) + (None,) * (len(dense.bias.shape) - 1)))
    return out


def _sublayers(layer):
    """Its projections: Dense layers named as Keras's (ours and Keras's layer alike)."""
    names = ("query", "key", "value", "gate", "attention_output")
    return [
        sub
        for sub in layer._flatten_layers(include_self=False, recursive=False)
        if sub.name in names and getattr(sub, "kernel", None) is not None
    ]


def _ffn_specs(first, second, axis: str, devices: int):
    """Column-split the first Dense layers (and their biases), row-split the
    second; all whole when the axis does not divide the hidden units."""
    if any(_kernel(dense).shape[-1] % devices for dense in first):
        return []
    out = []
    for dense in first:
        out.append((_kernel(dense), (None, axis)))
        if dense.bias is not None:
            out.append((dense.bias, (axis,)))
    for dense in second:
        out.append((_kernel(dense), (axis, None)))
    return out


def check_divides(where: str, path: str, shape: tuple, axes, mesh) -> None:
    """One line (ValueError) when a mesh axis in `axes` (as long as `shape` or
    shorter, as Keras takes them) does not divide its dimension."""
    for dim, (size_of_dim, name) in enumerate(zip(shape, axes)):
        if name is None:
            continue
        size = int(mesh.shape[list(mesh.axis_names).index(name)])
        if size_of_dim % size:
            what = _what(path, dim)
            raise ValueError(
                f"{where}: {size_of_dim} {what} of {path} {shape} do not divide over the "
                f"{size} devices of mesh axis {name!r}; use a mesh whose {name!r} axis "
                f"divides {size_of_dim}"
            )


def _what(path: str, dim: int) -> str:
    """What dimension `dim` of the variable at `path` counts."""
    name, variable = path.rsplit("/", 2)[-2:]
    if name in ("query", "key", "value", "gate"):
        if variable == "bias":
            return "heads" if dim == 0 else "features"
        return ("input features", "heads", "features")[min(dim, 2)]
    if name == "attention_output" and variable == "kernel":
        return "heads" if dim == 0 else "features"
    return "units"


class _Probe:
    """What `Distribution.get_variable_layout` reads of a variable not yet made."""

    _layout = None

    def __init__(self, path: str, shape: tuple):
        self.path, self.shape = path, shape


def check_layer_layout(layer, variables: dict[str, tuple]) -> None:
    """Before `layer` makes its variables (`{sublayer/name: shape}`): under a
    ModelParallel distribution, a layout that splits a dimension over a mesh
    axis that does not divide it is refused in one line naming the layer and
    the counts, instead of failing inside XLA when the variable is placed."""
    distribution = keras.distribution.distribution()
    if not isinstance(distribution, keras.distribution.ModelParallel):
        return
    for name, shape in variables.items():
        path = f"{layer.path}/{name}"
        layout = distribution.get_variable_layout(_Probe(path, tuple(shape)))
        mesh = layout.device_mesh or distribution.device_mesh
        if layout.axes is not None and len(layout.axes) <= len(shape):
            check_divides(layer.path, path, tuple(shape), layout.axes, mesh)
