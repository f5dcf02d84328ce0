"""Head analysis and pruning, one room per job.

- `masks`: head masks (`head_masks`, one `(h,)` per layer), masked predictions.
- `importance`: I_h = E|dL/d xi_h| (Michel et al., 2019), ranking, scoring splits.
- `selection`: which heads go (greedy), the pruning curve, `check_fraction`.
- `encoder`: the same for a label-free sentence encoder: Jacobian and ablation
  importance, selection, removal, a least-squares refit and its fidelity.
- `surgery`: `prune_model`, a smaller model that equals the masked one.
- `reconstruction`: `trace`, `refit`, `reconstruct` (least squares after pruning).
- `finetune`: a little more training, the way the run was trained.
- `statistics`: `paired_drop` (bootstrap), per-cue accuracy, `spearman`.
- `coref`: the coreference probe (which heads look from a pronoun at its referent),
  `token_model` (the run's model it probes) and `read_best_head`, its best head
  for the head view pages and export.
- `plotting`: the PNGs.
- `commands` and `cli`: `keras-mha-heads` / `python -m keras_mha.heads` (`__main__`);
  `encoder_commands`: its `importance` and `prune` for an embedding run.

Running a sentence encoder in batches (`embed`, `batches`) and building a
pruned one: keras_mha.pretrained.encoding.
"""

from keras_mha.heads.cli import main  # the console script (keras_mha.heads.cli:main)
from keras_mha.heads.importance import SPLITS, head_importance, rank_heads, scoring_data
from keras_mha.heads.masks import accuracy, all_heads_on, as_removal, heads_per_layer, predict
from keras_mha.heads.reconstruction import RIDGE, reconstruct, refit, trace
from keras_mha.heads.retrain import finetune
from keras_mha.heads.selection import count_heads, pruning_curve, select_heads_to_prune
from keras_mha.heads.statistics import cue_accuracy, paired_drop, spearman
from keras_mha.heads.surgery import prune_model, pruned_config

__all__ = [
    "main",
    "RIDGE",
    "SPLITS",
    "accuracy",
    "all_heads_on",
    "as_removal",
    "count_heads",
    "cue_accuracy",
    "finetune",
    "head_importance",
    "heads_per_layer",
    "paired_drop",
    "predict",
    "prune_model",
    "pruned_config",
    "pruning_curve",
    "rank_heads",
    "reconstruct",
    "refit",
    "scoring_data",
    "select_heads_to_prune",
    "spearman",
    "trace",
]
