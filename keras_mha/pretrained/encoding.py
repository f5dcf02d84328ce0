"""Running a `bert.build_encoder` model over many sentences, and building a pruned one.

- `batches`: token ids in batches of similar length, each cut to its longest;
  `pad_id_of(model)`: the id the encoder masks.
- `embed`: (N, d) unit vectors, optionally with head masks (head analysis).
- `build_pruned_encoder`: the encoder with its own heads per layer.

Shared by head analysis (keras_mha/heads/encoder.py) and quantization-aware
distillation (keras_mha/qat/train.py).
"""

from __future__ import annotations

import numpy as np

from bundle_contract.errors import UsageError

BATCH_SIZE = 32  # sentences per forward batch


def build_pruned_encoder(config, heads_per_layer: list[int], key_dim: int):
    """`bert.build_encoder(config)` with `heads_per_layer[l]` heads of size `key_dim` in block l.

    The blocks store `num_heads` and `key_dim` in their own config, so the
    saved model reloads as it is (`keras_mha.layers` registered).
    """
    config.validate()
    if len(heads_per_layer) != config.num_layers or any(
        isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1
        for h in heads_per_layer
    ):
        raise UsageError(
            f"heads_per_layer must be {config.num_layers} positive integers, got {heads_per_layer}"
        )
    from keras_mha.pretrained.bert import build_encoder

    return build_encoder(config, heads_per_layer=[int(h) for h in heads_per_layer], key_dim=key_dim)


def pad_id_of(model) -> int:
    """The id an encoder's embedding masks (`BertEmbeddings.pad_id`: 0, RoBERTa's 1)."""
    return int(model.get_layer("embedding").pad_id)


def batches(
    ids: np.ndarray, batch_size: int = BATCH_SIZE, pad_id: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`(rows, ids[rows] trimmed)` batches of similar length, shortest first.

    Each batch is cut after its last column that is not `pad_id` (at least
    one), which does not change a vector: padding is masked (bert.py).
    """
    ids = np.asarray(ids, np.int32)
    if ids.ndim != 2:
        raise UsageError(f"expected token ids (N, T), got shape {ids.shape}")
    columns = np.arange(ids.shape[1])[None]
    ends = (
        np.where(ids != pad_id, columns + 1, 0).max(axis=1) if ids.shape[1] else np.zeros(len(ids))
    )
    order = np.argsort(ends, kind="stable")
    out = []
    for start in range(0, len(ids), batch_size):
        rows = order[start : start + batch_size]
        out.append((rows, ids[rows, : max(1, int(ends[rows].max()))]))
    return out


def embed(model, ids: np.ndarray, head_masks=None, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """(N, d) float32 unit vectors, with optional head masks (one `(h,)` per block)."""
    from keras import ops

    from keras_mha.pretrained.bert import encoder_forward

    d = int(model.outputs[0].shape[-1])
    out = np.zeros((len(ids), d), np.float32)
    for rows, xb in batches(ids, batch_size, pad_id_of(model)):
        out[rows] = ops.convert_to_numpy(encoder_forward(model, xb, head_masks=head_masks))
    return out
