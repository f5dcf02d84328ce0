"""The training state saved after every epoch, and a run resumed from it:
`keras-mha-train --from ... --checkpoint DIR`.

DIR holds two files, each written beside itself and renamed into place:

- `state-E.safetensors` (E: the epochs done): every variable of the model (weights, and the seed
  generators' states that drive dropout) and of the optimizer (AdamW's
  moments and its step count), gathered whole from the devices;
- `state.json`: the epochs done, their losses, the variables' paths and
  shapes, the run's fingerprint (checkpoint, data, seed, settings, training
  rows), the name of the safetensors file and its sha256. It is written
  last, and the previous epoch's safetensors removed after it: a process that
  dies between the two renames leaves the previous epoch's state whole.

A run started again with the same DIR and the same fingerprint resumes
after the epoch saved: the epochs' order is a function of (seed, epoch)
(`finetune.epoch_rows`), so the resumed run trains the batches the
uninterrupted run trains, from the same weights and optimizer state, and
continues its loss curve. It may run on other devices (the state is whole).
Another run's state is refused in one line naming what differs. In a job of
several processes, process 0 writes DIR and every process reads it (a
directory they share).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from bundle_contract.errors import UsageError
from bundle_contract.files import sha256_file, write_bytes_atomic, write_json_atomic

FLAG = "--checkpoint"
META = "state.json"
VERSION = 1


def _variables(model) -> list:
    return [*model.variables, *model.optimizer.variables]


class TrainingState:
    """The training state of one run in `directory` (see the module)."""

    def __init__(self, directory: str | pathlib.Path, fingerprint: dict):
        self.directory = pathlib.Path(directory)
        self.fingerprint = fingerprint

    def save(self, model, epochs_done: int, losses: list[float], job) -> None:
        """Save the state after `epochs_done` epochs (every process calls it)."""
        variables = _variables(model)
        values = job.host_values(variables)
        if not job.lead:
            return
        from safetensors.numpy import save

        data = save({f"{i:05d}": np.array(v, order="C") for i, v in enumerate(values)})  # 0-d kept
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"state-{epochs_done}.safetensors"
        write_bytes_atomic(self.directory / name, data)
        write_json_atomic(
            self.directory / META,
            {
                "version": VERSION,
                "epochs_done": epochs_done,
                "train_loss": losses,
                "fingerprint": self.fingerprint,
                "variables": [[v.path, list(v.shape)] for v in variables],
                "state": name,
                "sha256": sha256_file(self.directory / name),
            },
        )
        for old in self.directory.glob("state-*.safetensors"):
            if old.name != name:
                old.unlink()

    def restore(self, model, epochs: int, job) -> tuple[int, list[float]]:
        """(epochs done, their losses) of the saved state, loaded into `model`
        (compiled; its optimizer is built here); (0, []) when DIR holds none."""
        meta_path = self.directory / META
        if not meta_path.exists():  # nothing saved yet
            if self.directory.exists() and not self.directory.is_dir():
                raise UsageError("is not a directory", FLAG + " " + str(self.directory))
            return 0, []
        where = f"{FLAG} {self.directory}"
        try:
            meta = json.loads(meta_path.read_text())
            done, losses = int(meta["epochs_done"]), [float(v) for v in meta["train_loss"]]
            saved, fingerprint = meta["variables"], meta["fingerprint"]
            name, digest = str(meta["state"]), meta["sha256"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UsageError(f"{META} is not a training state ({error})", where) from None
        if meta.get("version") != VERSION:
            raise UsageError(f"{META} is version {meta.get('version')}; expected {VERSION}", where)
        if not isinstance(fingerprint, dict) or not isinstance(saved, list):
            raise UsageError(f"{META} is not a training state (fingerprint, variables)", where)
        differs = [k for k in sorted({*fingerprint, *self.fingerprint})
                   if fingerprint.get(k) != self.fingerprint.get(k)]  # fmt: skip
        if differs == ["training_rows"]:  # the same run but for the rows a mesh leaves out
            raise UsageError(
                "holds the state of this run trained on other rows (another batch axis "
                "leaves out another count of the last rows: metrics.json's "
                "training_rows_left_out); resume with the mesh it was saved on",
                where,
            )
        if differs:
            raise UsageError(
                f"holds the state of another run (its {differs[0]} differs: "
                f"{fingerprint.get(differs[0])!r}, this run's {self.fingerprint.get(differs[0])!r})"
                "; give another directory or remove it",
                where,
            )
        if len(losses) != done or done > epochs:
            raise UsageError(
                f"{META} says {done} epochs done with {len(losses)} losses, of {epochs}", where
            )
        state = self.directory / pathlib.PurePath(name).name
        if not state.is_file() or sha256_file(state) != digest:
            raise UsageError(f"{state.name} is missing or not the one {META} names (sha256)", where)
        model.optimizer.build(model.trainable_variables)
        variables = _variables(model)
        found = [[v.path, list(v.shape)] for v in variables]
        if found != saved:
            wrong = next((i for i, (a, b) in enumerate(zip(found, saved)) if a != b), len(found))
            raise UsageError(
                f"its variables are not this model's (at #{wrong}: "
                f"{saved[wrong] if wrong < len(saved) else 'none'})",
                where,
            )
        from safetensors.numpy import load_file

        tensors = load_file(str(state))
        for i, variable in enumerate(variables):
            variable.assign(tensors[f"{i:05d}"])
        return done, losses
