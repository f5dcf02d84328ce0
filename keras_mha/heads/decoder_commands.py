"""keras-mha-heads importance on a language model's run (keras_mha/decoder/heads.py).

Importance of every query head on the corpus's held-out sentences, then two
pruning curves, query heads and whole key/value groups, each cut scored by
next-token agreement with the full model, perplexity and the KV cache left.
Written to RUN_DIR/heads/importance.json.
"""

from __future__ import annotations

import argparse

import numpy as np

from bundle_contract.files import check_writable, sha256_file, write_json_atomic

SHARES = (0.0, 0.1, 0.2, 0.3, 0.5)  # of the query heads, then of the groups


def cmd_importance_language_model(args: argparse.Namespace) -> int:
    from keras_mha import decoder
    from keras_mha.decoder import heads
    from keras_mha.decoder.run import require_run

    folder = require_run(args.run_dir)
    out = check_writable(folder / "heads" / "importance.json", "RUN_DIR")
    lm = decoder.load(folder)
    c = lm.config
    text = heads.eval_text(lm)
    scores = heads.importance(lm, text)
    groups = heads.group_importance(lm, scores)
    total_heads, total_groups = scores.size, groups.size
    curves = {
        unit: heads.prune_curve(lm, text, scores, unit, [round(s * n) for s in SHARES])
        for unit, n in (("head", total_heads), ("group", total_groups))
    }
    print(f"{c.num_hidden_layers} layers x {c.num_attention_heads} query heads in "
          f"{c.num_key_value_heads} key/value groups; scored on {len(text.ids)} held-out "
          f"sentences ({text.tokens} next tokens)")  # fmt: skip
    order = np.dstack(np.unravel_index(np.argsort(-scores, axis=None), scores.shape))[0]
    print("most important query heads (layer.head): " + ", ".join(
        f"{layer}.{head} {scores[layer, head]:.3f}" for layer, head in order[:5]))  # fmt: skip
    print(f"{'removed':>16} {'agreement':>10} {'perplexity':>11} {'KV cache / token':>17}")
    for unit, rows in curves.items():
        for row in rows:
            what = f"{row['removed']} {'query heads' if unit == 'head' else 'groups'}"
            print(f"{what:>16} {row['agreement']:>10.3f} {row['perplexity']:>11.2f} "
                  f"{row['cache_bytes_per_token'] / 1024:>14.1f} KB")  # fmt: skip
    write_json_atomic(
        out,
        {
            "run": str(args.run_dir),
            "model": "language-model",
            "model_sha256": sha256_file(folder / "model.safetensors"),
            "eval": {"sentences": len(text.ids), "next_tokens": text.tokens},
            "importance": scores.round(6).tolist(),
            "group_importance": groups.round(6).tolist(),
            "curves": curves,
        },
    )
    print(f"wrote {out}")
    return 0
