"""The run directory: read, validated and written in one place (docs/artifacts.md).

    RUN/
      model.keras  metrics.json  eval.npz  calibration.npz  labels.json
      [vocab.json]  [training_curves.png  attention_heads.png]  [heads/]

`read_run(path)` checks every file against the others and against the model
configuration stored in metrics.json (numpy only; the model is loaded on
request by `Run.load_model()`). `RunWriter` validates the same way before it
writes anything, builds the directory beside its target and renames it into
place, so a run that fails (or is interrupted) leaves nothing half-written.

A run is of a task (metrics.json's `task`; absent: classification):
`tasks.read_any(path)` reads it with its task's reader (`reading.read_run`,
`embedding.read_embedding_run`), whose object gives export the same fields
for every task (`task`, `eval_data`, `bundle_files()`, ...).

Every problem is a `UsageError` (a `ValueError`) with one line naming the
file, the array or field, and what is wrong. The array checks the device
makes too (probabilities, finite inputs) are `bundle_contract.arrays`'s.
"""

from keras_mha.rundir.checks import (
    EvalSet,
    check_eval,
    check_inputs,
    check_labels,
    check_model,
    check_vocab,
    input_spec,
    model_config,
)
from keras_mha.rundir.reading import REQUIRED, Run, load_keras_model, read_run, validate
from keras_mha.rundir.writing import RunWriter, check_out

__all__ = [
    "REQUIRED",
    "EvalSet",
    "Run",
    "RunWriter",
    "check_eval",
    "check_inputs",
    "check_labels",
    "check_model",
    "check_out",
    "check_vocab",
    "input_spec",
    "load_keras_model",
    "model_config",
    "read_run",
    "validate",
]
