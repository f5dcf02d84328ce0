"""`RunWriter`: a run directory written whole or not at all, validated before any byte."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import TYPE_CHECKING, Any

import numpy as np

from bundle_contract.errors import UsageError, one_line
from bundle_contract.files import staging_dir, swap_into_place
from keras_mha.rundir.checks import EvalSet, check_model, model_config
from keras_mha.rundir.reading import Run, validate

if TYPE_CHECKING:
    import keras

    from keras_mha.model import ModelConfig


def check_out(out: str | os.PathLike, overwrite: bool) -> pathlib.Path:
    """The absolute output path, if a run may be written there."""
    # Absolute, so "." or "runs/x/.." name a directory with a real parent.
    out = pathlib.Path(os.path.abspath(out))
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise UsageError("exists and is not a directory", out)
        contents = set(os.listdir(out))
        if contents and not overwrite:
            raise UsageError("exists and is not empty; pass --overwrite to replace it", out)
        if contents and not contents & {"metrics.json", "model.keras"}:
            raise UsageError(
                "refusing to overwrite: not a run directory (no metrics.json or model.keras)",
                out,
            )
    return out


class RunWriter:
    """Write a run directory whole or not at all.

        with RunWriter(out, overwrite=True) as writer:   # checks out, stages
            writer.write(model, metrics, config, ev, calibration, labels, vocab)
            plots.save_training_curves(..., writer.staging / "training_curves.png")

    The constructor checks `out` and creates the staging directory beside it
    (an unwritable place fails here, before any work). `write` validates
    everything first, as `read_run` would, then writes. On leaving the block
    the staging directory replaces `out`; on any exception, Ctrl-C included,
    it is removed and `out` is left as it was.
    """

    def __init__(self, out: str | os.PathLike, overwrite: bool = False):
        self.out = check_out(out, overwrite)
        try:
            self.staging = staging_dir(self.out)
        except OSError as error:
            reason = error.strerror or one_line(error)
            raise UsageError(f"cannot write the run directory ({reason})", self.out) from None
        self.run: Run | None = None

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None and self.run is not None:
            try:
                swap_into_place(self.staging, self.out)
                return
            except BaseException:
                shutil.rmtree(self.staging, ignore_errors=True)
                raise
        shutil.rmtree(self.staging, ignore_errors=True)
        if kind is None:  # a bug in the caller: an empty run must not replace `out`
            raise RuntimeError(f"RunWriter for {self.out}: the block ended without write()")

    def write(
        self,
        model: keras.Model,
        metrics: dict,
        config: ModelConfig,
        ev: EvalSet,
        calibration: np.ndarray,
        labels: list[str],
        vocab: Any = None,
    ) -> Run:
        """Validate, then write model.keras, metrics.json (with `config`), the arrays."""
        metrics = {**metrics, "config": config.to_dict()}
        model_config(metrics, self.out / "metrics.json")  # the keys readers need
        run = validate(self.out, metrics, config, ev, calibration, labels, vocab)
        check_model(model, config, self.out / "model.keras")
        model.save(self.staging / "model.keras")
        (self.staging / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        np.savez(self.staging / "eval.npz", **run.eval.arrays())
        np.savez(self.staging / "calibration.npz", x=calibration)
        (self.staging / "labels.json").write_text(json.dumps(labels) + "\n")
        if vocab is not None:
            vocab.save(self.staging / "vocab.json")
        self.run = run
        return run
