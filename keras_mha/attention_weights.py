"""The layer's weights as the lesson reads them, and as others store them.

Free functions of explicit arguments: `EinsumDense` projections (read and
written through their public `kernel` and `bias`), arrays, head indices. The
layer's `head_weights`, `pruned`, `from_keras`, `to_keras` and
`load_own_variables` (attention.py) call them.

- `head_slice(dense, i)`: head i's W_i and b_i, a slice of the head axis.
- `copy_projection(source, target, heads)`: one projection's weights into
  another of the same layout (`keras.layers.MultiHeadAttention` has the same
  sublayers and kernel shapes), optionally keeping only some heads.
- `load_legacy_variables`: keras_mha 0.1 kept its weights on the layer
  itself, heads first (`query_kernel` (h, d_model, d_k), `output_kernel`
  (h * d_v, d_out)); its files are read into today's layout.
"""

from __future__ import annotations

import numpy as np
from keras import ops


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
