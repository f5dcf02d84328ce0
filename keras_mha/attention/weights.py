"""The layer's weights as the lesson reads them, and as others store them.

Functions of explicit arguments: `EinsumDense` projections (read and
written through their public `kernel` and `bias`), arrays, head indices, and
the layer itself for its per-head accessors. The layer's `head_weights`,
`pruned`, `from_keras`, `to_keras`, its kernel and bias properties and
`load_own_variables` (layer.py) call them.

- `head_weights(layer, i)`: head i's matrices; `head_slice(dense, i)`, one
  projection's W_i and b_i, a slice of the head axis.
- `pruned(layer, keep_heads)`: a new layer with only those heads.
- `from_keras(cls, layer)`, `to_keras(layer)`: to and from
  `keras.layers.MultiHeadAttention`, which has the same sublayers and kernel
  shapes; `projections(layer)` names either layer's sublayers and
  `copy_projections` copies them, optionally keeping only some heads.
- `load_legacy_variables`: keras_mha 0.1 kept its weights on the layer
  itself, heads first (`query_kernel` (h, d_model, d_k), `output_kernel`
  (h * d_v, d_out)); its files are read into today's layout.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

# The projections' public names (private ones: a leading "_"), in Keras's
# order, and their sublayer names.
PROJECTIONS = (
    ("query_dense", "query"),
    ("key_dense", "key"),
    ("gate_dense", "gate"),
    ("value_dense", "value"),
    ("output_dense", "attention_output"),
)


def kernel_of(dense):
    """The projection's kernel variable (None before build): the stored
    variable, int8 once quantized, without LoRA (`dense.kernel` adds LoRA)."""
    if dense is None:
        return None
    return next(w for w in dense.weights if w.name == "kernel")


def bias_of(dense):
    return None if dense is None else dense.bias


def require_built(layer, what: str) -> None:
    if not layer.built:
        raise ValueError(f"`{what}` needs a built layer; call the layer on an input first.")


def float_kernel(dense, what: str) -> np.ndarray:
    """`dense`'s kernel as numpy (LoRA included); ValueError if quantized."""
    if dense.quantization_mode is not None:
        raise ValueError(
            f"`{what}` needs float weights; the `{dense.name}` projection is quantized "
            f"({dense.quantization_mode}). Read the weights before quantizing."
        )
    return ops.convert_to_numpy(dense.kernel)


def check_head_index(i, num_heads: int) -> None:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < num_heads:
        raise ValueError(f"Head index must be an integer in [0, {num_heads}). Received: i={i!r}")


def head_slice(dense, i: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Head i's `(W_i, b_i)` of an input projection: `kernel[:, i, :]`
    `(d_in, d)` and `bias[i]` `(d,)` (zeros without a bias)."""
    kernel = float_kernel(dense, what)  # (d_in, h, d)
    if dense.bias is None:
        return kernel[:, i, :], np.zeros(kernel.shape[-1], kernel.dtype)
    return kernel[:, i, :], ops.convert_to_numpy(dense.bias)[i]


def sorted_heads(keep_heads, num_heads: int) -> list[int]:
    """`keep_heads` as sorted unique indices; ValueError if empty or out of range."""
    keep = sorted({int(i) for i in keep_heads})
    if not keep:
        raise ValueError("`keep_heads` must keep at least one head. Received: keep_heads=[]")
    if keep[0] < 0 or keep[-1] >= num_heads:
        raise ValueError(
            f"`keep_heads` must be head indices in [0, {num_heads}). "
            f"Received: keep_heads={list(keep_heads)}"
        )
    return keep


def copy_projection(source, target, heads=None, head_axis: int = 1) -> None:
    """`source`'s kernel and bias into the built float `target` (same layout).

    `heads`: indices to keep along the kernel's `head_axis` (1 for the input
    projections' (d_in, h, d) kernels and (h, d) biases, 0 for W^O's
    (h, d_v, d_out) kernel, whose bias has no head axis).
    """
    kernel = float_kernel(source, "copying weights")
    bias = None if source.bias is None else ops.convert_to_numpy(source.bias)
    if heads is not None:
        kernel = np.take(kernel, heads, axis=head_axis)
        if bias is not None and head_axis == 1:
            bias = bias[heads]
    target.kernel.assign(kernel)
    if bias is not None:
        target.bias.assign(bias)


def keras_input_rank(keras_layer) -> int:
    """Input rank of a built `keras.layers.MultiHeadAttention`, read from its
    query projection's einsum equation."""
    return len(keras_layer.query_dense.equation.split(",")[0])


def projections(layer) -> dict:
    """`{"query": query_dense, ..., "output": output_dense}` of our layer or
    of `keras.layers.MultiHeadAttention` (gate: None without `use_gate`;
    Keras has no public name for it)."""
    return {
        "query": layer.query_dense,
        "key": layer.key_dense,
        "gate": getattr(layer, "_gate_dense", None),
        "value": layer.value_dense,
        "output": layer.output_dense,
    }


def copy_projections(*, sources: dict, targets: dict, heads=None) -> None:
    """Each source projection's weights into its target, keeping `heads`."""
    for name, source in sources.items():
        if source is not None:
            head_axis = 0 if name == "output" else 1  # W^O: (h, d_v, d_out)
            copy_projection(source, targets[name], heads=heads, head_axis=head_axis)


# ------------------------------------------------- the layer's per-head access
def head_weights(layer, i: int) -> dict[str, np.ndarray]:
    """`layer.head_weights(i)`: head i's own matrices as numpy arrays."""
    require_built(layer, "head_weights")
    check_head_index(i, num_heads=layer.num_heads)
    out = {}
    for attr, name in PROJECTIONS[:-1]:
        dense = getattr(layer, attr)
        if dense is not None:  # key and value: the key/value head of head i's group
            index = i // layer.group_size if name in ("key", "value") else i
            out[f"{name}_kernel"], out[f"{name}_bias"] = head_slice(dense, index, "head_weights")
    out["output_kernel"] = float_kernel(layer.output_dense, "head_weights")[i]
    return out


def pruned(layer, keep_heads):
    """`layer.pruned(keep_heads)`: a new, built layer with only those heads."""
    require_built(layer, "pruned")
    if layer.group_size > 1:
        raise ValueError(
            "`pruned` removes heads of multi-head attention; this layer groups its "
            f"{layer.num_heads} query heads over {layer.num_key_value_heads} key/value heads "
            "(prune it with head_mask instead)"
        )
    keep = sorted_heads(keep_heads, num_heads=layer.num_heads)
    config = layer.get_config()
    config.update(
        num_heads=len(keep), key_dim=layer.d_k, value_dim=layer.d_v, output_shape=layer._d_out
    )
    new = type(layer).from_config(config)
    new.build(*layer._input_shapes())
    copy_projections(sources=projections(layer), targets=projections(new), heads=np.array(keep))
    return new


def from_keras(cls, layer, implementation: str):
    """`cls.from_keras(layer)`: a `cls` built from a built
    `keras.layers.MultiHeadAttention`, its weights copied as they are."""
    if not isinstance(layer, keras.layers.MultiHeadAttention):
        raise ValueError(
            "`from_keras` expects a keras.layers.MultiHeadAttention. "
            f"Received: {type(layer).__name__}"
        )
    if not layer.built:
        raise ValueError(
            "`from_keras` needs a built keras.layers.MultiHeadAttention "
            "(call it on an input first)."
        )
    config = layer.get_config()
    config.pop("flash_attention", None)
    rank = keras_input_rank(layer)
    # Keras resolves attention_axes in build, in projected coordinates.
    axes = config.get("attention_axes")
    if axes is not None:
        config["attention_axes"] = tuple(a if a >= 0 else rank + a for a in axes)
    new = cls.from_config({**config, "implementation": implementation})
    # Keras's resolved flash setting (its argument or the global switch).
    new._flash_attention = new._flash_attention_arg = layer._flash_attention
    pad = (None,) * (rank - 1)
    new.build(
        pad + (layer.query_dense.kernel.shape[0],),
        pad + (layer.value_dense.kernel.shape[0],),
        pad + (layer.key_dense.kernel.shape[0],),
    )
    copy_projections(sources=projections(layer), targets=projections(new))
    return new


def to_keras(layer) -> keras.layers.MultiHeadAttention:
    """`layer.to_keras()`: the equivalent built `keras.layers.MultiHeadAttention`."""
    require_built(layer, "to_keras")
    if layer.group_size > 1:
        raise ValueError(
            "`to_keras` makes a keras.layers.MultiHeadAttention; this layer groups its "
            f"query heads over {layer.num_key_value_heads} key/value heads"
        )
    config = layer.get_config()
    for ours_only in ("implementation", "flash_attention"):
        config.pop(ours_only)
    config.update(key_dim=layer.d_k, value_dim=layer.d_v)
    config["dtype"] = layer.dtype_policy
    new = keras.layers.MultiHeadAttention.from_config(config)
    new._flash_attention = layer._flash_attention  # Keras's resolved flash setting
    new.build(*layer._input_shapes())
    copy_projections(sources=projections(layer), targets=projections(new))
    return new


def load_legacy_variables(
    store,
    *,
    query,
    key,
    value,
    output,
    num_heads: int,
    d_v: int,
    use_bias: bool,
    use_gate: bool,
    layer_name: str,
) -> None:
    """Assign keras_mha 0.1 weights (a variable store of the layer's own
    variables, heads first) to the projections `query`, `key`, `value`,
    `output`, which then skip their own (absent) entries once."""
    values = [np.asarray(store[str(i)]) for i in range(len(store.keys()))]
    expected = 8 if use_bias else 4
    if len(values) != expected or use_gate:  # 0.1 had no gate
        raise ValueError(
            f"Layer '{layer_name}' found {len(values)} variables of a keras_mha 0.1 "
            f"file; expected {expected} (query, key, value, output kernels"
            f"{' and biases' if use_bias else ''})."
        )
    step = 2 if use_bias else 1
    kernels, biases = values[::step], values[1::step] if use_bias else [None] * 4
    for dense, kernel, bias in zip((query, key, value, output), kernels, biases):
        if dense is output:  # (h * d_v, *d_out) -> (h, d_v, *d_out)
            kernel = kernel.reshape((num_heads, d_v) + tuple(dense.kernel.shape[2:]))
        else:  # (h, d_in, d) -> (d_in, h, d)
            kernel = np.transpose(kernel, (1, 0, 2))
        dense.kernel.assign(kernel)
        if bias is not None:
            dense.bias.assign(bias)
        _skip_next_load(dense)


def _skip_next_load(dense) -> None:
    """The loader calls each sublayer's `load_own_variables` next; there are
    no entries for it in a 0.1 file, so the next call does nothing."""

    def skip(store):
        object.__delattr__(dense, "load_own_variables")

    object.__setattr__(dense, "load_own_variables", skip)
