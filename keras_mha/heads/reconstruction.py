"""After heads are removed, refit the linear maps that follow them by least squares.

Without labels, on examples `x` (a training split), layer by layer in the
spirit of Kwon et al. (2022), "A Fast Post-Training Pruning Framework for
Transformers". No gradient steps: each map is solved in closed form.
"""

from __future__ import annotations

import numpy as np

from keras_mha.heads.surgery import ffn_layers

RIDGE = 1e-4


def trace(model, x: np.ndarray, batch_size: int = 256) -> dict:
    """The classifier's activations on `x`, layer by layer (inference, numpy).

    Follows `TransformerEncoderBlock.call` without dropout. For block `l`,
    `blocks[l]` holds its input `x`, `heads` (Concat(head_1..head_h), before
    W^O), `attended` (the attention's output), `mid` (after the first
    LayerNorm), `hidden` (the FFN's ReLU layer) and `ffn` (the FFN's output);
    then `pooled`, the classifier's `logits` and `mask`, `(N, T)` True at
    real tokens (everywhere for feature inputs).
    """
    import keras
    from keras import ops

    from keras_mha.model import encoder_blocks

    embedding = model.get_layer("embedding")
    pooling = model.get_layer("pooling")
    classifier = model.get_layer("classifier")
    blocks = encoder_blocks(model)
    parts: list[dict] = []
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size]
        mask = embedding.compute_mask(xb) if isinstance(embedding, keras.layers.Embedding) else None
        h = model.get_layer("positional_encoding")(embedding(xb))
        part = {"blocks": []}
        for block in blocks:
            attention = block.attention
            ffn_in, ffn_out = ffn_layers(block)
            heads = attention.concat_heads(h, query_mask=mask, value_mask=mask)  # (B, T, h*d_v)
            attended = ops.matmul(heads, output_matrix(attention))  # (B, T, d_model)
            if attention.use_bias:
                attended = attended + attention.output_bias
            mid = block.attention_norm(h + attended)
            hidden = ffn_in(mid)  # (B, T, ff_dim), after the ReLU
            ffn = ffn_out(hidden)
            part["blocks"].append(
                {
                    "x": h,
                    "heads": heads,
                    "attended": attended,
                    "mid": mid,
                    "hidden": hidden,
                    "ffn": ffn,
                }
            )
            h = block.ffn_norm(mid + ffn)
        pooled = pooling(h) if mask is None else pooling(h, mask=mask)
        part["pooled"] = pooled
        part["logits"] = ops.matmul(pooled, classifier.kernel) + classifier.bias
        part["mask"] = (
            np.ones(h.shape[:2], bool) if mask is None else ops.convert_to_numpy(mask).astype(bool)
        )
        parts.append(part)

    def cat(arrays):
        return np.concatenate([ops.convert_to_numpy(a) for a in arrays])

    return {
        "blocks": [
            {key: cat([p["blocks"][i][key] for p in parts]) for key in parts[0]["blocks"][i]}
            for i in range(len(blocks))
        ],
        **{key: cat([p[key] for p in parts]) for key in ("pooled", "logits", "mask")},
    }


def output_matrix(attention):
    """The lesson's W^O, `(h * d_v, d_out)`: head i's block in rows i*d_v:(i+1)*d_v.

    The layer stores it in Keras's layout, `(h, d_v, d_out)` (docs/layer.md).
    """
    from keras import ops

    kernel = attention.output_kernel
    return ops.reshape(kernel, (-1, kernel.shape[-1]))


def refit(kernel, bias, inputs, targets, rows, ridge: float) -> None:
    """kernel, bias <- the least-squares map from `inputs` to `targets`.

    `kernel` is any variable whose last axis is the output (W^O's
    `(h, d_v, d_out)` is refit as the `(h * d_v, d_out)` matrix it is).
    Minimises ||A [W; b] - targets||^2 over `rows` (None: all), A the inputs
    with a column of ones, plus sum_j lam_j ||row j of [W; b] - its current
    value||^2, in closed form (float64), with

        lam_j = ridge * max((A^T A)_jj, median over the inputs k of (A^T A)_kk)

    and lam = ridge * n for the bias row (its column of ones has energy n).
    Each input's pull is relative to its energy, so rescaling the inputs does
    not change the fit; an input with less energy than the median gets the
    median's pull, so a ReLU unit that fires on a handful of rows is not fit
    to them with large weights (which would also stretch the int8 range of
    the map); an input that is always 0 keeps its weights.
    """
    from keras import ops

    shape = tuple(kernel.shape)
    a = inputs.reshape(-1, inputs.shape[-1]).astype("float64")
    y = targets.reshape(-1, targets.shape[-1]).astype("float64")
    if rows is not None:
        a, y = a[rows], y[rows]
    w_now = ops.convert_to_numpy(kernel).astype("float64").reshape(-1, shape[-1])
    n_in = w_now.shape[0]
    if bias is not None:
        a = np.concatenate([a, np.ones((len(a), 1))], axis=1)
        w_now = np.concatenate([w_now, ops.convert_to_numpy(bias)[None].astype("float64")])
    gram = a.T @ a
    energy = np.diag(gram).copy()
    energy[:n_in] = np.maximum(energy[:n_in], np.median(energy[:n_in]))
    lam = ridge * energy
    w = np.linalg.solve(gram + np.diag(lam), a.T @ y + lam[:, None] * w_now)
    kernel.assign(w[:n_in].reshape(shape).astype("float32"))
    if bias is not None:
        bias.assign(w[-1].astype("float32"))


def reconstruct(
    original,
    pruned,
    x: np.ndarray,
    ridge: float = RIDGE,
    batch_size: int = 256,
    teacher: dict | None = None,
):
    """Refit the pruned model's linear maps so its activations follow the original's.

    With `x_l`, `A_l`, ... the original's activations in block l and primes
    the pruned model's (computed after the refits of the blocks before it):

        W^O, b^O <- argmin || x'_l + Concat(kept heads) W^O + b^O - (x_l + A_l) ||^2
        W_2, b_2 <- argmin || m'_l + ReLU(m'_l W_1 + b_1) W_2 + b_2 - (m_l + F_l) ||^2

    so that what enters each LayerNorm is fit to the original's, drift from
    earlier layers included; then the classifier, to the original's logits.
    Padded tokens are left out. `ridge` (relative to each input's scale, see
    `refit`) pulls each map towards its current weights, so a map whose
    inputs did not change keeps them. `teacher`: `trace(original, x)` if
    already made. Modifies `pruned` in place and returns it.
    """
    from keras_mha.model import encoder_blocks

    blocks = encoder_blocks(pruned)
    if len(blocks) != len(encoder_blocks(original)):
        raise ValueError(
            "reconstruct needs the pruned model of `original` (same blocks); got "
            f"{len(blocks)} and {len(encoder_blocks(original))} blocks"
        )
    teacher = teacher if teacher is not None else trace(original, x, batch_size)
    rows = teacher["mask"].reshape(-1)
    for i, block in enumerate(blocks):
        t = teacher["blocks"][i]
        s = trace(pruned, x, batch_size)["blocks"][i]
        attention = block.attention
        target = t["x"] + t["attended"] - s["x"]
        refit(attention.output_kernel, attention.output_bias, s["heads"], target, rows, ridge)
        s = trace(pruned, x, batch_size)["blocks"][i]
        target = t["mid"] + t["ffn"] - s["mid"]
        ffn_out = ffn_layers(block)[1]
        refit(ffn_out.kernel, ffn_out.bias, s["hidden"], target, rows, ridge)
    classifier = pruned.get_layer("classifier")
    pooled = trace(pruned, x, batch_size)["pooled"]
    refit(classifier.kernel, classifier.bias, pooled, teacher["logits"], None, ridge)
    return pruned


def reconstruction_record(train_examples: int) -> dict:
    """What metrics.json / curve.json record of a refit."""
    return {"split": "train", "examples": int(train_examples), "ridge": RIDGE}
