"""Figures of a run: training curves and every attention head's map.

matplotlib is imported inside the functions, with the non-interactive Agg
backend, so importing this module costs nothing and needs no display.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Sequence

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_training_curves(
    history: dict[str, Sequence[float]],
    path: str | pathlib.Path,
    best_epoch: int | None = None,
    title: str | None = None,
) -> None:
    """Loss and accuracy per epoch (training and validation) as a PNG.

    Args:
        history: Keras `History.history`: lists per metric (`loss`,
            `accuracy`, `val_loss`, `val_accuracy`).
        path: Where to write the PNG.
        best_epoch: 1-based epoch whose weights were kept; marked by a line.
        title: Figure title.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, metric in zip(axes, ("loss", "accuracy")):
        for prefix, label in (("", "training"), ("val_", "validation")):
            values = history.get(prefix + metric)
            if values:
                ax.plot(np.arange(1, len(values) + 1), values, label=label)
        if best_epoch is not None:
            ax.axvline(best_epoch, color="gray", linestyle=":", label=f"kept (epoch {best_epoch})")
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_yscale("log")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _short_ticks(names: list[str]) -> tuple[list[str], str]:
    """`["row 0", "row 1", ...]` -> `(["0", "1", ...], "row")`; other names as they are."""
    prefixes = {name.rsplit(" ", 1)[0] for name in names if " " in name}
    if len(prefixes) == 1 and all(re.fullmatch(r".+ \d+", name) for name in names):
        return [name.rsplit(" ", 1)[1] for name in names], f"{prefixes.pop()} "
    return names, ""


def save_attention_heads(
    scores: Sequence[np.ndarray],
    tokens: Sequence[Sequence[str]],
    path: str | pathlib.Path,
    sample_titles: Sequence[str] | None = None,
    images: np.ndarray | None = None,
) -> None:
    """The attention map of every head of every layer for a few samples.

    One block per sample (its title above it), one row per layer, one column
    per head: the lesson's heads looking at "different information
    subspaces", side by side, on one 0-1 colour scale shown by a colour bar.

    Args:
        scores: One array per encoder layer, `(B, h, T, T)` attention
            weights (query positions down, key positions across).
        tokens: For each sample, the names of its tokens; a sample with
            fewer names than `T` (padding) is cropped to them. Names like
            `"row 3"` are shown as `3` under an axis label `query row`.
        path: Where to write the PNG.
        sample_titles: One label per sample (e.g. true and predicted class).
        images: Optional `(B, H, W)` inputs drawn in an extra first column.
    """
    plt = _pyplot()
    scores = [np.asarray(s) for s in scores]
    samples, layers = len(tokens), len(scores)
    max_heads = max(s.shape[1] for s in scores)
    extra = 0 if images is None else 1
    longest = max(len(t) for t in tokens)
    cell = max(2.3, 0.24 * longest + 0.9)  # room for one tick label per token at 8 pt
    width = cell * (max_heads + extra) + 1.0  # + the colour bar
    fig = plt.figure(figsize=(width, (cell * layers + 0.45) * samples + 0.4), layout="constrained")
    fig.suptitle("Attention weights per head (rows: query token, columns: key token)", fontsize=11)
    blocks = fig.subfigures(samples, 1, squeeze=False)[:, 0]
    for b, block in enumerate(blocks):
        names, axis = _short_ticks([str(t) for t in tokens[b]])
        n = len(names)
        if sample_titles:
            block.suptitle(sample_titles[b], fontsize=10, x=0.02, ha="left")
        axes = block.subplots(layers, max_heads + extra, squeeze=False)
        image = None
        for layer, layer_scores in enumerate(scores):
            if extra:
                ax = axes[layer, 0]
                if layer == 0:
                    ax.imshow(images[b], cmap="gray_r")
                    ax.set_title("input", fontsize=9)
                ax.axis("off")
            for head in range(max_heads):
                ax = axes[layer, head + extra]
                if head >= layer_scores.shape[1]:
                    ax.axis("off")
                    continue
                image = ax.imshow(layer_scores[b, head, :n, :n], cmap="viridis", vmin=0.0, vmax=1.0)
                ax.set_title(f"layer {layer} head {head}", fontsize=9)
                ax.set_xticks(range(n), names if layer == layers - 1 else [""] * n, fontsize=8)
                ax.set_yticks(range(n), names if head == 0 else [""] * n, fontsize=8)
                if axis or n > 8:
                    ax.tick_params(axis="x", labelrotation=0 if axis else 90)
                if axis and head == 0:
                    ax.set_ylabel(f"query {axis.strip()}", fontsize=8)
                if axis and layer == layers - 1:
                    ax.set_xlabel(f"key {axis.strip()}", fontsize=8)
        if image is not None:
            bar = block.colorbar(image, ax=axes[:, extra:].ravel().tolist(), shrink=0.9, aspect=30)
            bar.set_label("attention weight (0 to 1)", fontsize=8)
            bar.ax.tick_params(labelsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)
