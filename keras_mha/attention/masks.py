"""Masks, attention axes and input shapes for `keras_mha.MultiHeadAttention`.

Free functions of explicit arguments (no layer state), used by the layer
(layer.py):

- `resolve_inputs`: a call's query, value, key and their masks, as Keras
  reads them; `plain_inputs`: the same for a plain method (`concat_heads`).
- `causal_mask`, `sliding_window_mask`: `(1, T, S)` masks; `attention_mask_of`:
  every mask of a call combined; `mask_for_head`: head i's `(B, T, S)` slice.
- `mask_scores`, `zero_masked_rows`: the masked softmax's two ends.
- `head_mask_tensor`: the `head_mask` call argument (a multiplier per head,
  for head analysis) as a `(B or 1, h)` tensor.
- `check_input_masks`: Keras's rules for query/value/key masks.
- `AttentionAxes`: where attention runs in an input of any rank, and
  `projection_equation`, the projections' einsum equations.

`keras.layers.MultiHeadAttention` attends over `attention_axes` of a
`(B, <dims>, features)` input; the other `<dims>` act as extra batch axes.
Projected, a query is `(B, <dims>, h, d_k)` and the scores are

    (B, <non-attention dims>, h, <query attention dims>, <key attention dims>)

`AttentionAxes` moves a projected tensor to the lesson's 4-D form
`(B', h, T, d)` (B' = batch times the non-attention dims, T = the attention
dims flattened) and back, so the fused path computes the lesson's
softmax(q k^T / sqrt(d_k)) v on `(B', h, T, S)` scores whatever the rank. For
rank-3 inputs (the default axes, the lesson's case) every move is the
transpose `(B, T, h, d) <-> (B, h, T, d)`.

Masks follow Keras's broadcasting: a mask with fewer axes than the scores
gains axes just before the query attention dims (the head axis first), so
`(T, S)`, `(B, T, S)` and `(B, h, T, S)` all apply to `(B, h, T, S)` scores.
"""

from __future__ import annotations

import math
import string
from typing import NamedTuple

import numpy as np
from keras import ops

try:  # The mask a tensor carries (Embedding(mask_zero=True), Masking, ...).
    from keras.src.backend import get_keras_mask, set_keras_mask
except ImportError:  # pragma: no cover - older/newer layouts

    def get_keras_mask(x):
        return getattr(x, "_keras_mask", None)

    def set_keras_mask(x, mask):
        if mask is None and hasattr(x, "_keras_mask"):
            del x._keras_mask


class InputMasks(NamedTuple):
    """A call's boolean masks per position: query `(B, T)`, value and key `(B, S)`."""

    query: object = None
    value: object = None
    key: object = None


def resolve_inputs(query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None):
    """`(query, value, key, InputMasks)` as `keras.layers.MultiHeadAttention`
    reads a call.

    Every mask given is used, for its own tensor; one not given is the mask
    that tensor carries (`Embedding(mask_zero=True)`, `Masking`), which is
    what Keras's `Layer.__call__` fills in. `value` omitted is the query
    (Keras's `mha(x, x)`): its mask is `value_mask`, or else the one the query
    carries, never an explicit `query_mask`. `key` omitted is the value (as
    in Keras): `key_mask` is then only an explicit one, the value's mask
    already covering that tensor. Unlike Keras 3.15, which reads the query's
    carried mask only and drops an explicit `query_mask`, an explicit
    `query_mask` is used (and replaces the carried one, as the others do).
    """
    carried = get_keras_mask(query)
    if query_mask is None:
        query_mask = carried
    if value is None:
        value = query
        if value_mask is None:
            value_mask = carried
    elif value_mask is None:
        value_mask = get_keras_mask(value)
    if key is None:
        key = value
    elif key_mask is None:
        key_mask = get_keras_mask(key)
    return query, value, key, InputMasks(query=query_mask, value=value_mask, key=key_mask)


def plain_inputs(
    dtype, query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None
):
    """`resolve_inputs` for a plain method, not a Keras call: Keras's
    `__call__` fills in the carried masks and casts the inputs there. Each
    tensor is cast to `dtype`, and one that carries a mask is copied without
    it (the projections would warn of it), leaving the caller's tensor as it
    was."""
    *tensors, masks = resolve_inputs(query, value, key, query_mask, value_mask, key_mask)
    plain = {}
    for x in tensors:
        if id(x) not in plain:
            y = ops.cast(x, dtype)
            plain[id(x)] = ops.copy(y) if get_keras_mask(y) is not None else y
    query, value, key = (plain[id(x)] for x in tensors)
    return query, value, key, masks


def projection_equation(free_dims: int, bound_dims: int, output_dims: int):
    """Einsum equation of a projection: `(equation, bias_axes, output_rank)`.

    The same equations as Keras's layer: `abc,cde->abde` projects a
    `(B, T, d_model)` query into `(B, T, h, d_k)` with a `(d_model, h, d_k)`
    kernel.
    """
    letters = string.ascii_lowercase
    free = letters[:free_dims]
    bound = letters[free_dims : free_dims + bound_dims]
    out = letters[free_dims + bound_dims : free_dims + bound_dims + output_dims]
    return f"{free}{bound},{bound}{out}->{free}{out}", out, free_dims + output_dims


def _dims(x) -> list:
    """Static sizes where known, dynamic ones (scalar tensors) elsewhere."""
    dynamic = None
    dims = []
    for i, d in enumerate(x.shape):
        if d is None:
            dynamic = ops.shape(x) if dynamic is None else dynamic
            d = dynamic[i]
        dims.append(d)
    return dims


def _prod(dims):
    out = 1
    for d in dims:
        out = out * d
    return out


class AttentionAxes:
    """The attention axes of a rank-`rank` input (batch first, features last).

    `axes` are input axes (negative ones count from the end, as in Keras);
    `None` means every axis but the batch and the features.
    """

    def __init__(self, rank: int, axes):
        self.rank = rank
        if axes is None:
            axes = tuple(range(1, rank - 1))
        self.axes = tuple(a if a >= 0 else rank + a for a in axes)
        if not self.axes or any(not 0 < a < rank - 1 for a in self.axes):
            raise ValueError(
                "`attention_axes` must name axes between the batch axis and the "
                f"feature axis of a rank-{rank} input (1 .. {rank - 2}, or negative). "
                f"Received: attention_axes={tuple(axes)}"
            )
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f"`attention_axes` repeats an axis. Received: {tuple(axes)}")
        self.batch_axes = tuple(a for a in range(rank - 1) if a not in self.axes)
        self.simple = self.batch_axes == (0,) and self.axes == (1,)
        # Attention over the last axis before the features only: the one
        # layout where Keras's [B, T, 1] & [B, 1, S] input masks line up
        # with the scores (query_mask, value_mask, key_mask).
        self.last_axis_only = self.axes == (rank - 2,)
        # A projected tensor (B, <dims>, h, d): head axis rank - 1, channel rank.
        self._to_heads = self.batch_axes + (rank - 1,) + self.axes + (rank,)
        self._from_heads = tuple(self._to_heads.index(i) for i in range(rank + 1))

    @property
    def scores_rank(self) -> int:
        return len(self.batch_axes) + 1 + 2 * len(self.axes)

    def scores_shape(self, query_shape, key_shape, num_heads: int) -> tuple:
        """Keras's score shape: (B, <non-attention dims>, h, <T dims>, <S dims>)."""
        return (
            tuple(query_shape[a] for a in self.batch_axes)
            + (num_heads,)
            + tuple(query_shape[a] for a in self.axes)
            + tuple(key_shape[a] for a in self.axes)
        )

    def einsum_equations(self) -> tuple[str, str]:
        """Keras's `_dot_product_equation` (k, q -> scores) and
        `_combine_equation` (scores, v -> heads) for the projected tensors
        (B, <dims>, h, d), as `keras.layers.MultiHeadAttention` names them.
        Our paths do not use them; subclasses written for Keras's layer
        (keras-hub's) read them. Rank-3 inputs: "aecd,abcd->acbe" and
        "acbe,aecd->abcd"."""
        rank = self.rank + 1  # the projected rank
        letters = "abcdefghijklmnopqrstuvwxyz"
        target = letters[:rank]
        kept = set(self.batch_axes) | {rank - 2, rank - 1}  # batch dims, heads, channels
        extra = iter(letters[rank:])
        source = "".join(target[i] if i in kept else next(extra) for i in range(rank))
        batch = [i for i in range(rank - 1) if i not in self.axes]  # includes the heads
        product = "".join(
            [target[i] for i in batch]
            + [target[i] for i in self.axes]
            + [source[i] for i in self.axes]
        )
        return f"{source},{target}->{product}", f"{product},{source}->{target}"

    # ----------------------------------------------------- all heads at once
    def to_heads(self, x):
        """(B, <dims>, h, d) -> (B', h, T, d)."""
        y = ops.transpose(x, self._to_heads)
        if self.simple:
            return y
        dims = _dims(y)
        nb, na = len(self.batch_axes), len(self.axes)
        return ops.reshape(
            y, (_prod(dims[:nb]), dims[nb], _prod(dims[nb + 1 : nb + 1 + na]), dims[-1])
        )

    def from_heads(self, y, like):
        """(B', h, T, d) -> (B, <dims>, h, d), `like` giving the <dims>."""
        if not self.simple:
            dims = _dims(like)
            shape = [dims[a] for a in self.batch_axes] + [y.shape[1]]
            shape += [dims[a] for a in self.axes] + [y.shape[-1]]
            y = ops.reshape(y, shape)
        return ops.transpose(y, self._from_heads)

    # --------------------------------------------------------------- scores
    def unflatten_scores(self, scores, query, key):
        """(B', h, T, S) -> Keras's score shape, from the (projected) inputs."""
        if self.simple:
            return scores
        q, k = _dims(query), _dims(key)
        shape = [q[a] for a in self.batch_axes] + [scores.shape[1]]
        shape += [q[a] for a in self.axes] + [k[a] for a in self.axes]
        return ops.reshape(scores, shape)

    def expand_mask(self, mask):
        """A mask with fewer axes than the scores gains them as Keras adds
        them: just before the query attention dims (the head axis first)."""
        axis = -2 * len(self.axes) - 1
        for _ in range(self.scores_rank - len(mask.shape)):
            mask = ops.expand_dims(mask, axis)
        return mask

    def flatten_mask(self, mask, query, key):
        """A mask of the scores' rank -> (B' or 1, h or 1, T, S)."""
        if self.simple:
            return mask
        q, k = _dims(query), _dims(key)
        nb = len(self.batch_axes)
        heads = mask.shape[nb]
        target = [q[a] for a in self.batch_axes] + [heads]
        target += [q[a] for a in self.axes] + [k[a] for a in self.axes]
        mask = ops.broadcast_to(mask, target)
        na = len(self.axes)
        t = _prod(target[nb + 1 : nb + 1 + na])
        return ops.reshape(mask, (_prod(target[:nb]), heads, t, _prod(target[nb + 1 + na :])))

    def check_mask(self, mask_shape, scores_shape) -> None:
        """ValueError unless the mask broadcasts to the scores as Keras's does."""
        m, s = tuple(mask_shape), tuple(scores_shape)
        need = 2 * len(self.axes)
        ok = need <= len(m) <= len(s)
        if ok:
            # Align as expand_mask does: the missing axes sit before the
            # query attention dims.
            pad = len(s) - len(m)
            aligned = m[: len(m) - need] + (1,) * pad + m[len(m) - need :]
            ok = all(a is None or b is None or a in (1, b) for a, b in zip(aligned, s))
        if not ok:
            names = (
                "(batch, num_heads, T, S)" if self.simple else "(batch, ..., num_heads, T.., S..)"
            )
            raise ValueError(
                f"`attention_mask` must be broadcastable to the attention scores {names} "
                f"= {s}: (T, S), (batch, T, S) or (batch, num_heads, T, S), missing axes "
                f"added before T as in keras.layers.MultiHeadAttention. Received: "
                f"attention_mask.shape={m}"
            )


def causal_mask(query, value):
    """(1, T, S) lower-triangular: position t sees positions <= t."""
    rows = ops.expand_dims(ops.arange(ops.shape(query)[1]), -1)
    cols = ops.expand_dims(ops.arange(ops.shape(value)[1]), 0)
    return ops.expand_dims(ops.greater_equal(rows, cols), 0)


def sliding_window_mask(query, value, window: int):
    """(1, T, S) band: position t sees positions s with |t - s| < window."""
    rows = ops.expand_dims(ops.arange(ops.shape(query)[1], dtype="int32"), -1)
    cols = ops.expand_dims(ops.arange(ops.shape(value)[1], dtype="int32"), 0)
    return ops.expand_dims(ops.less(ops.abs(rows - cols), window), 0)


def inverse_sqrt(d: int) -> float:
    return 1.0 / math.sqrt(float(d))


def is_weight_mask(mask) -> bool:
    """Whether `mask` is a 0/1 float mask (`keras_mha.layers.TokenEmbedding`'s),
    which the layers read with arithmetic only: `x * m`, not `where(m, x, ...)`.

    A boolean mask needs boolean operators (NOT_EQUAL, LOGICAL_AND, SELECT)
    wherever it is used; an integer-only NPU such as Arm's Ethos-U55 has no
    kernels for them, so each one splits its graph and runs on the CPU. A
    float mask of 0 and 1 gives the same numbers through MUL and SUB, which
    it runs. (Keras reads any nonzero as "keep"; a float mask here must hold
    0 and 1 only, as every mask Keras's layers make does.)
    """
    if mask is None:
        return False
    import keras

    return keras.backend.standardize_dtype(mask.dtype).startswith(("float", "bfloat"))


def attention_mask_of(
    axes: AttentionAxes,
    query,
    value,
    *,
    query_mask=None,
    value_mask=None,
    key_mask=None,
    attention_mask=None,
    use_causal_mask=False,
    sliding_window: int | None = None,
):
    """The scores' mask `(B|1, h|1, T|1, S|1)`, or None: the inputs' masks,
    causal, the sliding window and the explicit mask, ANDed.

    Boolean, except when it is made of the inputs' masks alone and each is 0/1
    floats (TokenEmbedding's): then they are multiplied, and the graph holds no
    boolean operator (`is_weight_mask`).
    """
    parts = []
    if query_mask is not None:
        parts.append(ops.expand_dims(query_mask, -1))  # [B, T, 1]
    for m in (value_mask, key_mask):
        if m is not None:
            parts.append(ops.expand_dims(m, -2))  # [B, 1, S]
    if use_causal_mask:
        parts.append(causal_mask(query, value))  # [1, T, S]
    if sliding_window is not None:
        parts.append(sliding_window_mask(query, value, sliding_window))  # [1, T, S]
    weights = attention_mask is None and bool(parts) and all(map(is_weight_mask, parts))
    if attention_mask is not None:
        parts.append(attention_mask)
    mask = None
    for part in parts:
        part = axes.expand_mask(part if weights else ops.cast(part, "bool"))
        if mask is None:
            mask = part  # [B|1, h|1, T|1, S|1]
        else:
            mask = mask * part if weights else ops.logical_and(mask, part)
    return mask


def mask_scores(scores, mask, margin: float):
    """`(masked scores, keep)`: the scores with each masked one set to its row's
    smallest score minus `margin`, and the mask `zero_masked_rows` applies after
    the softmax. `mask` has the scores' rank: boolean, integer (> 0.5 keeps) or
    0/1 floats (`is_weight_mask`: the same numbers with MUL and SUB only)."""
    floor = ops.min(scores, axis=-1, keepdims=True) - margin
    if is_weight_mask(mask):
        keep = ops.cast(mask, scores.dtype)
        # kept: scores - 0 (exactly the scores); masked: scores - (scores - floor)
        return scores - (1.0 - keep) * (scores - floor), keep
    import keras

    if keras.backend.standardize_dtype(mask.dtype) != "bool":  # an integer mask: > 0.5
        mask = ops.greater(mask, ops.cast(0.5, mask.dtype))
    return ops.where(mask, scores, floor), mask


def zero_masked_rows(weights, keep):
    """Softmax weights with every masked position 0, so a query row with nothing
    to attend to is all zeros, as in Keras (`keep` from `mask_scores`)."""
    if is_weight_mask(keep):
        return weights * keep
    # a scalar 0, not zeros_like: with a dynamic length zeros_like stays float in int8
    return ops.where(keep, weights, 0.0)


def mask_for_head(mask, i: int):
    """Head i's `(B|1, T|1, S|1)` slice of a `(B|1, h|1, T|1, S|1)` mask
    (a mask shared by all heads has one head axis entry), or None."""
    if mask is None:
        return None
    return mask[:, i if mask.shape[1] > 1 else 0]


def head_mask_tensor(head_mask, num_heads: int, dtype):
    """The `head_mask` call argument, `(h,)` or `(B, h)`, as a `(B or 1, h)`
    tensor of `dtype`: head i's output is multiplied by column i."""
    head_mask = ops.convert_to_tensor(head_mask)
    if len(head_mask.shape) == 1:
        head_mask = ops.expand_dims(head_mask, 0)
    if len(head_mask.shape) != 2 or head_mask.shape[-1] != num_heads:
        raise ValueError(
            "`head_mask` must have shape (num_heads,) or (batch, num_heads)"
            f" with num_heads={num_heads}. Received: "
            f"head_mask.shape={tuple(head_mask.shape)}"
        )
    return ops.cast(head_mask, dtype)


def check_input_masks(axes: AttentionAxes, query, value, key, masks: InputMasks) -> None:
    """ValueError unless each input mask applies as in Keras's layer: one
    flag per position of its tensor (broadcastable to `tensor.shape[:-1]`),
    with attention over the last axis before the features."""
    for name, x, mask in zip(("query", "value", "key"), (query, value, key), masks):
        if mask is None:
            continue
        shape = tuple(getattr(mask, "shape", np.shape(mask)))
        if not axes.last_axis_only:
            raise ValueError(
                f"`{name}_mask` (or the mask `{name}` carries) needs attention over the "
                f"last axis before the features (attention_axes=({axes.rank - 2},)), as "
                f"in keras.layers.MultiHeadAttention; pass `attention_mask` for "
                f"attention_axes={axes.axes}. Received: {name}_mask.shape={shape}"
            )
        want = tuple(x.shape[:-1])
        if not 1 <= len(shape) <= len(want) or not all(
            a is None or b is None or a in (1, b) for a, b in zip(shape[::-1], want[::-1])
        ):
            raise ValueError(
                f"`{name}_mask` (or the mask `{name}` carries) must have `{name}`'s shape "
                f"without its features, {want} (one flag per position). "
                f"Received: {name}_mask.shape={shape}"
            )
