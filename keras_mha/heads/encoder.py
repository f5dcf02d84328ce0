"""Heads of a label-free sentence encoder: importance, removal for real, least-squares refit.

Why not the classifiers' criterion. `importance.head_importance` (Michel,
Levy & Neubig 2019) is I_h = E|dL/d xi_h| for a loss L with labels. A
sentence encoder (`keras_mha.pretrained.bert.build_encoder`, an embedding run
of `keras-mha-import`) has none; the natural label-free loss is the distance
to the unpruned model's own vector, L = 1 - cos(e(xi), e(1)). That loss is
0, its minimum, at xi = 1 (every head on), so dL/d xi_h = 0 for every head
and sentence: Michel's score is identically zero. Two criteria that are not:

- `jacobian_importance` (the default): I_h = mean over sentences of
  ||d e / d xi_h||_2, the Jacobian column of the unit sentence vector e for
  head h's gate, at xi = 1: how far the vector itself moves, not a loss that
  is flat there. Because e has unit norm, d e / d xi_h is orthogonal to e
  and, to second order, turning head h down by delta costs
  1 - cos ~= delta^2 / 2 * ||d e / d xi_h||^2; its mean square is the
  diagonal of the Fisher information of a Gaussian model around e, the
  quantity Kwon et al. (2022) rank heads by, with the unpruned model's own
  output in place of labels. Computed exactly in forward mode
  (`tf.autodiff.ForwardAccumulator`): one Jacobian-vector product per head,
  from its own block's input (the blocks before it run once per batch), the
  heads of a block batched together, as tf.functions.
- `ablation_importance` (the cross-check): A_h = mean over sentences of
  1 - cos(e with head h alone masked, e), the delta = 1 case the Jacobian
  approximates. On all-MiniLM-L6-v2's 100 calibration sentences the two rank
  the 72 heads with Spearman 0.994 (mean ||J||^2 against ablation: 0.996;
  A_h / (mean ||J_h||^2 / 2) is 0.86 to 1.27).

Both return one `(h,)` array per layer like `head_importance`, so
`importance.rank_heads` orders them; `importance(model, x, y)` takes either
kind of model (a classifier: Michel's, with labels `y`).

Which heads go: `select_heads`, one shot by importance, least important
first, never a layer's last head. (`select_heads_greedy` recomputes the
importance on the masked model every `step` heads; on MiniLM, greedy
ablation at 30 % gives a masked mean cosine of 0.969 against one shot's
0.967, for 13 minutes instead of one.) Scores are not normalised per layer:
they are in the same units (vector change per unit gate) in every layer,
and Michel's per-layer L2 normalisation, tried, prunes worse (0.952).

Pruning (`prune_encoder`) removes heads for real (`MultiHeadAttention.pruned`)
into a smaller encoder built with per-layer head counts and d_k pinned
(`build_pruned_encoder`); the pruned run's metrics.json records them in its
config (`BertConfig.heads_per_layer`).

Then `reconstruct_encoder` refits by least squares, on unlabeled sentences
(the run's calibration sentences, never the eval ones), block by block, as
`reconstruction.reconstruct` does for the classifiers (Kwon et al. 2022),
the linear maps after the removed heads:

    W^O, b^O <- argmin || x'_l + Concat(kept heads) W^O + b^O - (x_l + A_l) ||^2
    W_2, b_2 <- argmin || m'_l + GELU(m'_l W_1 + b_1) W_2 + b_2 - (m_l + F_l) ||^2

(x_l, A_l, m_l, F_l: the unpruned block's input, attention output, first
LayerNorm output and FFN output; primes: the pruned model's, after the
refits of the blocks before it), so what enters each post-LN LayerNorm
follows the unpruned model's, drift from earlier blocks included. Rows are
real tokens only: padded positions never enter the least squares. Sentences
run in batches of similar length trimmed to their longest (padding is
masked, so a vector does not depend on it).

The ridge is the lesson of MiniLM: 100 calibration sentences are about
1,600 token rows, for 192 to 385 inputs of W^O and 1,537 of the FFN output.
With the classifiers' 1e-4 the refit fits the calibration vectors to a
cosine of 0.9999 and wrecks unseen sentences (eval mean cosine 0.57 at 30 %
removed, below the masked 0.965). `ENCODER_RIDGE` = 3, chosen on a held-out
fifth of the calibration sentences (`choose_ridge`; 1 to 10 is flat), gives
0.979. Also tried at 30 %, none better: the attention output as target
without the drift term; per-head or per-input scales only (Kwon et al.'s
mask tuning; too little capacity: 0.967 to 0.972); rows weighted by the
LayerNorm's 1/variance; extra rows from concatenated calibration sentences
or random word pieces. Fitting on three times the sentences (a diagnostic
with half the eval set, judged on the other half) moves the mean cosine only
from 0.980 to 0.983: what the removed heads computed is mostly not a linear
function of the kept heads' outputs, so the linear refit alone does not
reach 0.99 at 30 % (it does at 20 %: 0.991, top-1 0.905).

`pruning_table` gives masked-only against removed-and-refit fidelity
(`measure_embeddings`: mean / min cosine, top-1 / top-5 neighbour agreement
with the unpruned vectors on the eval sentences); `write_pruned_run` writes
the pruned encoder as an embedding run that `keras-mha-export` takes;
`cmd_importance_embedding` and `cmd_prune_embedding` are
`keras-mha-heads importance|prune RUN` for an embedding run.
"""

from __future__ import annotations

import argparse
import pathlib
import time
import weakref

import numpy as np

from edge_demo.errors import UsageError
from keras_mha.heads.importance import head_importance, rank_heads
from keras_mha.heads.masks import all_heads_on, heads_per_layer
from keras_mha.heads.reconstruction import output_matrix, refit
from keras_mha.heads.selection import check_fraction
from keras_mha.heads.surgery import ffn_layers
from keras_mha.model import encoder_blocks, is_encoder

KINDS = ("auto", "classifier", "encoder")
METHODS = ("jacobian", "ablation")
# The refit's ridge (`reconstruction.refit`'s, relative to each input's energy), for
# W^O and the FFN output alike: see the module docstring.
ENCODER_RIDGE = 3.0
RIDGES = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
BATCH_SIZE = 32  # sentences per forward batch
JVP_BATCH_SIZE = 8  # sentences per Jacobian batch (times a layer's heads)


# ------------------------------------------------------------------ the model
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


def batches(ids: np.ndarray, batch_size: int = BATCH_SIZE) -> list[tuple[np.ndarray, np.ndarray]]:
    """`(rows, ids[rows] trimmed)` batches of similar length, shortest first.

    Each batch is cut after its last non-pad column (at least one), which
    does not change a vector: padding is masked (bert.py).
    """
    ids = np.asarray(ids, np.int32)
    if ids.ndim != 2:
        raise UsageError(f"expected token ids (N, T), got shape {ids.shape}")
    columns = np.arange(ids.shape[1])[None]
    ends = np.where(ids != 0, columns + 1, 0).max(axis=1) if ids.shape[1] else np.zeros(len(ids))
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
    for rows, xb in batches(ids, batch_size):
        out[rows] = ops.convert_to_numpy(encoder_forward(model, xb, head_masks=head_masks))
    return out


def _stem(model, xb):
    """The embedding's output and the mask `ids != 0` for ids `xb` (B, T)."""
    from keras import ops

    embedding = model.get_layer("embedding")
    xb = ops.convert_to_tensor(xb, "int32")
    return embedding(xb), embedding.compute_mask(xb)


def _tail(model, blocks, start: int, x, mask, gate, head_masks):
    """Unit vectors from block `start`'s input `x`; `gate` is that block's head mask."""
    for j in range(start, len(blocks)):
        head_mask = gate if j == start else head_masks[j]
        x = blocks[j](x, mask=mask, head_mask=head_mask)
    return model.get_layer("normalize")(model.get_layer("pooling")(x, mask=mask))


def _block_inputs(model, blocks, xb, head_masks):
    """Each block's input for ids `xb` (with `head_masks`), the mask and the unit vectors."""
    x, mask = _stem(model, xb)
    inputs = []
    for j, block in enumerate(blocks):
        inputs.append(x)
        x = block(x, mask=mask, head_mask=head_masks[j])
    vectors = model.get_layer("normalize")(model.get_layer("pooling")(x, mask=mask))
    return inputs, mask, vectors


# One function per (model, block, method), traced by tf.function on first use
# (reduce_retracing: a new sentence length does not trace again after the second).
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step(model, blocks, layer: int, method: str, compiled: bool):
    """(x, mask, gate, tangent, head_masks) -> the Jacobian-vector product (jacobian) or
    the unit vectors (ablation) of the tail of the encoder from block `layer`."""
    import tensorflow as tf

    def step(x, mask, gate, tangent, head_masks):
        if method == "jacobian":
            with tf.autodiff.ForwardAccumulator(gate, tangent) as acc:
                vectors = _tail(model, blocks, layer, x, mask, gate, head_masks)
            return acc.jvp(vectors)
        return _tail(model, blocks, layer, x, mask, gate, head_masks)

    if not compiled:
        return step
    cache = _STEPS.setdefault(model, {})
    key = (layer, method)
    if key not in cache:
        cache[key] = tf.function(step, reduce_retracing=True)
    return cache[key]


# ---------------------------------------------------------------- importance
def head_effects(
    model,
    ids: np.ndarray,
    method: str = "jacobian",
    head_masks: list[np.ndarray] | None = None,
    batch_size: int = JVP_BATCH_SIZE,
    compiled: bool = True,
) -> list[np.ndarray]:
    """Per head and sentence: `(h, N)` per layer, the sentence's own score.

    `jacobian`: ||d e / d xi_h|| at the gates `head_masks` (default all 1);
    `ablation`: 1 - cos(e with head h also masked, e). Heads already masked
    score 0. Each block's input is computed once per batch; the heads of a
    block run together (the batch tiled once per head) from there. TensorFlow
    only (a ForwardAccumulator), like `head_importance`; `compiled` runs the
    steps as tf.functions (about 3x faster on MiniLM, after tracing).
    """
    import tensorflow as tf

    if method not in METHODS:
        raise UsageError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    blocks = encoder_blocks(model)
    head_masks = [np.asarray(m, "float32") for m in (head_masks or all_heads_on(model))]
    if [len(m) for m in head_masks] != heads_per_layer(model):
        raise UsageError(
            f"head_masks have {[len(m) for m in head_masks]} heads per layer; the model "
            f"{heads_per_layer(model)}"
        )
    constants = [tf.constant(m) for m in head_masks]
    out = [np.zeros((len(m), len(ids)), "float64") for m in head_masks]
    for rows, xb in batches(ids, batch_size):
        inputs, mask, reference = _block_inputs(model, blocks, xb, constants)
        reference = np.asarray(reference, "float64")
        b = len(rows)
        for layer, base in enumerate(head_masks):
            live = np.flatnonzero(base > 0)
            if not len(live):
                continue
            k = len(live)
            x = tf.tile(inputs[layer], [k, 1, 1])  # replica r*b + n: head live[r], sentence n
            m = tf.tile(mask, [k, 1])
            picked = np.repeat(np.eye(len(base), dtype="float32")[live], b, axis=0)  # (k*b, h)
            if method == "jacobian":
                gate, tangent = np.tile(base[None], (k * b, 1)), picked
            else:
                gate, tangent = base[None] * (1.0 - picked), np.zeros_like(picked)
            result = _step(model, blocks, layer, method, compiled)(
                x, m, tf.constant(gate), tf.constant(tangent), constants
            )
            v = np.asarray(result, "float64").reshape(k, b, -1)
            if method == "jacobian":
                score = np.linalg.norm(v, axis=-1)
            else:
                cosine = (v * reference[None]).sum(-1) / np.maximum(
                    np.linalg.norm(v, axis=-1) * np.linalg.norm(reference, axis=-1)[None], 1e-12
                )
                score = 1.0 - cosine
            out[layer][live[:, None], rows[None, :]] = score
    return out


def jacobian_importance(
    model, ids, head_masks=None, batch_size: int = JVP_BATCH_SIZE, compiled: bool = True
):
    """I_h = mean over sentences of ||d e / d xi_h||_2 (module docstring); `(h,)` per layer."""
    effects = head_effects(model, ids, "jacobian", head_masks, batch_size, compiled)
    return [e.mean(axis=1).astype("float32") for e in effects]


def ablation_importance(
    model, ids, head_masks=None, batch_size: int = JVP_BATCH_SIZE, compiled: bool = True
):
    """A_h = mean over sentences of 1 - cos(e without head h, e); `(h,)` per layer."""
    effects = head_effects(model, ids, "ablation", head_masks, batch_size, compiled)
    return [e.mean(axis=1).astype("float32") for e in effects]


def importance(
    model,
    x: np.ndarray,
    y: np.ndarray | None = None,
    kind: str = "auto",
    method: str = "jacobian",
    head_masks: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Head importance, one `(h,)` array per layer, for a classifier or an encoder.

    `kind="auto"` tells them apart (`keras_mha.model.is_encoder`). A
    classifier: Michel et al.'s E|dL/d xi_h| with labels `y`
    (`head_importance`; `method` is not used). An encoder: `method`
    `"jacobian"` or `"ablation"` on the sentences `x` (token ids), no labels.
    Either way `rank_heads` orders them, least important first.
    """
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if kind == "auto":
        kind = "encoder" if is_encoder(model) else "classifier"
    if kind == "classifier":
        if y is None:
            raise UsageError("a classifier's importance (Michel et al.) needs the labels y")
        return head_importance(model, x, y, head_masks)
    if method == "jacobian":
        return jacobian_importance(model, x, head_masks)
    if method == "ablation":
        return ablation_importance(model, x, head_masks)
    raise UsageError(f"method must be one of {', '.join(METHODS)}; got {method!r}")


def spearman(a, b) -> float:
    """Spearman's rank correlation of two score lists (per-layer arrays are flattened)."""
    a = np.concatenate([np.ravel(v) for v in a]) if isinstance(a, list) else np.ravel(a)
    b = np.concatenate([np.ravel(v) for v in b]) if isinstance(b, list) else np.ravel(b)

    def ranks(v):
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):  # ties share their mean rank
            tied = v == value
            r[tied] = r[tied].mean()
        return r

    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


# ------------------------------------------------------------------ selection
def select_heads(scores: list[np.ndarray], fraction: float, head_masks=None) -> list:
    """One shot: the round(fraction * heads) least important heads, never a layer's last."""
    sizes = [len(s) for s in scores]
    target = check_fraction(fraction, sizes)
    head_masks = [np.array(m, "float32") for m in (head_masks or [np.ones(n) for n in sizes])]
    return _take(scores, head_masks, [], target)


def _take(scores, head_masks, picked: list, goal: int) -> list[tuple[int, int]]:
    """Add the least important heads still on to `picked` until it holds `goal`,
    never a layer's last head; `head_masks` are set to 0 as they go."""
    for layer, head in rank_heads(scores, head_masks):
        if len(picked) == goal:
            break
        if head_masks[layer].sum() > 1:
            head_masks[layer][head] = 0.0
            picked.append((layer, head))
    return picked


def select_heads_greedy(
    model, ids, fraction: float, method: str = "jacobian", step: int = 1
) -> list[tuple[int, int]]:
    """Greedy: the importance recomputed on the masked model after every `step` heads."""
    head_masks = all_heads_on(model)
    target = check_fraction(fraction, [len(m) for m in head_masks])
    picked: list[tuple[int, int]] = []
    while len(picked) < target:
        scores = importance(model, ids, kind="encoder", method=method, head_masks=head_masks)
        before = len(picked)
        _take(scores, head_masks, picked, min(target, before + max(1, int(step))))
        if len(picked) == before:  # every layer is down to one head
            break
    return picked


def removal_masks(model, removed) -> list[np.ndarray]:
    """Head masks with the `(layer, head)` pairs of `removed` at 0."""
    masks = all_heads_on(model)
    for layer, head in removed:
        masks[layer][head] = 0.0
    return masks


# -------------------------------------------------------------------- surgery
def prune_encoder(model, removed, config) -> tuple[object, list[list[int]]]:
    """A new encoder without the heads `removed` (`[(layer, head), ...]`).

    `config` is the run's `BertConfig` (vocabulary, sizes; its `num_heads`
    is not used: the heads are `model`'s). Equals `model` with those heads
    masked. Returns `(pruned model, heads kept per layer)`.
    """
    blocks = encoder_blocks(model)
    gone: dict[int, set] = {}
    for layer, head in removed:
        if (
            not 0 <= int(layer) < len(blocks)
            or not 0 <= int(head) < blocks[layer].attention.num_heads
        ):
            raise UsageError(f"no head {head} in layer {layer}")
        gone.setdefault(int(layer), set()).add(int(head))
    keep = []
    for i, block in enumerate(blocks):
        heads = [h for h in range(block.attention.num_heads) if h not in gone.get(i, set())]
        if not heads:
            raise UsageError(f"pruning would leave layer {i} with no head")
        keep.append(heads)
    d_k = blocks[0].attention.d_k
    if any(b.attention.d_k != d_k or b.attention.d_v != d_k for b in blocks):
        raise UsageError("pruning needs the same d_k = d_v in every layer")
    new = build_pruned_encoder(config, [len(k) for k in keep], d_k)
    new.get_layer("embedding").set_weights(model.get_layer("embedding").get_weights())
    for i, (block, target) in enumerate(zip(blocks, encoder_blocks(new))):
        target.attention.set_weights(block.attention.pruned(keep[i]).get_weights())
        for name in ("attention_norm", "ffn_norm"):
            getattr(target, name).set_weights(getattr(block, name).get_weights())
        for mine, theirs in zip(ffn_layers(target), ffn_layers(block)):
            mine.set_weights(theirs.get_weights())
    return new, keep


# ------------------------------------------------------------- reconstruction
def _pieces(block, xs: list, masks: list) -> tuple[dict, list]:
    """Block pieces at the real tokens (rows, numpy) and the block's outputs per batch.

    Follows `TransformerEncoderBlock.call` (no dropout): `x` the input,
    `heads` Concat(head_1..head_h) before W^O, `attended` the attention's
    output, `mid` after the first LayerNorm, `hidden` the FFN's activation,
    `ffn` its output.
    """
    from keras import ops

    attention = block.attention
    ffn_in, ffn_out = ffn_layers(block)
    w_o = output_matrix(attention)
    parts: dict[str, list] = {k: [] for k in ("x", "heads", "attended", "mid", "hidden", "ffn")}
    outs = []
    for x, mask in zip(xs, masks):
        heads = attention.concat_heads(x, query_mask=mask, value_mask=mask)
        attended = ops.matmul(heads, w_o)
        if attention.use_bias:
            attended = attended + attention.output_bias
        mid = block.attention_norm(x + attended)
        hidden = ffn_in(mid)
        ffn = ffn_out(hidden)
        outs.append(block.ffn_norm(mid + ffn))
        keep = ops.convert_to_numpy(mask).astype(bool)
        for key, value in (
            ("x", x),
            ("heads", heads),
            ("attended", attended),
            ("mid", mid),
            ("hidden", hidden),
            ("ffn", ffn),
        ):
            parts[key].append(ops.convert_to_numpy(value)[keep])
    return {k: np.concatenate(v) for k, v in parts.items()}, outs


def _sse(kernel, bias, inputs, targets) -> float:
    from keras import ops

    w = ops.convert_to_numpy(kernel).astype("float64").reshape(-1, kernel.shape[-1])
    pred = inputs.astype("float64") @ w
    if bias is not None:
        pred = pred + ops.convert_to_numpy(bias).astype("float64")
    return float(((pred - targets) ** 2).sum())


def reconstruct_encoder(
    original,
    pruned,
    ids: np.ndarray,
    ridge: float = ENCODER_RIDGE,
    ffn: bool = True,
    ffn_ridge: float | None = None,
    batch_size: int = BATCH_SIZE,
) -> list[dict]:
    """Refit the pruned encoder's W^O (and FFN output) to the original's, block by block.

    On the sentences `ids` (unlabeled: the run's calibration sentences),
    real tokens only; see the module docstring for the maps and targets.
    `ridge` as `reconstruction.refit` (relative to each input's energy);
    `ffn_ridge` for the FFN output (default `ridge`), whose 1,536 inputs are
    about as many as a hundred sentences' tokens. Modifies `pruned` in place;
    returns, per block, the squared error of each map on its rows before and
    after its refit.
    """
    blocks = encoder_blocks(pruned)
    teacher = encoder_blocks(original)
    if len(blocks) != len(teacher):
        raise ValueError(
            f"reconstruct needs the pruned model of `original`; got {len(blocks)} and "
            f"{len(teacher)} blocks"
        )
    ffn_ridge = ridge if ffn_ridge is None else ffn_ridge
    stems = [_stem(original, xb) for _, xb in batches(ids, batch_size)]
    masks = [m for _, m in stems]
    t_x = s_x = [x for x, _ in stems]
    report = []
    for i, (block, unpruned) in enumerate(zip(blocks, teacher)):
        t, t_out = _pieces(unpruned, t_x, masks)
        s, _ = _pieces(block, s_x, masks)
        attention = block.attention
        target = t["x"] + t["attended"] - s["x"]
        entry = {"layer": i, "heads": attention.num_heads, "rows": int(len(target))}
        before = _sse(attention.output_kernel, attention.output_bias, s["heads"], target)
        refit(attention.output_kernel, attention.output_bias, s["heads"], target, None, ridge)
        after = _sse(attention.output_kernel, attention.output_bias, s["heads"], target)
        entry["attention"] = {"before": before, "after": after}
        s, s_out = _pieces(block, s_x, masks)
        if ffn:
            dense = ffn_layers(block)[1]
            target = t["mid"] + t["ffn"] - s["mid"]
            before = _sse(dense.kernel, dense.bias, s["hidden"], target)
            refit(dense.kernel, dense.bias, s["hidden"], target, None, ffn_ridge)
            after = _sse(dense.kernel, dense.bias, s["hidden"], target)
            entry["ffn"] = {"before": before, "after": after}
            s, s_out = _pieces(block, s_x, masks)
        report.append(entry)
        t_x, s_x = t_out, s_out
    return report


# ---------------------------------------------------------------------- table
def fidelity(vectors: np.ndarray, reference: np.ndarray) -> dict:
    """Mean / min cosine and top-1 / top-5 neighbour agreement (`measure_embeddings`)."""
    from edge_demo.contract.parity import measure_embeddings

    p = measure_embeddings(vectors, reference)
    return {
        "mean_cosine": p.mean_cosine,
        "min_cosine": p.min_cosine,
        "top1": p.top1,
        "top5": p.top5,
    }


def prune_and_refit(
    model,
    config,
    removed,
    calibration: np.ndarray,
    ridge: float = ENCODER_RIDGE,
    ffn: bool = True,
    ffn_ridge: float | None = None,
):
    """`prune_encoder`, then `reconstruct_encoder` on `calibration`: (pruned, keep, report)."""
    pruned, keep = prune_encoder(model, removed, config)
    report = reconstruct_encoder(model, pruned, calibration, ridge, ffn, ffn_ridge)
    return pruned, keep, report


def choose_ridge(
    model,
    config,
    removed,
    calibration: np.ndarray,
    ridges=RIDGES,
    held_out: float = 0.2,
    seed: int = 0,
    ffn: bool = True,
    log=None,
) -> tuple[float, list[dict]]:
    """The ridge whose refit on (1 - held_out) of the calibration sentences gives the
    highest mean cosine on the rest (against the unpruned vectors): `(ridge, rows)`.

    Calibration sentences only, so the eval sentences stay unseen.
    """
    order = np.random.default_rng(seed).permutation(len(calibration))
    cut = int(round(len(calibration) * (1 - held_out)))
    fit, rest = calibration[order[:cut]], calibration[order[cut:]]
    reference = embed(model, rest)
    rows = []
    for ridge in ridges:
        pruned, _ = prune_encoder(model, removed, config)
        reconstruct_encoder(model, pruned, fit, ridge, ffn)
        rows.append({"ridge": ridge, **fidelity(embed(pruned, rest), reference)})
        if log:
            log(f"ridge {ridge:g}: held-out calibration mean cosine {rows[-1]['mean_cosine']:.4f}")
    best = max(rows, key=lambda r: r["mean_cosine"])
    return best["ridge"], rows


def pruning_table(
    model,
    config,
    scores: list[np.ndarray],
    calibration: np.ndarray,
    eval_ids: np.ndarray,
    reference: np.ndarray,
    fractions=(0.1, 0.2, 0.3, 0.4, 0.5),
    ridge: float = ENCODER_RIDGE,
    ffn: bool = True,
    ffn_ridge: float | None = None,
    log=None,
) -> list[dict]:
    """Per fraction: the heads removed (one shot by `scores`), the eval figures masked-only
    and after removal + refit on `calibration` (against `reference`, the unpruned vectors)."""
    rows = []
    for fraction in fractions:
        start = time.perf_counter()
        removed = select_heads(scores, fraction)
        masked = embed(model, eval_ids, removal_masks(model, removed))
        pruned, keep, _ = prune_and_refit(
            model, config, removed, calibration, ridge, ffn, ffn_ridge
        )
        rebuilt = embed(pruned, eval_ids)
        row = {
            "fraction": fraction,
            "removed": [list(p) for p in removed],
            "heads_per_layer": [len(k) for k in keep],
            "masked": fidelity(masked, reference),
            "reconstructed": fidelity(rebuilt, reference),
            "seconds": round(time.perf_counter() - start, 1),
        }
        rows.append(row)
        if log:
            log(format_row(row))
    return rows


def format_row(row: dict) -> str:
    m, r = row["masked"], row["reconstructed"]
    return (
        f"{row['fraction']:4.0%} {len(row['removed']):3d} heads {row['heads_per_layer']}  "
        f"masked cos {m['mean_cosine']:.4f}/{m['min_cosine']:.4f} top1 {m['top1']:.3f} "
        f"top5 {m['top5']:.3f} | refit cos {r['mean_cosine']:.4f}/{r['min_cosine']:.4f} "
        f"top1 {r['top1']:.3f} top5 {r['top5']:.3f}  ({row['seconds']} s)"
    )


# ------------------------------------------------------------------- the run
def count_params(model) -> int:
    return int(sum(np.prod(w.shape) for w in model.weights))


def write_pruned_run(run, pruned, out, pruning: dict, overwrite: bool = False, vectors=None):
    """Write `pruned` (from `run`, an `EmbeddingRun`) as an embedding run at `out`.

    eval.npz holds the pruned model's own vectors (export's float parity is
    against them); metrics.json is the source's plus `pruning` (the removed
    heads, heads per layer, the figures against the unpruned vectors), and
    its `config` is the source's `BertConfig` with `heads_per_layer`, the
    pruned model's heads (`num_heads` and `key_dim` stay the unpruned ones).
    `vectors`: `embed(pruned, run.eval.x)` if already made.
    """
    import dataclasses

    from keras_mha.rundir.embedding import write_embedding_run

    vectors = embed(pruned, run.eval.x) if vectors is None else vectors
    config = dataclasses.replace(run.config, heads_per_layer=tuple(heads_per_layer(pruned)))
    metrics = {**run.metrics, "config": config.to_dict(), "pruning": pruning}
    return write_embedding_run(
        out,
        pruned,
        metrics,
        run.eval.x,
        vectors,
        run.calibration,
        list(run.texts),
        (pathlib.Path(run.path) / "tokenizer.json").read_bytes(),
        overwrite=overwrite,
    )


def _importance_rows(scores, ablation) -> list[dict]:
    return [
        {
            "layer": layer,
            "head": head,
            "importance": float(scores[layer][head]),
            "ablation": float(ablation[layer][head]),
        }
        for layer in range(len(scores))
        for head in range(len(scores[layer]))
    ]


def _plot(rows: list[dict], path: pathlib.Path, removed=()) -> None:
    from keras_mha.heads.plotting import pyplot, save_png

    plt = pyplot()
    removed = {tuple(p) for p in removed}
    fig, ax = plt.subplots(figsize=(max(4.5, 0.16 * len(rows)), 3.2))
    colors = ["tab:red" if (r["layer"], r["head"]) in removed else "tab:blue" for r in rows]
    ax.bar(range(len(rows)), [r["importance"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)), [f"L{r['layer']}H{r['head']}" for r in rows], rotation=90)
    ax.tick_params(axis="x", labelsize=5)
    ax.set_ylabel("mean ||d e / d xi_h||")
    title = "Encoder head importance (Jacobian norm, calibration sentences)"
    ax.set_title(title + (", removed in red" if removed else ""), fontsize=9)
    save_png(fig, path)


def cmd_importance_embedding(args: argparse.Namespace) -> int:
    """`keras-mha-heads importance RUN` for an embedding run: RUN/heads/importance.json."""
    from edge_demo.contract.files import check_writable, write_json_atomic
    from keras_mha.rundir.embedding import read_embedding_run

    out = pathlib.Path(args.run_dir) / "heads"
    check_writable(out / "importance.json", "RUN_DIR")
    run = read_embedding_run(args.run_dir)
    model = run.load_model()
    start = time.perf_counter()
    scores = jacobian_importance(model, run.calibration)
    jacobian_seconds = time.perf_counter() - start
    ablation = ablation_importance(model, run.calibration)
    rows = _importance_rows(scores, ablation)
    rho = spearman(scores, ablation)
    result = {
        "run": str(args.run_dir),
        "task": "embedding",
        "split": "calibration",
        "split_size": int(len(run.calibration)),
        "importance": "mean over sentences of ||d e / d xi_h||_2 (Jacobian of the unit "
        "sentence vector with respect to the head's gate, at all heads on)",
        "ablation": "mean over sentences of 1 - cos(vector with the head alone masked, vector)",
        "spearman_importance_ablation": rho,
        "jacobian_seconds": round(jacobian_seconds, 1),
        "heads": rows,
    }
    print(f"{'layer':>5} {'head':>4} {'importance':>10} {'ablation':>10}")
    for r in rows:
        print(f"{r['layer']:5d} {r['head']:4d} {r['importance']:10.5f} {r['ablation']:10.6f}")
    print(f"Spearman (Jacobian importance, single-head ablation) over {len(rows)} heads: {rho:.4f}")
    write_json_atomic(out / "importance.json", result)
    _plot(rows, out / "importance.png")
    print(f"wrote {out / 'importance.json'} and {out / 'importance.png'}")
    return 0


def cmd_prune_embedding(args: argparse.Namespace) -> int:
    """`keras-mha-heads prune RUN --fraction F --out NEW` for an embedding run.

    Importance on the calibration sentences (`--split` has no meaning
    here: an embedding run has no labelled splits), one-shot selection,
    removal, refit on the calibration sentences unless `--no-reconstruct`;
    `--finetune-epochs` is refused (no labels, no training loss).
    """
    from edge_demo.contract.files import check_writable
    from keras_mha.rundir.embedding import read_embedding_run
    from keras_mha.rundir.writing import check_out

    if not 0.0 <= args.fraction < 1.0:
        raise UsageError(f"--fraction must be in [0, 1); got {args.fraction}")
    if getattr(args, "finetune_epochs", 0):
        raise UsageError(
            "an embedding run has no labels to fine-tune on; use the least-squares refit "
            "(--reconstruct, the default)",
            "--finetune-epochs",
        )
    if pathlib.Path(args.out).resolve() == pathlib.Path(args.run_dir).resolve():
        raise UsageError("the output must differ from the source run", f"--out {args.out}")
    check_out(args.out, args.overwrite)
    check_writable(args.out, "--out")
    run = read_embedding_run(args.run_dir)
    model = run.load_model()
    reference = run.eval.probs
    scores = jacobian_importance(model, run.calibration)
    removed = select_heads(scores, args.fraction)
    masked = fidelity(embed(model, run.eval.x, removal_masks(model, removed)), reference)
    reconstruct = getattr(args, "reconstruct", True)
    pruned, keep = prune_encoder(model, removed, run.config)
    report = None
    if reconstruct:
        report = reconstruct_encoder(model, pruned, run.calibration)
    pruning = {
        "source_run": str(args.run_dir),
        "fraction_requested": args.fraction,
        "importance": "jacobian",
        "importance_split": "calibration",
        "selection": "one-shot",
        "heads_before": heads_per_layer(model),
        "heads_after": [len(k) for k in keep],
        "key_dim": int(encoder_blocks(model)[0].attention.d_k),
        "removed": [list(p) for p in removed],
        "fraction_removed": len(removed) / sum(heads_per_layer(model)),
        "params_before": count_params(model),
        "params_after": count_params(pruned),
        "eval_masked": masked,
        "reconstruction": None
        if report is None
        else {
            "split": "calibration",
            "sentences": int(len(run.calibration)),
            "ridge": ENCODER_RIDGE,
            "maps": "W^O and the FFN output of every block",
            "layers": report,
        },
    }
    vectors = embed(pruned, run.eval.x)
    figures = fidelity(vectors, reference)
    pruning["eval_pruned" if report is None else "eval_reconstructed"] = figures
    write_pruned_run(run, pruned, args.out, pruning, args.overwrite, vectors)
    total = sum(pruning["heads_before"])
    print(
        f"removed {len(removed)}/{total} heads {pruning['removed']}: heads per layer "
        f"{pruning['heads_before']} -> {pruning['heads_after']}, params "
        f"{pruning['params_before']} -> {pruning['params_after']}"
    )
    for name, f in (("masked", masked), ("reconstructed" if reconstruct else "pruned", figures)):
        print(
            f"{name:>13}: mean cosine {f['mean_cosine']:.4f}, min {f['min_cosine']:.4f}, "
            f"top-1 {f['top1']:.3f}, top-5 {f['top5']:.3f} (eval, against the unpruned vectors)"
        )
    print(f"wrote {args.out}")
    return 0
