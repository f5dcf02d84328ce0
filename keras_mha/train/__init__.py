"""Training: the small classifier on a dataset, written as a run directory.

Rooms (one job each):

- `presets`: per-dataset model size and `TrainSettings` (plain data).
- `settings`: `resolve_settings`, the validated config of a run.
- `memory`: will the model fit? (estimated before it is built).
- `augment`: shifted copies of the digit images.
- `determinism`: `op_determinism`, same seed, same machine, same numbers.
- `fit`: optimizer, schedule, strategy, early stopping.
- `record`: what the run writes (metrics, eval set, calibration, plots),
  through `keras_mha.rundir.RunWriter`.
- `pipeline`: `train()`, the steps in order.
- `cli`: `keras-mha-train` / `python -m keras_mha.train`.
"""

from keras_mha.train.cli import main  # the console script (keras_mha.train.cli:main)
from keras_mha.train.pipeline import train
from keras_mha.train.presets import DISTRIBUTE, PRESETS, TrainSettings
from keras_mha.train.settings import resolve_settings

__all__ = ["main", "DISTRIBUTE", "PRESETS", "TrainSettings", "resolve_settings", "train"]
