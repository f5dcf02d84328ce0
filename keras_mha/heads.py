"""keras-mha-heads: which heads matter, pruning that removes them, per-head views.

    keras-mha-heads importance RUN_DIR [--split train|validation]
    keras-mha-heads curve RUN_DIR [--step 0.1] [--split train|validation] [--no-reconstruct]
    keras-mha-heads prune RUN_DIR --fraction F --out NEW_RUN_DIR [--finetune-epochs N]
                          [--finetune-lr LR] [--split train|validation] [--no-reconstruct]
                          [--overwrite]
    keras-mha-heads plot RUN_DIR --sample N

Importance follows Michel, Levy & Neubig (2019), "Are Sixteen Heads Really
Better than One?": each head h gets a gate xi_h on its output (1 = on), and

    I_h = E_x | dL(x) / d xi_h |

over a split that is not the test split (the run's training split before
augmentation by default, `--split validation` for its validation split: on
digits 1,293 examples against 144), normalised per layer by the L2 norm.
Pruning removes a head's W_i^Q, W_i^K, W_i^V, biases and its rows of W^O
(`MultiHeadAttention.pruned`); the pruned model equals the original with
those gates at 0.

Then, unless `--no-reconstruct`, the maps after the removed heads (W^O, the
FFN's output Dense, the classifier) are refit by least squares so that the
smaller model's activations are fit to the original's on the training split
(`reconstruct`; no labels, no gradient steps), and `--finetune-epochs`
trains it further.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys

import numpy as np

from keras_mha.cliutil import one_line
from keras_mha.fsutil import staging_dir, swap_into_place, write_json_atomic

HEADS_DIR = "heads"


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2."""


# ------------------------------------------------------------------ loading
def load_run(run_dir: str | os.PathLike):
    """(model, metrics, eval arrays) of a run directory, with clear errors."""
    run = pathlib.Path(run_dir)
    if not run.is_dir():
        raise UsageError(
            f"{run}: not a run directory (expected model.keras, metrics.json, eval.npz)"
        )
    for name in ("model.keras", "metrics.json", "eval.npz"):
        if not (run / name).is_file():
            raise UsageError(
                f"{run / name}: missing; expected a run directory from keras-mha-train"
            )
    try:
        metrics = json.loads((run / "metrics.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{run / 'metrics.json'}: not valid JSON ({e})") from None
    model = load_model(run / "model.keras")
    from keras_mha.model import encoder_blocks

    try:
        encoder_blocks(model)
    except ValueError as e:
        raise UsageError(f"{run / 'model.keras'}: {e}") from None
    with np.load(run / "eval.npz", allow_pickle=False) as data:
        eval_arrays = {key: data[key] for key in data.files}
    return model, metrics, eval_arrays


def load_model(path: pathlib.Path):
    import keras

    import keras_mha  # noqa: F401  (registers our layers before loading)

    try:
        return keras.saving.load_model(path)
    except Exception as e:  # Keras raises many kinds for a bad file
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"{path}: cannot load the model ({message})") from None


SPLITS = ("train", "validation")


def run_dataset(metrics: dict):
    """The run's dataset, split as it was for training (same name and seed)."""
    from keras_mha.data import load_dataset

    dataset = load_dataset(metrics["dataset"], int(metrics.get("seed", 0)))
    return dataset


def scoring_data(dataset, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The labelled non-test examples heads are scored on: `split` of `dataset`."""
    if split == "validation":
        return dataset.x_val, dataset.y_val
    if split == "train":
        return dataset.x_train, dataset.y_train
    raise UsageError(f"--split must be one of {', '.join(SPLITS)}; got {split!r}")


def heads_per_layer(model) -> list[int]:
    from keras_mha.model import attention_layers

    return [layer.num_heads for layer in attention_layers(model)]


# --------------------------------------------------------------- the maths
def _gates(model, value: float = 1.0) -> list[np.ndarray]:
    return [np.full((h,), value, "float32") for h in heads_per_layer(model)]


def predict(model, x: np.ndarray, gates: list[np.ndarray] | None = None, batch_size: int = 256):
    """Softmax outputs with optional per-layer head gates `(h,)`."""
    from keras_mha.model import forward

    out = []
    for start in range(0, len(x), batch_size):
        probs = forward(model, x[start : start + batch_size], head_masks=gates)
        out.append(np.asarray(probs))
    return np.concatenate(out)


def accuracy(model, x, y, gates=None) -> float:
    return float((predict(model, x, gates).argmax(-1) == y).mean())


def head_importance(
    model,
    x: np.ndarray,
    y: np.ndarray,
    gates: list[np.ndarray] | None = None,
    batch_size: int = 128,
) -> list[np.ndarray]:
    """I_h = mean over examples of |dL/d xi_h|, L2-normalised per layer.

    Gates are per example, `(B, h)`, so one backward pass gives every
    example's own gradient. Heads whose gate is 0 (already pruned) score 0.
    """
    import tensorflow as tf

    from keras_mha.model import forward

    gates = gates if gates is not None else _gates(model)
    totals = [np.zeros_like(g, dtype="float64") for g in gates]
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size]
        yb = y[start : start + batch_size]
        xi = [tf.Variable(np.tile(g[None, :], (len(xb), 1))) for g in gates]
        with tf.GradientTape() as tape:
            probs = forward(model, xb, head_masks=xi)
            picked = tf.gather(probs, yb, axis=1, batch_dims=1)
            loss = -tf.reduce_sum(tf.math.log(tf.maximum(picked, 1e-12)))
        for total, grad in zip(totals, tape.gradient(loss, xi)):
            total += np.abs(grad.numpy()).sum(axis=0)
    scores = []
    for total, gate in zip(totals, gates):
        score = (total / len(x)) * (gate > 0)
        norm = np.linalg.norm(score)
        scores.append((score / norm if norm > 0 else score).astype("float32"))
    return scores


def prune_model(model, remove: dict[int, list[int]]):
    """A new model without the heads in `remove` ({layer index: [head, ...]})."""
    from keras_mha.model import ModelConfig, build_classifier, encoder_blocks

    blocks = encoder_blocks(model)
    keep = []
    for i, block in enumerate(blocks):
        gone = set(remove.get(i, []))
        heads = [h for h in range(block.attention.num_heads) if h not in gone]
        if not heads:
            raise UsageError(f"pruning would leave layer {i} with no head")
        keep.append(heads)
    old_config = _model_config(model)
    d_k = blocks[0].attention.d_k
    if any(b.attention.d_k != d_k for b in blocks):
        raise UsageError("pruning needs the same d_k in every layer")
    config = ModelConfig.from_dict(
        {**old_config.to_dict(), "num_heads": [len(k) for k in keep], "key_dim": d_k}
    )
    new = build_classifier(config)
    new_blocks = {b.name: b for b in encoder_blocks(new)}
    for layer in model.layers:
        if not layer.weights:
            continue
        target = new.get_layer(layer.name)
        if layer.name in new_blocks:
            i = blocks.index(layer)
            target.attention.set_weights(layer.attention.pruned(keep[i]).get_weights())
            for name in ("attention_norm", "ffn_norm", "_ffn_in", "_ffn_out"):
                getattr(target, name).set_weights(getattr(layer, name).get_weights())
        else:
            target.set_weights(layer.get_weights())
    return new


# ----------------------------------------------------------- reconstruction
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
            heads = attention.concat_heads(h, query_mask=mask, value_mask=mask)
            attended = ops.matmul(heads, attention.output_kernel)
            if attention.use_bias:
                attended = attended + attention.output_bias
            mid = block.attention_norm(h + attended)
            hidden = block._ffn_in(mid)
            ffn = block._ffn_out(hidden)
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
        part["mask"] = np.ones(h.shape[:2], bool) if mask is None else mask
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


def _refit(kernel, bias, inputs, targets, rows, ridge: float) -> None:
    """kernel, bias <- the least-squares map from `inputs` to `targets`.

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

    a = inputs.reshape(-1, inputs.shape[-1]).astype("float64")
    y = targets.reshape(-1, targets.shape[-1]).astype("float64")
    if rows is not None:
        a, y = a[rows], y[rows]
    w_now = ops.convert_to_numpy(kernel).astype("float64")
    if bias is not None:
        a = np.concatenate([a, np.ones((len(a), 1))], axis=1)
        w_now = np.concatenate([w_now, ops.convert_to_numpy(bias)[None].astype("float64")])
    gram = a.T @ a
    energy = np.diag(gram).copy()
    inputs_energy = energy[: kernel.shape[0]]
    energy[: kernel.shape[0]] = np.maximum(inputs_energy, np.median(inputs_energy))
    lam = ridge * energy
    w = np.linalg.solve(gram + np.diag(lam), a.T @ y + lam[:, None] * w_now)
    kernel.assign(w[: kernel.shape[0]].astype("float32"))
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

    Without labels, on examples `x` (a training split), layer by layer in
    the spirit of Kwon et al. (2022), "A Fast Post-Training Pruning
    Framework for Transformers". With `x_l`, `A_l`, ... the original's
    activations in block l and primes the pruned model's (computed after the
    refits of the blocks before it):

        W^O, b^O <- argmin || x'_l + Concat(kept heads) W^O + b^O - (x_l + A_l) ||^2
        W_2, b_2 <- argmin || m'_l + ReLU(m'_l W_1 + b_1) W_2 + b_2 - (m_l + F_l) ||^2

    so that what enters each LayerNorm is fit to the original's, drift from
    earlier layers included; then the classifier, to the original's logits.
    Padded tokens are left out. `ridge` (relative to each input's scale, see
    `_refit`) pulls each map towards its current weights, so a map whose
    inputs did not change keeps them. `teacher`: `trace(original, x)` if already made.
    Modifies `pruned` in place and returns it.
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
        _refit(attention.output_kernel, attention.output_bias, s["heads"], target, rows, ridge)
        s = trace(pruned, x, batch_size)["blocks"][i]
        target = t["mid"] + t["ffn"] - s["mid"]
        _refit(block._ffn_out.kernel, block._ffn_out.bias, s["hidden"], target, rows, ridge)
    classifier = pruned.get_layer("classifier")
    pooled = trace(pruned, x, batch_size)["pooled"]
    _refit(classifier.kernel, classifier.bias, pooled, teacher["logits"], None, ridge)
    return pruned


def _model_config(model):
    """ModelConfig of a model built by build_classifier, read off its layers."""
    import keras

    from keras_mha.model import ModelConfig, encoder_blocks

    blocks = encoder_blocks(model)
    embedding = model.get_layer("embedding")
    tokens = isinstance(embedding, keras.layers.Embedding)
    first = blocks[0]
    return ModelConfig(
        input_kind="tokens" if tokens else "features",
        sequence_length=int(model.inputs[0].shape[1]),
        feature_dim=int(embedding.input_dim if tokens else model.inputs[0].shape[2]),
        num_classes=int(model.outputs[0].shape[-1]),
        d_model=int(first.attention.d_model),
        num_heads=[b.attention.num_heads for b in blocks],
        num_layers=len(blocks),
        ff_dim=int(first.ff_dim),
        dropout=float(first.dropout),
        key_dim=first.key_dim,
        positional=model.get_layer("positional_encoding").kind,
        implementation=first.implementation,
        pooling="flatten"
        if isinstance(model.get_layer("pooling"), keras.layers.Flatten)
        else "mean",
        seed=int(first.seed or 0),
    )


def rank_heads(
    scores: list[np.ndarray], gates: list[np.ndarray] | None = None
) -> list[tuple[int, int]]:
    """(layer, head) pairs still on, least important first."""
    items = []
    for layer, score in enumerate(scores):
        for head, value in enumerate(score):
            if gates is None or gates[layer][head] > 0:
                items.append((float(value), layer, head))
    return [(layer, head) for _, layer, head in sorted(items)]


def pruning_curve(
    model, x_score, y_score, x_test, y_test, step: float = 0.1, x_reconstruct=None
) -> list[dict]:
    """The paper's greedy curve: repeatedly drop the next `step` of all heads.

    Importance is recomputed on `x_score, y_score` (a non-test split) after
    every step, on the model with the pruned heads gated off; accuracy is on
    the test split. With `x_reconstruct` (a training split), each point also
    has `accuracy_reconstructed`: the pruned model after `reconstruct`.
    """
    gates = _gates(model)
    total = sum(len(g) for g in gates)
    teacher = None if x_reconstruct is None else trace(model, x_reconstruct)

    def point(pruned: list[tuple[int, int]]) -> dict:
        result = {
            "fraction": len(pruned) / total,
            "pruned": [list(p) for p in pruned],
            "accuracy": accuracy(model, x_test, y_test, gates),
        }
        if x_reconstruct is not None:
            remove: dict[int, list[int]] = {}
            for layer, head in pruned:
                remove.setdefault(layer, []).append(head)
            smaller = prune_model(model, remove)
            reconstruct(model, smaller, x_reconstruct, teacher=teacher)
            result["accuracy_reconstructed"] = accuracy(smaller, x_test, y_test)
        return result

    points = [point([])]
    pruned: list[tuple[int, int]] = []
    for k in range(1, int(1.0 / step + 1e-9) + 1):
        target = _count(k * step, total)
        if target <= len(pruned):
            continue
        scores = head_importance(model, x_score, y_score, gates)
        progressed = False
        while len(pruned) < target:
            candidates = [c for c in rank_heads(scores, gates) if gates[c[0]].sum() > 1]
            if not candidates:  # every layer is down to its last head
                break
            layer, head = candidates[0]
            gates[layer][head] = 0.0
            pruned.append((layer, head))
            progressed = True
        if not progressed:
            break
        points.append(point(pruned))
    return points


def _count(fraction: float, total: int) -> int:
    """Heads in `fraction` of `total`, rounded half up."""
    return int(fraction * total + 0.5 + 1e-9)


def select_heads_to_prune(model, x_score, y_score, fraction: float) -> list[tuple[int, int]]:
    """The greedy selection of `pruning_curve`, up to round(fraction * heads).

    Importance is recomputed after every head; a layer's last head is never
    a candidate, so a fraction is refused only if it needs more heads than
    every layer but one head each.
    """
    if not 0.0 <= fraction < 1.0:
        raise UsageError(f"--fraction must be in [0, 1); got {fraction}")
    gates = _gates(model)
    total = sum(len(g) for g in gates)
    target = _count(fraction, total)
    if target > total - len(gates):
        raise UsageError(
            f"--fraction {fraction} removes {target} of {total} heads, which would leave a "
            f"layer with no head (heads per layer: {[len(g) for g in gates]}; at most "
            f"{total - len(gates)} can go)"
        )
    pruned: list[tuple[int, int]] = []
    while len(pruned) < target:
        scores = head_importance(model, x_score, y_score, gates)
        candidates = [c for c in rank_heads(scores, gates) if gates[c[0]].sum() > 1]
        layer, head = candidates[0]
        gates[layer][head] = 0.0
        pruned.append((layer, head))
    return pruned


def paired_drop(
    correct_before: np.ndarray, correct_after: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> dict:
    """How much accuracy a change cost on one test set, and how sure that is.

    `correct_*` are per-example booleans on the same examples. Returns the
    drop in percentage points, the examples `lost` (right before, wrong
    after) and `gained`, and a 95 % paired bootstrap interval of the drop:
    the examples are resampled with replacement, the same draw for both.
    """
    before = np.asarray(correct_before, bool)
    after = np.asarray(correct_after, bool)
    if before.shape != after.shape or before.ndim != 1 or not len(before):
        raise ValueError(
            "paired_drop needs two 1-D boolean arrays of the same, non-zero length; "
            f"got shapes {before.shape} and {after.shape}"
        )
    diff = before.astype("float64") - after.astype("float64")
    picks = np.random.default_rng(seed).integers(0, len(diff), (resamples, len(diff)))
    drops = 100.0 * diff[picks].mean(axis=1)
    low, high = np.percentile(drops, [2.5, 97.5])
    return {
        "points": float(100.0 * diff.mean()),
        "lost": int((before & ~after).sum()),
        "gained": int((~before & after).sum()),
        "examples": len(diff),
        "ci95_points": [float(low), float(high)],
        "resamples": resamples,
    }


def finetune(model, dataset, metrics: dict, epochs: int, learning_rate: float = 5e-4):
    """Train a pruned model a little more, the way its run was trained.

    Same training data (with the run's shifted copies when it used them),
    batch size and seed; Adam with cosine decay from `learning_rate`. The
    weights with the lowest validation loss are kept, the starting ones
    included: if no epoch beats the model as it came in, it is left as it
    was. Op determinism is on, so the same run and arguments give the same
    model. Like `keras.utils.set_random_seed`, it reseeds Python, NumPy and
    the backend for the whole process (with the run's seed).

    Returns `{"start_val_loss", "best_val_loss", "best_epoch", "improved"}`:
    `best_epoch` (from 1) is 0 and `improved` False when no epoch beat the
    starting weights, which are then what the model holds.
    """
    if epochs < 1 or learning_rate <= 0:
        raise ValueError(
            f"finetune needs epochs >= 1 and learning_rate > 0; "
            f"got epochs={epochs}, learning_rate={learning_rate}"
        )
    import keras

    from keras_mha.train import op_determinism, shift_augment

    training = metrics.get("training", {})
    x_train, y_train = dataset.x_train, dataset.y_train
    if training.get("shift_augment"):
        x_train, y_train = shift_augment(x_train, y_train)
    batch_size = int(training.get("batch_size", 32))
    steps = epochs * -(-len(x_train) // batch_size)
    model.compile(
        optimizer=keras.optimizers.Adam(
            keras.optimizers.schedules.CosineDecay(learning_rate, steps)
        ),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    # Never stops early (patience = epochs); used for its Keras 3 behaviour of
    # restoring the best epoch's weights at the end, and its record of it.
    stopper = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=epochs, restore_best_weights=True
    )
    keras.utils.set_random_seed(int(metrics.get("seed", 0)))
    with op_determinism(True):
        start_weights = model.get_weights()
        start_loss = float(
            model.evaluate(dataset.x_val, dataset.y_val, batch_size=batch_size, verbose=0)[0]
        )
        history = model.fit(
            x_train,
            y_train,
            validation_data=(dataset.x_val, dataset.y_val),
            epochs=epochs,
            batch_size=batch_size,
            verbose=0,
            callbacks=[stopper],
        )
    best_loss = float(history.history["val_loss"][stopper.best_epoch])
    improved = bool(best_loss < start_loss)  # False for NaN too
    if not improved:
        model.set_weights(start_weights)
    return {
        "start_val_loss": start_loss,
        "best_val_loss": best_loss if improved else start_loss,
        "best_epoch": stopper.best_epoch + 1 if improved else 0,
        "improved": improved,
    }


# ------------------------------------------------------------------- output
def _save_png(fig, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    os.replace(tmp, path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cue_accuracy(probs: np.ndarray, y: np.ndarray, cues) -> dict[str, float]:
    cues = np.asarray(cues).astype(str)
    correct = probs.argmax(-1) == y
    return {str(c): float(correct[cues == c].mean()) for c in sorted(set(cues.tolist()))}


# ----------------------------------------------------------------- commands
def cmd_importance(args) -> int:
    model, metrics, ev = load_run(args.run_dir)
    x_score, y_score = scoring_data(run_dataset(metrics), args.split)
    scores = head_importance(model, x_score, y_score)
    base_probs = predict(model, ev["x"])
    base = float((base_probs.argmax(-1) == ev["y"]).mean())
    rows = []
    cues = ev.get("cue")
    for layer, score in enumerate(scores):
        for head, value in enumerate(score):
            gates = _gates(model)
            gates[layer][head] = 0.0
            probs = predict(model, ev["x"], gates)
            row = {
                "layer": layer,
                "head": head,
                "importance": float(value),
                "accuracy_without": float((probs.argmax(-1) == ev["y"]).mean()),
            }
            if cues is not None:
                row["cue_accuracy_without"] = cue_accuracy(probs, ev["y"], cues)
            rows.append(row)
    result = {
        "run": str(args.run_dir),
        "split": args.split,
        "split_size": len(y_score),
        "test_accuracy": base,
        "heads": rows,
    }
    if cues is not None:
        result["cue_accuracy"] = cue_accuracy(base_probs, ev["y"], cues)
    print(f"test accuracy with every head: {base:.4f}")
    print(f"{'layer':>5} {'head':>4} {'importance':>10} {'acc without':>11}")
    for r in rows:
        print(
            f"{r['layer']:5d} {r['head']:4d} {r['importance']:10.4f} {r['accuracy_without']:11.4f}"
        )
    out = pathlib.Path(args.run_dir) / HEADS_DIR
    write_json_atomic(out / "importance.json", result)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * len(rows)), 3))
    ax.bar(range(len(rows)), [r["importance"] for r in rows], color="tab:blue")
    ax.set_xticks(range(len(rows)), [f"L{r['layer']}H{r['head']}" for r in rows], rotation=90)
    ax.set_ylabel("importance (L2-normalised per layer)")
    ax.set_title(f"Head importance, E|dL/d xi_h| on the {args.split} split")
    _save_png(fig, out / "importance.png")
    plt.close(fig)
    print(f"wrote {out / 'importance.json'} and {out / 'importance.png'}")
    return 0


def _reconstruction_record(data) -> dict:
    return {"split": "train", "examples": len(data.x_train), "ridge": RIDGE}


def cmd_curve(args) -> int:
    if not 0.0 < args.step < 1.0:
        raise UsageError(f"--step must be in (0, 1); got {args.step}")
    model, metrics, ev = load_run(args.run_dir)
    data = run_dataset(metrics)
    x_score, y_score = scoring_data(data, args.split)
    x_reconstruct = data.x_train if args.reconstruct else None
    points = pruning_curve(model, x_score, y_score, ev["x"], ev["y"], args.step, x_reconstruct)
    print(f"test accuracy, importance on the {args.split} split")
    print(
        f"{'pruned':>7} {'accuracy':>8}" + (f" {'reconstructed':>13}" if args.reconstruct else "")
    )
    for p in points:
        line = f"{p['fraction']:7.0%} {p['accuracy']:8.4f}"
        if args.reconstruct:
            line += f" {p['accuracy_reconstructed']:13.4f}"
        print(line)
    out = pathlib.Path(args.run_dir) / HEADS_DIR
    write_json_atomic(
        out / "curve.json",
        {
            "run": str(args.run_dir),
            "step": args.step,
            "split": args.split,
            "reconstruction": _reconstruction_record(data) if args.reconstruct else None,
            "points": points,
        },
    )
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3))
    fractions = [100 * p["fraction"] for p in points]
    ax.plot(fractions, [100 * p["accuracy"] for p in points], "o-", label="heads masked")
    if args.reconstruct:
        ax.plot(
            fractions,
            [100 * p["accuracy_reconstructed"] for p in points],
            "s--",
            label="removed, then W$^O$, FFN, classifier refit",
        )
        ax.legend(fontsize=7)
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Greedy importance-ordered pruning ({args.split} split)")
    ax.grid(alpha=0.3)
    _save_png(fig, out / "curve.png")
    plt.close(fig)
    print(f"wrote {out / 'curve.json'} and {out / 'curve.png'}")
    return 0


def cmd_prune(args) -> int:
    if not 0.0 <= args.fraction < 1.0:
        raise UsageError(f"--fraction must be in [0, 1); got {args.fraction}")
    if args.finetune_epochs < 0:
        raise UsageError(f"--finetune-epochs must be >= 0; got {args.finetune_epochs}")
    if not args.finetune_lr > 0:
        raise UsageError(f"--finetune-lr must be > 0; got {args.finetune_lr}")
    src = pathlib.Path(args.run_dir)
    out = pathlib.Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite:
        raise UsageError(f"{out}: exists and is not empty; pass --overwrite to replace it")
    if out.resolve() == src.resolve():
        raise UsageError(f"{out}: the output must differ from the source run")
    model, metrics, ev = load_run(src)
    data = run_dataset(metrics)
    correct_before = predict(model, ev["x"]).argmax(-1) == ev["y"]
    before = float(correct_before.mean())
    x_score, y_score = scoring_data(data, args.split)
    removed = select_heads_to_prune(model, x_score, y_score, args.fraction)
    remove: dict[int, list[int]] = {}
    for layer, head in removed:
        remove.setdefault(layer, []).append(head)
    pruned = prune_model(model, remove)
    after = accuracy(pruned, ev["x"], ev["y"])
    reconstructed = None
    if args.reconstruct:
        reconstruct(model, pruned, data.x_train)
        reconstructed = accuracy(pruned, ev["x"], ev["y"])
    finetuned = finetuned_with = None
    if args.finetune_epochs:
        finetuned_with = finetune(pruned, data, metrics, args.finetune_epochs, args.finetune_lr)
        finetuned = accuracy(pruned, ev["x"], ev["y"])
    probs = predict(pruned, ev["x"]).astype("float32")
    drop = paired_drop(correct_before, probs.argmax(-1) == ev["y"])
    total = sum(heads_per_layer(model))
    from keras_mha.model import count_params

    new_metrics = {
        **metrics,
        "test_accuracy": float((probs.argmax(-1) == ev["y"]).mean()),
        "num_params": count_params(pruned),
        "config": _model_config(pruned).to_dict(),
        "pruning": {
            "source_run": str(src),
            "fraction_requested": args.fraction,
            "importance_split": args.split,
            "heads_before": heads_per_layer(model),
            "heads_after": heads_per_layer(pruned),
            "removed": [list(p) for p in removed],
            "fraction_removed": len(removed) / total,
            "params_before": count_params(model),
            "params_after": count_params(pruned),
            "test_accuracy_before": before,
            "test_accuracy_pruned": after,
            "reconstruction": _reconstruction_record(data) if args.reconstruct else None,
            "test_accuracy_reconstructed": reconstructed,
            "test_accuracy_finetuned": finetuned,
            "finetune_epochs": args.finetune_epochs,
            "finetune_learning_rate": args.finetune_lr if args.finetune_epochs else None,
            "finetune": finetuned_with,
            "test_drop": drop,
        },
    }
    tmp = staging_dir(out)
    try:
        pruned.save(tmp / "model.keras")
        np.savez(tmp / "eval.npz", **{**ev, "probs": probs})
        for name in ("calibration.npz", "labels.json", "vocab.json"):
            if (src / name).exists():
                shutil.copy2(src / name, tmp / name)
        (tmp / "metrics.json").write_text(json.dumps(new_metrics, indent=2))
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    p = new_metrics["pruning"]
    print(
        f"removed {len(removed)}/{total} heads {p['removed']}: heads per layer "
        f"{p['heads_before']} -> {p['heads_after']}, "
        f"params {p['params_before']} -> {p['params_after']}"
    )
    line = f"test accuracy {before:.4f} -> {after:.4f} pruned"
    if reconstructed is not None:
        line += f" -> {reconstructed:.4f} reconstructed"
    if finetuned is not None:
        line += f" -> {finetuned:.4f} after {args.finetune_epochs} fine-tune epochs"
        if not finetuned_with["improved"]:
            line += " (no epoch beat the start's validation loss; start kept)"
    print(line)
    low, high = drop["ci95_points"]
    print(
        f"drop {drop['points']:.2f} points (test examples lost/gained: {drop['lost']}/"
        f"{drop['gained']} of {drop['examples']}); 95 % paired bootstrap interval "
        f"{low:.2f} to {high:.2f} points"
    )
    print(f"wrote {out}")
    return 0


def cmd_plot(args) -> int:
    model, metrics, ev = load_run(args.run_dir)
    n = len(ev["x"])
    if not 0 <= args.sample < n:
        raise UsageError(f"--sample must be in [0, {n}); got {args.sample}")
    from keras_mha.model import forward

    x = ev["x"][args.sample : args.sample + 1]
    probs, scores = forward(model, x, return_attention_scores=True)
    scores = [np.asarray(s)[0] for s in scores]  # per layer (h, T, S)
    run = pathlib.Path(args.run_dir)
    vocab = None
    if (run / "vocab.json").exists():
        vocab = json.loads((run / "vocab.json").read_text())
    if vocab is not None:
        tokens = [vocab["tokens"][i] for i in x[0]]
        length = max(1, int((x[0] != vocab.get("pad_id", 0)).sum()))
        tokens = tokens[:length]
    else:
        tokens = [f"row {i}" for i in range(x.shape[1])]
        length = len(tokens)
    labels = (
        json.loads((run / "labels.json").read_text()) if (run / "labels.json").exists() else None
    )
    pred = int(np.asarray(probs)[0].argmax())
    label = int(ev["y"][args.sample])
    name = lambda i: labels[i] if labels else str(i)  # noqa: E731
    plt = _pyplot()
    max_heads = max(s.shape[0] for s in scores)
    extra = 1 + (1 if vocab is not None else 0)
    fig, axes = plt.subplots(
        len(scores),
        max_heads + extra,
        figsize=(2.4 * (max_heads + extra), 2.6 * len(scores)),
        squeeze=False,
    )
    pronoun_rows = {}
    pronoun_index = None
    if vocab is not None:
        for i, t in enumerate(tokens):
            if t in ("it", "they"):
                pronoun_index = i
    for layer, layer_scores in enumerate(scores):
        ax = axes[layer][0]
        if vocab is None:
            ax.imshow(x[0], cmap="gray_r")
            ax.set_title(f"input: label {name(label)}, predicted {name(pred)}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks(range(length), tokens, fontsize=6)
        else:
            ax.axis("off")
            ax.text(0, 0.5, "\n".join(tokens), fontsize=7, va="center")
            ax.set_title(f"label {name(label)}\npredicted {name(pred)}", fontsize=8)
        for head in range(max_heads):
            ax = axes[layer][1 + head]
            if head >= layer_scores.shape[0]:
                ax.axis("off")
                continue
            a = layer_scores[head][:length, :length]
            ax.imshow(a, cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ax.set_xticks(range(length), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(length), tokens, fontsize=6)
            if pronoun_index is not None:
                pronoun_rows[(layer, head)] = a[pronoun_index]
        if vocab is not None:
            ax = axes[layer][-1]
            if pronoun_index is None:
                ax.axis("off")
                continue
            for head in range(layer_scores.shape[0]):
                ax.plot(pronoun_rows[(layer, head)], marker="o", label=f"head {head}")
            ax.set_xticks(range(length), tokens, rotation=90, fontsize=6)
            ax.set_title(f"layer {layer}: row of '{tokens[pronoun_index]}'", fontsize=8)
            ax.legend(fontsize=6)
    out = pathlib.Path(args.out) if args.out else run / HEADS_DIR / f"heads_sample{args.sample}.png"
    _save_png(fig, out)
    plt.close(fig)
    if pronoun_index is not None:
        print(f"attention of '{tokens[pronoun_index]}' (row {pronoun_index}) per head:")
        for (layer, head), row in pronoun_rows.items():
            top = np.argsort(row)[::-1][:3]
            print(
                f"  layer {layer} head {head}: "
                + ", ".join(f"{tokens[j]} {row[j]:.2f}" for j in top)
            )
    print(f"wrote {out}")
    return 0


# ---------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    from keras_mha.cliutil import OneLineParser

    parser = OneLineParser(
        prog="keras-mha-heads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    split = argparse.ArgumentParser(add_help=False)
    split.add_argument(
        "--split",
        choices=SPLITS,
        default="train",
        help="non-test split the importance is averaged over (default: train, before augmentation)",
    )
    refit = argparse.ArgumentParser(add_help=False)
    refit.add_argument(
        "--reconstruct",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after removing heads, refit W^O, the FFN output and the classifier by least "
        "squares to the unpruned model's activations on the training split, before "
        "augmentation (default: on)",
    )
    p = sub.add_parser(
        "importance", parents=[split], help="head importance and single-head ablation"
    )
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_importance)
    p = sub.add_parser(
        "curve", parents=[split, refit], help="accuracy against the fraction of heads pruned"
    )
    p.add_argument("run_dir")
    p.add_argument("--step", type=float, default=0.1, help="fraction of all heads pruned per step")
    p.set_defaults(func=cmd_curve)
    p = sub.add_parser(
        "prune", parents=[split, refit], help="remove the least important heads; write a new run"
    )
    p.add_argument("run_dir")
    p.add_argument(
        "--fraction", type=float, required=True, help="fraction of all heads to remove, in [0, 1)"
    )
    p.add_argument("--out", required=True, help="new run directory")
    p.add_argument(
        "--finetune-epochs",
        type=int,
        default=0,
        help="epochs of training after pruning and reconstruction; the weights with the "
        "lowest validation loss are kept, the starting ones included (default 0: none)",
    )
    p.add_argument(
        "--finetune-lr", type=float, default=5e-4, help="fine-tune learning rate (default 5e-4)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.set_defaults(func=cmd_prune)
    p = sub.add_parser("plot", help="attention map of every head for one input")
    p.add_argument("run_dir")
    p.add_argument("--sample", type=int, default=0)
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/heads/heads_sampleN.png)")
    p.set_defaults(func=cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:
        print(f"keras-mha-heads: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        reason = one_line(e.strerror or e)
        print(f"keras-mha-heads: error: {e.filename or ''}: {reason}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
