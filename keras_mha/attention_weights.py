"""The layer's weights as the lesson reads them, and as others store them.

- `head_weights(layer, i)`: head i's W_i^Q, W_i^K, W_i^V (gate), biases and
  its block of W^O as numpy arrays: slices of the head axis of the kernels.
- `pruned(layer, keep)`: a smaller layer with only some heads.
- `from_keras` / `to_keras`: `keras.layers.MultiHeadAttention` has the same
  sublayers and kernel shapes, so each projection is copied as it is.
- `load_legacy_variables`: keras_mha 0.1 kept its weights on the layer
  itself, heads first (`query_kernel` (h, d_model, d_k), `output_kernel`
  (h * d_v, d_out)); its files are read into today's layout.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

_INPUT_PROJECTIONS = ("_query_dense", "_key_dense", "_gate_dense", "_value_dense")


def _float_kernel(dense, what: str):
    if dense.quantization_mode is not None:
        raise ValueError(
            f"`{what}` needs float weights; the `{dense.name}` projection is quantized "
            f"({dense.quantization_mode}). Read the weights before quantizing."
        )
    return ops.convert_to_numpy(dense.kernel)  # LoRA included


def _check_head(layer, i) -> None:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < layer.num_heads:
        raise ValueError(
            f"Head index must be an integer in [0, {layer.num_heads}). Received: i={i!r}"
        )


def head_weights(layer, i: int) -> dict[str, np.ndarray]:
    layer._require_built("head_weights")
    _check_head(layer, i)
    out = {}
    names = [("query", layer._query_dense), ("key", layer._key_dense)]
    if layer.use_gate:
        names.append(("gate", layer._gate_dense))
    names.append(("value", layer._value_dense))
    for name, dense in names:
        kernel = _float_kernel(dense, "head_weights")  # (d_in, h, d)
        out[f"{name}_kernel"] = kernel[:, i, :]  # W_i
        bias = dense.bias
        out[f"{name}_bias"] = (
            np.zeros(kernel.shape[-1], kernel.dtype)
            if bias is None
            else ops.convert_to_numpy(bias)[i]
        )
    out["output_kernel"] = _float_kernel(layer._output_dense, "head_weights")[i]  # (d_v, d_out)
    return out


def _input_shapes(layer):
    """Build shapes (query, value, key) with the layer's rank and widths."""
    pad = (None,) * (layer._axes.rank - 1)
    return pad + (layer.d_model,), pad + (layer._d_value_in,), pad + (layer._d_key_in,)


def _copy_projections(source, target, heads=None) -> None:
    """kernel and bias of each projection, head axis sliced by `heads`."""
    for attr in _INPUT_PROJECTIONS + ("_output_dense",):
        src, dst = getattr(source, attr, None), getattr(target, attr, None)
        if src is None:
            continue
        kernel = _float_kernel(src, "copying weights")
        bias = None if src.bias is None else ops.convert_to_numpy(src.bias)
        if heads is not None and attr == "_output_dense":
            kernel = kernel[heads]  # (h, d_v, d_out): head i's rows of W^O
        elif heads is not None:
            kernel = kernel[:, heads]  # (d_in, h, d)
            bias = None if bias is None else bias[heads]
        dst._kernel.assign(kernel)
        if bias is not None:
            dst.bias.assign(bias)


def pruned(layer, keep_heads):
    layer._require_built("pruned")
    keep = sorted({int(i) for i in keep_heads})
    if not keep:
        raise ValueError("`keep_heads` must keep at least one head. Received: keep_heads=[]")
    if keep[0] < 0 or keep[-1] >= layer.num_heads:
        raise ValueError(
            f"`keep_heads` must be head indices in [0, {layer.num_heads}). "
            f"Received: keep_heads={list(keep_heads)}"
        )
    config = layer.get_config()
    config.update(
        num_heads=len(keep), key_dim=layer.d_k, value_dim=layer.d_v, output_shape=layer._d_out
    )
    new = type(layer).from_config(config)
    new.build(*_input_shapes(layer))
    _copy_projections(layer, new, np.array(keep))
    return new


def _keras_rank(keras_layer) -> int:
    """Input rank of a built Keras layer, read from its query equation."""
    return len(keras_layer.query_dense.equation.split(",")[0])


def from_keras(cls, keras_layer, implementation: str = "fused"):
    if not isinstance(keras_layer, keras.layers.MultiHeadAttention):
        raise ValueError(
            "`from_keras` expects a keras.layers.MultiHeadAttention. "
            f"Received: {type(keras_layer).__name__}"
        )
    if not keras_layer.built:
        raise ValueError(
            "`from_keras` needs a built keras.layers.MultiHeadAttention "
            "(call it on an input first)."
        )
    config = keras_layer.get_config()
    config.pop("flash_attention", None)
    rank = _keras_rank(keras_layer)
    # Keras resolves attention_axes in build, in projected coordinates.
    axes = config.get("attention_axes")
    if axes is not None:
        config["attention_axes"] = tuple(a if a >= 0 else rank + a for a in axes)
    new = cls.from_config({**config, "implementation": implementation})
    new._flash_attention = keras_layer._flash_attention
    new._flash_attention_arg = keras_layer._flash_attention
    pad = (None,) * (rank - 1)
    kernel = keras_layer.query_dense.kernel
    new.build(
        pad + (kernel.shape[0],),
        pad + (keras_layer.value_dense.kernel.shape[0],),
        pad + (keras_layer.key_dense.kernel.shape[0],),
    )
    _copy_projections(keras_layer, new)
    return new


def to_keras(layer):
    layer._require_built("to_keras")
    config = layer.get_config()
    for ours_only in ("implementation", "flash_attention"):
        config.pop(ours_only)
    config.update(key_dim=layer.d_k, value_dim=layer.d_v)
    config["dtype"] = layer.dtype_policy
    keras_layer = keras.layers.MultiHeadAttention.from_config(config)
    keras_layer._flash_attention = layer._flash_attention
    keras_layer.build(*_input_shapes(layer))
    _copy_projections(layer, keras_layer)
    return keras_layer


def load_legacy_variables(layer, store) -> None:
    """Assign keras_mha 0.1 weights (own variables, heads first) to the
    projections, which then skip their own (absent) entries once."""
    values = [np.asarray(store[str(i)]) for i in range(len(store.keys()))]
    expected = 8 if layer.use_bias else 4
    if len(values) != expected or layer.use_gate:
        raise ValueError(
            f"Layer '{layer.name}' found {len(values)} variables of a keras_mha 0.1 "
            f"file; expected {expected} (query, key, value, output kernels"
            f"{' and biases' if layer.use_bias else ''})."
        )
    step = 2 if layer.use_bias else 1
    kernels, biases = values[::step], values[1::step] if layer.use_bias else [None] * 4
    h, d_v = layer.num_heads, layer.d_v
    for attr, kernel, bias in zip(
        ("_query_dense", "_key_dense", "_value_dense", "_output_dense"), kernels, biases
    ):
        dense = getattr(layer, attr)
        if attr == "_output_dense":
            kernel = kernel.reshape((h, d_v) + tuple(dense._kernel.shape[2:]))  # (h*d_v, d) ->
        else:
            kernel = np.transpose(kernel, (1, 0, 2))  # (h, d_in, d) -> (d_in, h, d)
        dense._kernel.assign(kernel)
        if bias is not None:
            dense.bias.assign(bias)
        _skip_next_load(dense)


def _skip_next_load(dense) -> None:
    def skip(store):
        object.__delattr__(dense, "load_own_variables")

    object.__setattr__(dense, "load_own_variables", skip)
