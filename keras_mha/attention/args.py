"""The constructor's arguments and the input shapes of `keras_mha.MultiHeadAttention`.

Free functions of explicit arguments (no layer state), used by the layer in
layer.py; each raises the ValueError Keras's layer raises for the same
mistake, or one in its words:

- `check_constructor_args`: `num_heads`, `key_dim`, `value_dim`, `dropout`,
  `implementation` and `sliding_window`, in that order.
- `output_shape_arg`, `attention_axes_arg`: those arguments as tuples of ints.
- `check_key_value`: `value` and `key` differ only in their features.
- `resolve_dims`: the lesson's `(d_model, d_k, d_v)` for a call's input shapes.
"""

from __future__ import annotations

import numpy as np

IMPLEMENTATIONS = ("fused", "per_head")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not _is_int(value) or value <= 0:
        expected = "a positive integer" + (" or `None`" if allow_none else "")
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected "
            f"{expected}. Received: {name}={value!r}"
        )


def check_constructor_args(
    *,
    num_heads,
    key_dim,
    value_dim,
    dropout,
    implementation,
    sliding_window,
    num_key_value_heads=None,
) -> None:
    check_positive_int("num_heads", num_heads)
    check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
    if num_key_value_heads is not None and num_heads % num_key_value_heads:
        raise ValueError(
            "`num_query_heads` must be divisible by `num_key_value_heads`. Received: "
            f"num_heads={num_heads}, num_key_value_heads={num_key_value_heads}"
        )
    check_positive_int("key_dim", key_dim, allow_none=True)
    check_positive_int("value_dim", value_dim, allow_none=True)
    if (
        isinstance(dropout, bool)
        or not isinstance(dropout, (int, float))
        or not 0.0 <= dropout < 1.0
    ):
        raise ValueError(
            "Received an invalid value for argument `dropout`, expected a "
            f"float in [0, 1). Received: dropout={dropout!r}"
        )
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            "Received an invalid value for argument `implementation`, "
            f"expected one of {IMPLEMENTATIONS}. "
            f"Received: implementation={implementation!r}"
        )
    if sliding_window is not None and (not _is_int(sliding_window) or sliding_window <= 0):
        raise ValueError(
            "`sliding_window` must be `None` or a positive integer. "
            f"Received: sliding_window={sliding_window!r}"
        )


def output_shape_arg(output_shape):
    """`output_shape` (None, an int or a sequence of ints) as a tuple or None."""
    if output_shape is None:
        return None
    if _is_int(output_shape):
        output_shape = (output_shape,)
    try:
        shape = tuple(output_shape)
    except TypeError:
        shape = None
    if not shape or any(not _is_int(d) or d <= 0 for d in shape):
        raise ValueError(
            f"Invalid `output_shape`: {output_shape!r}. When specified, the "
            "`output_shape` should be a positive int or a tuple or list of them."
        )
    return tuple(int(d) for d in shape)


def attention_axes_arg(attention_axes):
    """`attention_axes` (None, an int or a list or tuple of ints) as a tuple or None."""
    if _is_int(attention_axes):
        return (int(attention_axes),)
    if attention_axes is None:
        return None
    if not isinstance(attention_axes, (list, tuple)) or not all(_is_int(a) for a in attention_axes):
        raise ValueError(
            "`attention_axes` must be an int, list, or tuple of ints. "
            f"Received: attention_axes={attention_axes!r}"
        )
    return tuple(int(a) for a in attention_axes)


def check_key_value(value_shape, key_shape) -> None:
    if tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, "
            f"must be equal. Received: value_shape={tuple(value_shape)} and "
            f"key_shape={tuple(key_shape)}"
        )


def resolve_dims(query_shape, value_shape, key_shape, *, num_heads: int, key_dim, value_dim):
    """`(d_model, d_k, d_v)` for these input shapes and the constructor's
    `num_heads`, `key_dim`, `value_dim`; ValueError if they cannot be
    attention inputs."""
    check_key_value(value_shape, key_shape)
    for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
        if len(shape) < 3:
            raise ValueError(
                f"`{name}` must have rank >= 3 (batch, sequence, features). "
                f"Received: {name}.shape={tuple(shape)}"
            )
        if shape[-1] is None:
            raise ValueError(
                f"The last dimension of `{name}` must be known. "
                f"Received: {name}.shape={tuple(shape)}"
            )
    if len(value_shape) != len(query_shape):
        raise ValueError(
            "`query` and `value` must have the same rank. Received: "
            f"query.shape={tuple(query_shape)}, value.shape={tuple(value_shape)}"
        )
    d_model = int(query_shape[-1])
    if key_dim is None:
        if d_model % num_heads:
            raise ValueError(
                "With `key_dim=None`, the query feature size d_model must "
                f"be divisible by `num_heads` (d_k = d_model / h). "
                f"Received: d_model={d_model}, num_heads={num_heads}"
            )
        key_dim = d_model // num_heads
    return d_model, key_dim, value_dim or key_dim
