"""Figures of a run: training curves and every attention head's map.

matplotlib is imported inside the functions, with the non-interactive Agg
backend, so importing this module costs nothing and needs no display.
"""

from __future__ import annotations

import pathlib
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


def save_attention_heads(
    scores: Sequence[np.ndarray],
    tokens: Sequence[Sequence[str]],
    path: str | pathlib.Path,
    sample_titles: Sequence[str] | None = None,
    images: np.ndarray | None = None,
) -> None:
    """The attention map of every head of every layer for a few samples.

    One row per (sample, layer), one column per head: the lesson's heads
    looking at "different information subspaces", side by side.

    Args:
        scores: One array per encoder layer, `(B, h, T, T)` attention
            weights (query positions down, key positions across).
        tokens: For each sample, the names of its tokens; a sample with
            fewer names than `T` (padding) is cropped to them.
        path: Where to write the PNG.
        sample_titles: One label per sample (e.g. true and predicted class).
        images: Optional `(B, H, W)` inputs drawn in an extra first column.
    """
    plt = _pyplot()
    scores = [np.asarray(s) for s in scores]
    samples = len(tokens)
    layers = len(scores)
    max_heads = max(s.shape[1] for s in scores)
    extra = 0 if images is None else 1
    rows, cols = samples * layers, max_heads + extra
    longest = max(len(t) for t in tokens)
    cell = max(2.2, 0.28 * longest)
    fig, axes = plt.subplots(rows, cols, figsize=(cell * cols, cell * rows), squeeze=False)
    for b in range(samples):
        names = list(tokens[b])
        n = len(names)
        for layer, layer_scores in enumerate(scores):
            row = b * layers + layer
            if extra:
                ax = axes[row, 0]
                if layer == 0:
                    ax.imshow(images[b], cmap="gray_r")
                    if sample_titles:
                        ax.set_title(sample_titles[b], fontsize=9)
                ax.axis("off")
            for head in range(max_heads):
                ax = axes[row, head + extra]
                if head >= layer_scores.shape[1]:
                    ax.axis("off")
                    continue
                weights = layer_scores[b, head, :n, :n]
                ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0)
                ax.set_xticks(range(n), names, rotation=90, fontsize=7)
                ax.set_yticks(range(n), names, fontsize=7)
                heading = f"layer {layer} head {head}"
                if head == 0 and sample_titles and not extra:
                    heading = f"{sample_titles[b]}\n{heading}"
                ax.set_title(heading, fontsize=8, loc="left" if head == 0 else "center")
    fig.suptitle("Attention weights per head (rows: query token, columns: key token)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
