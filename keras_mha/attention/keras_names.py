"""Keras's private names on our layer, for subclasses written for Keras's layer.

keras-hub's CachedMultiHeadAttention, Whisper's, Moonshine's and XLNet's
attention subclass `keras.layers.MultiHeadAttention`, override `build` or
`_compute_attention`, and read or set its private attributes
(`_num_heads`, `_key_dim`, `_query_dense`, ...). `KerasNames` gives our
layer those names, each one of our attributes under Keras's name, and
Keras's hooks (`_build_attention`, `_compute_causal_mask`,
`_compute_attention_mask`), so such a subclass runs on ours unchanged
(docs/layer.md, "Subclasses written for Keras's layer"). None of it is
the lesson: the layer (layer.py) reads as if it were not here.
"""

from __future__ import annotations

import inspect

from .masks import AttentionAxes, attention_mask_of, causal_mask, inverse_sqrt


def override_point(method):
    """Marks the layer's own `_compute_attention`: a subclass that replaces it is
    seen (`KerasNames.__init_subclass__`) and called as Keras calls it."""
    method.keras_mha_override_point = True
    return method


def _alias(name: str) -> property:
    """Keras's private name for one of our attributes (read and set)."""
    return property(
        lambda self: getattr(self, name),
        lambda self, value: setattr(self, name, value),
        doc=f"`{name}` under Keras's private name.",
    )


class KerasNames:
    """Keras's private attributes and hooks of `keras.layers.MultiHeadAttention`,
    on `keras_mha.MultiHeadAttention` (a mixin: it holds no state of its own)."""

    # How `_fused_attention` calls `_compute_attention`, decided once per class
    # (`__init_subclass__`): whether a subclass overrides it, and whether the
    # override takes `return_attention_scores` (keras-hub's shorter signature
    # `(query, key, value, attention_mask=None, training=None)` does not).
    _overrides_compute_attention = False
    _compute_attention_takes_scores_flag = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        method = cls._compute_attention
        cls._overrides_compute_attention = not getattr(method, "keras_mha_override_point", False)
        params = inspect.signature(method).parameters.values()
        cls._compute_attention_takes_scores_flag = any(
            p.name == "return_attention_scores" or p.kind is p.VAR_KEYWORD for p in params
        )

    # Attributes subclasses read or set, each one of ours under Keras's name.
    _num_heads = _alias("num_heads")
    _dropout = _alias("dropout")
    _use_bias = _alias("use_bias")
    _kernel_initializer = _alias("kernel_initializer")
    _bias_initializer = _alias("bias_initializer")
    _kernel_regularizer = _alias("kernel_regularizer")
    _bias_regularizer = _alias("bias_regularizer")
    _kernel_constraint = _alias("kernel_constraint")
    _bias_constraint = _alias("bias_constraint")

    @property
    def _key_dim(self) -> int | None:
        """Keras's: the per-head query/key size (ours may be resolved at build)."""
        return self.key_dim if self.key_dim is not None else self.d_k

    @_key_dim.setter
    def _key_dim(self, value) -> None:
        self.key_dim = value

    @property
    def _value_dim(self) -> int | None:
        """Keras's: `value_dim`, else `key_dim`."""
        return self.value_dim if self.value_dim is not None else self._key_dim

    @_value_dim.setter
    def _value_dim(self, value) -> None:
        self.value_dim = value

    @property
    def _inverse_sqrt_key_dim(self) -> float:
        return inverse_sqrt(self._key_dim)

    @property
    def _attention_axes(self):
        """Keras's: the normalized axes once built (projected-tensor axes)."""
        return self.attention_axes if self._axes is None else self._axes.axes

    def _get_common_kwargs_for_sublayer(self) -> dict:
        return self._sublayer_kwargs()

    def _build_attention(self, rank: int) -> None:
        """Keras's hook, called by `build` (and by subclasses that replace
        `build`): what `_compute_attention` needs for projected tensors of
        rank `rank` (input rank + 1): the axes, d_k and d_v, and Keras's
        einsum equations for subclasses that compute attention themselves."""
        self._axes = AttentionAxes(rank - 1, self.attention_axes)
        if self.d_k is None:  # a subclass's own build: Keras's sizes
            self.d_k, self.d_v = self._key_dim, self._value_dim
        self._dot_product_equation, self._combine_equation = self._axes.einsum_equations()

    def _compute_causal_mask(self, query, value=None):
        """Keras's: (1, T, S) boolean, position t sees s <= t."""
        return causal_mask(query, query if value is None else value)

    def _compute_attention_mask(
        self,
        query,
        value,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
    ):
        """Keras's: boolean mask of the scores' rank, or None: the inputs' masks,
        causal, sliding window and the explicit mask, ANDed (masks.attention_mask_of)."""
        return attention_mask_of(
            self._axes,
            query,
            value,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            sliding_window=self._sliding_window,
        )
