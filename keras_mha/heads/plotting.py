"""The figures of keras-mha-heads: importance bars, the pruning curve, one input's heads."""

from __future__ import annotations

import os
import pathlib

import numpy as np


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: pathlib.Path) -> None:
    """Save `fig` to `path` atomically (a temporary file, then a rename), and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        pyplot().close(fig)


def plot_importance(
    rows: list[dict], split: str, path: pathlib.Path, removed: set | None = None
) -> None:
    """Importance bars, one per head; with `removed`, the heads pruning took out in red."""
    plt = pyplot()
    removed = removed or set()
    fig, ax = plt.subplots(figsize=(max(4.5, 0.55 * len(rows)), 3.2))
    colors = ["tab:red" if (r["layer"], r["head"]) in removed else "tab:blue" for r in rows]
    ax.bar(range(len(rows)), [r["importance"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)), [f"L{r['layer']}H{r['head']}" for r in rows], rotation=90)
    ax.set_xlabel("head (L = layer, H = head)")
    ax.set_ylabel("importance\n(loss change when the head\nis turned down; per layer, L2 = 1)")
    ax.set_title(f"Head importance E|dL/d xi_h| on the {split} split", fontsize=10)
    if removed:
        from matplotlib.patches import Patch

        ax.legend(
            handles=[
                Patch(color="tab:red", label="removed by prune"),
                Patch(color="tab:blue", label="kept"),
            ],
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
    save_png(fig, path)


def plot_curve(points: list[dict], split: str, reconstructed: bool, path: pathlib.Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3))
    fractions = [100 * p["fraction"] for p in points]
    ax.plot(fractions, [100 * p["accuracy"] for p in points], "o-", label="heads masked")
    if reconstructed:
        ax.plot(
            fractions,
            [100 * p["accuracy_reconstructed"] for p in points],
            "s--",
            label="removed, then W$^O$, FFN, classifier refit",
        )
        ax.legend(fontsize=7)
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Greedy importance-ordered pruning ({split} split)")
    ax.grid(alpha=0.3)
    save_png(fig, path)


def plot_sample(
    image: np.ndarray | None,
    tokens: list[str],
    scores: list[np.ndarray],
    title: str,
    path: pathlib.Path,
    pronoun_index: int | None = None,
) -> dict[tuple[int, int], np.ndarray]:
    """Every head's attention map for one input; for text, the pronoun's row too.

    `scores`: per layer `(h, T, S)`; `tokens`: the input's (unpadded) tokens;
    `image`: the digit, or None for text. Returns the pronoun's attention
    row per (layer, head) (empty without a pronoun).
    """
    plt = pyplot()
    length = len(tokens)
    max_heads = max(s.shape[0] for s in scores)
    extra = 1 + (1 if image is None else 0)
    fig, axes = plt.subplots(
        len(scores),
        max_heads + extra,
        figsize=(2.4 * (max_heads + extra), 2.6 * len(scores)),
        squeeze=False,
    )
    rows: dict[tuple[int, int], np.ndarray] = {}
    for layer, layer_scores in enumerate(scores):
        ax = axes[layer][0]
        if image is not None:
            ax.imshow(image, cmap="gray_r")
            ax.set_title(title, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks(range(length), tokens, fontsize=6)
        else:
            ax.axis("off")
            ax.text(0, 0.5, "\n".join(tokens), fontsize=7, va="center")
            ax.set_title(title.replace(", ", "\n"), fontsize=8)
        for head in range(max_heads):
            ax = axes[layer][1 + head]
            if head >= layer_scores.shape[0]:
                ax.axis("off")
                continue
            a = layer_scores[head][:length, :length]
            image_of_map = ax.imshow(a, cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ax.set_xticks(range(length), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(length), tokens, fontsize=6)
            if pronoun_index is not None:
                rows[(layer, head)] = a[pronoun_index]
        if image is None:
            ax = axes[layer][-1]
            if pronoun_index is None:
                ax.axis("off")
                continue
            for head in range(layer_scores.shape[0]):
                ax.plot(rows[(layer, head)], marker="o", label=f"head {head}")
            ax.set_xticks(range(length), tokens, rotation=90, fontsize=6)
            ax.set_title(f"layer {layer}: row of '{tokens[pronoun_index]}'", fontsize=8)
            ax.legend(fontsize=6)
    fig.colorbar(
        image_of_map,
        ax=axes,
        shrink=0.6,
        label="attention weight (0 to 1; rows: query, columns: key)",
    )
    save_png(fig, path)
    return rows
