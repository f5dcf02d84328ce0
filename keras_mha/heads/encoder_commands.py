"""keras-mha-heads importance|prune RUN for an embedding run (an encoder from keras-mha-import).

`commands.cmd_importance` and `commands.cmd_prune` hand an embedding run to
`cmd_importance_embedding` and `cmd_prune_embedding`; the analysis is
keras_mha/heads/encoder.py's, the pruned run is written by `write_pruned_run`.
"""

from __future__ import annotations

import argparse
import pathlib
import time

from bundle_contract.errors import UsageError
from keras_mha.heads.encoder import (
    ENCODER_RIDGE,
    ablation_importance,
    fidelity,
    jacobian_importance,
    prune_encoder,
    reconstruct_encoder,
    removal_masks,
    select_heads,
)
from keras_mha.heads.masks import heads_per_layer
from keras_mha.heads.statistics import spearman
from keras_mha.model import count_params, encoder_blocks
from keras_mha.pretrained.encoding import embed

# How the figures of `Task.fidelity` are printed.
FIGURE_NAMES = {
    "mean_cosine": "mean cosine",
    "min_cosine": "min cosine",
    "top1": "top-1",
    "top5": "top-5",
    "agreement": "agreement",
    "max_abs_diff": "max |Δ|",
    "mean_abs_diff": "mean |Δ|",
}


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
        y=run.gold_labels,
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
    from bundle_contract.files import check_writable, write_json_atomic
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
        "task": run.task.name,
        "split": "calibration",
        "split_size": int(len(run.calibration)),
        "importance": "mean over sentences of ||d e / d xi_h||_2 (Jacobian of the output, the "
        "unit sentence vector or the class probabilities, with respect to the head's gate, "
        "at all heads on)",
        "ablation": "mean over sentences of 1 - cos(output with the head alone masked, output)",
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
    from bundle_contract.files import check_writable
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
    masked = fidelity(embed(model, run.eval.x, removal_masks(model, removed)), reference, run.task)
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
    figures = fidelity(vectors, reference, run.task)
    pruning["eval_pruned" if report is None else "eval_reconstructed"] = figures
    write_pruned_run(run, pruned, args.out, pruning, args.overwrite, vectors)
    total = sum(pruning["heads_before"])
    print(
        f"removed {len(removed)}/{total} heads {pruning['removed']}: heads per layer "
        f"{pruning['heads_before']} -> {pruning['heads_after']}, params "
        f"{pruning['params_before']} -> {pruning['params_after']}"
    )
    for name, f in (("masked", masked), ("reconstructed" if reconstruct else "pruned", figures)):
        shown = ", ".join(f"{FIGURE_NAMES[k]} {v:.4f}" for k, v in f.items())
        print(f"{name:>13}: {shown} (eval, against the unpruned model)")
    print(f"wrote {args.out}")
    return 0
