"""Heads of a label-free sentence encoder: importance, selection, removal, least-squares refit.

- importance: `jacobian_importance` (the default: mean ||d e / d xi_h||, the
  sentence vector's Jacobian for head h's gate, exact in forward mode) and
  `ablation_importance` (the cross-check), both from `head_effects`;
  `importance` takes a classifier (Michel et al., with labels) or an encoder.
- selection: `select_heads` (one shot, never a layer's last head),
  `select_heads_greedy`, `removal_masks`.
- removal: `prune_encoder`, a smaller encoder equal to the masked one.
- refit: `reconstruct_encoder` (W^O and the FFN output, block by block, on
  unlabeled sentences), `ENCODER_RIDGE`, `choose_ridge`, `prune_and_refit`.
- fidelity: `fidelity`, `pruning_table` (masked against removed and refit).

Figures: docs/pretrained.md; why these choices and what else was tried:
docs/heads.md. Running the encoder (`embed`, `batches`) and building a pruned
one: keras_mha.pretrained.encoding; the commands: encoder_commands.py.
"""

from __future__ import annotations

import time
import weakref

import numpy as np

from bundle_contract.errors import UsageError
from keras_mha.heads.importance import head_importance, rank_heads
from keras_mha.heads.masks import all_heads_on, heads_per_layer
from keras_mha.heads.reconstruction import output_matrix, refit
from keras_mha.heads.selection import check_fraction
from keras_mha.heads.surgery import ffn_layers
from keras_mha.model import encoder_blocks
from keras_mha.pretrained.encoding import (
    BATCH_SIZE,
    batches,
    build_pruned_encoder,
    embed,
    pad_id_of,
)

KINDS = ("auto", "classifier", "encoder")
METHODS = ("jacobian", "ablation")
# The refit's ridge (`reconstruction.refit`'s, relative to each input's energy), for
# W^O and the FFN output alike, chosen by `choose_ridge` on MiniLM: docs/heads.md.
ENCODER_RIDGE = 3.0
RIDGES = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
JVP_BATCH_SIZE = 8  # sentences per Jacobian batch (times a layer's heads)


# ------------------------------------------------------------------ the model
def _stem(model, xb):
    """The embedding's output and its mask `ids != pad_id` for ids `xb` (B, T)."""
    from keras import ops

    embedding = model.get_layer("embedding")
    xb = ops.convert_to_tensor(xb, "int32")
    return embedding(xb), embedding.compute_mask(xb)


def _tail(model, blocks, start: int, x, mask, gate, head_masks):
    """The output (unit vectors, or a classifier's probabilities) from block `start`'s
    input `x`; `gate` is that block's head mask."""
    for j in range(start, len(blocks)):
        head_mask = gate if j == start else head_masks[j]
        x = blocks[j](x, mask=mask, head_mask=head_mask)
    from keras_mha.pretrained.bert import head_forward

    return head_forward(model, x, mask)


def _block_inputs(model, blocks, xb, head_masks):
    """Each block's input for ids `xb` (with `head_masks`), the mask and the unit vectors."""
    x, mask = _stem(model, xb)
    inputs = []
    for j, block in enumerate(blocks):
        inputs.append(x)
        x = block(x, mask=mask, head_mask=head_masks[j])
    from keras_mha.pretrained.bert import head_forward

    return inputs, mask, head_forward(model, x, mask)


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
    for rows, xb in batches(ids, batch_size, pad_id_of(model)):
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
    """I_h = mean over sentences of ||d e / d xi_h||_2; `(h,)` per layer.

    The Jacobian column of the unit sentence vector e for head h's gate, at
    the gates `head_masks` (default every head on): how far e itself moves.
    The label-free loss 1 - cos(e(xi), e(1)) is flat at xi = 1, so its
    gradient (Michel et al.'s score) is zero there; to second order,
    turning head h down by delta costs delta^2 / 2 * ||d e / d xi_h||^2.
    """
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

    A classifier: Michel et al.'s E|dL/d xi_h| with labels `y`
    (`head_importance`; `method` is not used). An encoder: `method`
    `"jacobian"` or `"ablation"` on the sentences `x` (token ids), no labels.
    `kind="auto"` goes by the labels: given, a classifier's; without, an
    encoder's. Either way `rank_heads` orders them, least important first.
    """
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if kind == "auto":
        kind = "encoder" if y is None else "classifier"
    if kind == "classifier":
        if y is None:
            raise UsageError("a classifier's importance (Michel et al.) needs the labels y")
        return head_importance(model, x, y, head_masks)
    if method not in METHODS:
        raise UsageError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    from keras_mha.layers import BertEmbeddings

    names = {layer.name: layer for layer in model.layers}
    if "pooling" not in names or not isinstance(names.get("embedding"), BertEmbeddings):
        raise UsageError(
            f"model {model.name!r} is not a keras_mha.pretrained model (an `embedding` and a "
            "`pooling` layer); a classifier's importance (Michel et al.) needs the labels y"
        )
    if method == "jacobian":
        return jacobian_importance(model, x, head_masks)
    return ablation_importance(model, x, head_masks)


# ------------------------------------------------------------------ selection
def select_heads(scores: list[np.ndarray], fraction: float, head_masks=None) -> list:
    """One shot: the round(fraction * heads) least important heads, never a layer's last.

    Scores are compared across layers as they are, not normalised per layer:
    they are in the same units (vector change per unit gate) in every layer.
    """
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
    head = config.labels or config.score_activation  # a classifier's or a cross-encoder's
    for name in ("pre_classifier", "classifier") if head else ():  # the head as it was
        new.get_layer(name).set_weights(model.get_layer(name).get_weights())
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
    real tokens only (padded positions never enter the least squares), as
    `reconstruction.reconstruct` does for the classifiers (Kwon et al. 2022):

        W^O, b^O <- argmin || x'_l + Concat(kept heads) W^O + b^O - (x_l + A_l) ||^2
        W_2, b_2 <- argmin || m'_l + GELU(m'_l W_1 + b_1) W_2 + b_2 - (m_l + F_l) ||^2

    (x_l, A_l, m_l, F_l: the unpruned block's input, attention output, first
    LayerNorm output and FFN output; primes: the pruned model's, after the
    refits of the blocks before it), so what enters each post-LN LayerNorm
    follows the unpruned model's, drift from earlier blocks included.
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
    stems = [_stem(original, xb) for _, xb in batches(ids, batch_size, pad_id_of(original))]
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
def fidelity(outputs: np.ndarray, reference: np.ndarray, task) -> dict:
    """`task`'s figures (`Task.fidelity`, from its own `measure`) of a model's eval
    outputs against `reference`, the unpruned model's on the same inputs: a sentence
    encoder's cosines and neighbours, a classifier's agreement and |Δp|, a
    cross-encoder's rankings and |Δ|."""
    from bundle_contract.arrays import EvalData

    reference = np.asarray(reference, np.float32)
    unlabelled = EvalData(None, np.zeros(len(reference), np.int64), reference, labelled=False)
    parity = task.measure(outputs, unlabelled)
    return {name: getattr(parity, name) for name in task.fidelity}


def _cosines(vectors: np.ndarray, reference: np.ndarray) -> dict:
    """A sentence encoder's figures (`measure_embeddings`), for the ridge and pruning studies."""
    from bundle_contract.tasks.embedding import Embedding, measure_embeddings

    parity = measure_embeddings(vectors, reference)
    return {name: getattr(parity, name) for name in Embedding.fidelity}


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
        rows.append({"ridge": ridge, **_cosines(embed(pruned, rest), reference)})
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
            "masked": _cosines(masked, reference),
            "reconstructed": _cosines(rebuilt, reference),
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
