"""Grouped-query attention under `keras.layers.GroupQueryAttention`'s constructor.

The layer is `MultiHeadAttention` (layer.py) with `num_key_value_heads`: query
head i owns W_i^Q; key/value head g owns W_g^K and W_g^V, shared by the group
of query heads i with i // (h / h_kv) = g (Ainslie et al., 2023). h_kv = 1 is
multi-query attention, h_kv = h multi-head attention. This class takes Keras's
arguments (`head_dim`, `num_query_heads`, `num_key_value_heads`) and writes
Keras's config, so a model or test written for Keras's layer builds ours.
"""

from __future__ import annotations

import keras

from .layer import MultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_mha")
class GroupedQueryAttention(MultiHeadAttention):
    """Grouped-query attention with the lesson's per-head matrices, a drop-in
    replacement for `keras.layers.GroupQueryAttention` (Keras's class GroupedQueryAttention).

    Args: as Keras's (`head_dim`, `num_query_heads`, `num_key_value_heads`,
    `dropout`, `use_bias`, `sliding_window`, `flash_attention`, the
    initializers, regularizers and constraints, `use_gate`, `seed`), plus
    `implementation` (`"per_head"`: the lesson's loop, each key/value head
    projected once for its group). The output has the query's feature size.

    >>> layer = GroupedQueryAttention(head_dim=4, num_query_heads=6, num_key_value_heads=2)
    >>> y = layer(keras.random.normal((2, 5, 8)), keras.random.normal((2, 5, 8)))
    >>> tuple(y.shape), layer.group_size, tuple(layer.key_kernel.shape)
    ((2, 5, 8), 3, (8, 2, 4))
    """

    def __init__(
        self,
        head_dim: int,
        num_query_heads: int,
        num_key_value_heads: int,
        dropout: float = 0.0,
        use_bias: bool = True,
        sliding_window: int | None = None,
        flash_attention: bool | None = None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate: bool = False,
        seed: int | None = None,
        implementation: str = "fused",
        **kwargs,
    ):
        super().__init__(
            num_heads=num_query_heads,
            key_dim=head_dim,
            value_dim=head_dim,
            num_key_value_heads=num_key_value_heads,
            dropout=dropout,
            use_bias=use_bias,
            sliding_window=sliding_window,
            flash_attention=flash_attention,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint,
            use_gate=use_gate,
            seed=seed,
            implementation=implementation,
            **kwargs,
        )

    _keeps_input_masks = True  # as Keras's GroupedQueryAttention: the caller's masks stay

    # Keras's names for the sizes.
    head_dim = property(lambda self: self.key_dim)
    num_query_heads = property(lambda self: self.num_heads)
    num_repeats = property(lambda self: self.group_size)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        """Keras's: the query's shape; query and value of one feature size."""
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        if query_shape[-1] != value_shape[-1]:
            raise ValueError(
                "The last dimension of `query_shape` and `value_shape` must be equal, but "
                f"are {query_shape[-1]}, {value_shape[-1]}. Received: "
                f"query_shape={query_shape}, value_shape={value_shape}"
            )
        if tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
            raise ValueError(
                "All dimensions of `value` and `key`, except the last one, must be equal. "
                f"Received: value_shape={value_shape} and key_shape={key_shape}"
            )
        return tuple(query_shape)

    def get_config(self):
        config = super().get_config()
        for ours in ("num_heads", "key_dim", "value_dim", "output_shape", "attention_axes"):
            config.pop(ours)
        config.pop("num_key_value_heads", None)
        return {
            **config,
            "head_dim": self.key_dim,
            "num_query_heads": self.num_heads,
            "num_key_value_heads": self.num_key_value_heads,
        }


GroupQueryAttention = GroupedQueryAttention  # Keras's public name for its layer
