"""Remove heads for real: a smaller model whose outputs equal the original's with them masked.

A removed head takes its W_i^Q, W_i^K, W_i^V, their biases and its block of
W^O (`MultiHeadAttention.pruned`); everything else is copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bundle_contract.errors import UsageError

if TYPE_CHECKING:
    from keras_mha.model import ModelConfig


def pruned_config(config: ModelConfig, keep: list[list[int]], key_dim: int) -> ModelConfig:
    """`config` with `len(keep[l])` heads in layer l; d_k pinned (no longer d_model / h)."""
    from keras_mha.model import ModelConfig

    return ModelConfig.from_dict(
        {**config.to_dict(), "num_heads": [len(k) for k in keep], "key_dim": key_dim}
    )


def prune_model(model, remove: dict[int, list[int]], config: ModelConfig):
    """A new model without the heads in `remove` ({layer index: [head, ...]}).

    Args:
        model: A classifier built by `build_classifier(config)`.
        remove: Heads to remove per layer; every layer keeps at least one.
        config: `model`'s ModelConfig (a run's `metrics.json` stores it).

    Returns:
        `(pruned model, its ModelConfig)`.
    """
    from keras_mha.model import build_classifier, encoder_blocks

    blocks = encoder_blocks(model)
    if [b.attention.num_heads for b in blocks] != config.heads_per_layer():
        raise ValueError(
            f"config has heads {config.heads_per_layer()} per layer; the model has "
            f"{[b.attention.num_heads for b in blocks]}"
        )
    keep = []
    for i, block in enumerate(blocks):
        gone = set(remove.get(i, []))
        heads = [h for h in range(block.attention.num_heads) if h not in gone]
        if not heads:
            raise UsageError(f"pruning would leave layer {i} with no head")
        keep.append(heads)
    d_k = blocks[0].attention.d_k
    if any(b.attention.d_k != d_k for b in blocks):
        raise UsageError("pruning needs the same d_k in every layer")
    new_config = pruned_config(config, keep, d_k)
    new = build_classifier(new_config)
    new_blocks = {b.name: b for b in encoder_blocks(new)}
    for layer in model.layers:
        if not layer.weights:
            continue
        target = new.get_layer(layer.name)
        if layer.name in new_blocks:
            i = blocks.index(layer)
            target.attention.set_weights(layer.attention.pruned(keep[i]).get_weights())
            for name in ("attention_norm", "ffn_norm"):
                getattr(target, name).set_weights(getattr(layer, name).get_weights())
            for mine, theirs in zip(ffn_layers(target), ffn_layers(layer)):
                mine.set_weights(theirs.get_weights())
        else:
            target.set_weights(layer.get_weights())
    return new, new_config


def ffn_layers(block) -> tuple:
    """The encoder block's two feed-forward Dense layers (in, out)."""
    if getattr(block, "ffn_outliers", 0):
        raise ValueError(
            f"Block {block.name!r} splits its FFN (ffn_outliers={block.ffn_outliers}, an int8 "
            "rescaling); prune the encoder before rescaling it."
        )
    if hasattr(block, "ffn_in"):
        return block.ffn_in, block.ffn_out
    return block._ffn_in, block._ffn_out  # until layers.py makes them public
