"""keras-mha-heads: which heads matter, pruning that removes them, per-head views.

    keras-mha-heads importance RUN_DIR [--split train|validation]
    keras-mha-heads curve RUN_DIR [--step 0.1] [--split train|validation] [--no-reconstruct]
    keras-mha-heads prune RUN_DIR --fraction F --out NEW_RUN_DIR [--finetune-epochs N]
                          [--finetune-lr LR] [--split train|validation] [--no-reconstruct]
                          [--overwrite]
    keras-mha-heads plot RUN_DIR --sample N
    keras-mha-heads view RUN_DIR [--sample N | --text "..."] [--out FILE.html]
    keras-mha-heads coref RUN_DIR [--sentences 500] [--seed 0] [--bootstrap 1000] [--json OUT]

Importance follows Michel, Levy & Neubig (2019), "Are Sixteen Heads Really
Better than One?": each head h gets a mask xi_h on its output (1 = on), and

    I_h = E_x | dL(x) / d xi_h |

over a split that is not the test split (the run's training split before
augmentation by default, `--split validation` for its validation split: on
digits 1,293 examples against 144), normalised per layer by the L2 norm.
Pruning removes a head's W_i^Q, W_i^K, W_i^V, biases and its block of W^O
(`MultiHeadAttention.pruned`); the pruned model equals the original with
those heads masked.

Then, unless `--no-reconstruct`, the maps after the removed heads (W^O, the
FFN's output Dense, the classifier) are refit by least squares so that the
smaller model's activations are fit to the original's on the training split
(no labels, no gradient steps), and `--finetune-epochs` trains it further.

For an embedding run (keras-mha-import): importance is the mean norm of the
Jacobian of the sentence vector with respect to each head's gate, on the
calibration sentences (single-head ablation as a cross-check); prune removes
heads at once and refits W^O and the FFN outputs by least squares on the
calibration sentences (keras_mha/heads/encoder.py, its commands in
keras_mha/heads/encoder_commands.py; docs/pretrained.md).

For a language model's run (keras-mha-import of SmolLM2, a GGUF or a Llama
folder), `importance` scores every query head by the same I_h with the next
token's negative log-likelihood as L, on the corpus's held-out sentences, and
prints two pruning curves, query heads and whole key/value groups, scored by
next-token agreement, perplexity and the KV cache left
(keras_mha/decoder/heads.py); `coref` probes it as any model that reads
words (causal: "it" looks back at both nouns).

`coref` probes any model that reads words, a trained pronouns classifier or
an encoder imported by keras-mha-import: on generated pronoun sentences
(keras_mha.data), each head picks the candidate noun the pronoun's query row
weighs most (a noun's word pieces summed); its accuracy against the referent,
per cue and with a bootstrap interval, beside the nearest-noun, first-noun
and chance baselines (keras_mha.heads.coref). The table goes to
RUN_DIR/heads/coref.json (or --json); `view` and keras-mha-export name its
best head, and the page opens on it.

`view` writes the head view page of the float Keras model for eval input N,
or with --text for a sentence of your own (a run that reads words: an
embedding run's word pieces as typed, or a classifier's vocab.json).
"""

from __future__ import annotations

import argparse

from bundle_contract.errors import Parser, nonnegative_int, positive_int, run_main
from keras_mha.heads.importance import SPLITS  # numpy only: TensorFlow loads in _run
from keras_mha.quiet_tensorflow import import_tensorflow

PROG = "keras-mha-heads"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    p = sub.add_parser(
        "curve", parents=[split, refit], help="accuracy against the fraction of heads pruned"
    )
    p.add_argument("run_dir")
    p.add_argument("--step", type=float, default=0.1, help="fraction of all heads pruned per step")
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
        type=nonnegative_int,
        default=0,
        help="epochs of training after pruning and reconstruction; the weights with the "
        "lowest validation loss are kept, the starting ones included (default 0: none)",
    )
    p.add_argument(
        "--finetune-lr", type=float, default=5e-4, help="fine-tune learning rate (default 5e-4)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    sample_help = "index of the input in RUN_DIR/eval.npz, the held-out split (default 0)"
    p = sub.add_parser("plot", help="attention map of every head for one input")
    p.add_argument("run_dir")
    p.add_argument("--sample", type=nonnegative_int, default=0, help=sample_help)
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/heads/heads_sampleN.png)")
    p = sub.add_parser("view", help="head view page (HTML) of the float model for one input")
    p.add_argument("run_dir")
    p.add_argument("--sample", type=nonnegative_int, default=None, help=sample_help)
    p.add_argument(
        "--text",
        default=None,
        help="a sentence of your own instead of --sample (a run that reads words)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="HTML path (default RUN_DIR/heads/view_sampleN.html, or view_text.html)",
    )
    p = sub.add_parser(
        "coref", help="coreference probe: which heads look from a pronoun at its referent"
    )
    p.add_argument("run_dir", help="a pronouns run or an embedding run (keras-mha-import)")
    p.add_argument(
        "--sentences", type=positive_int, default=500, help="generated sentences (default 500)"
    )
    p.add_argument(
        "--seed",
        type=nonnegative_int,
        default=0,
        help="seed of the sentences and of the bootstrap (default 0)",
    )
    p.add_argument(
        "--bootstrap",
        type=positive_int,
        default=1000,
        help="bootstrap resamples of the sentences for the 95 %% intervals (default 1000)",
    )
    p.add_argument(
        "--json",
        default=None,
        help="write the whole table (JSON) here instead of RUN_DIR/heads/coref.json",
    )
    return parser


def _run(args: argparse.Namespace) -> int:
    import_tensorflow()  # first: its start-up logs filtered (keras_mha/quiet_tensorflow.py)
    from keras_mha.heads import commands

    return getattr(commands, f"cmd_{args.command}")(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `keras-mha-heads`; returns the exit status."""
    return run_main(PROG, lambda: _run(build_parser().parse_args(argv)))
