"""`read_run`: a run directory read and validated, as a `Run` (the model on request)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np

from bundle_contract import arrays
from bundle_contract.arrays import EvalData
from bundle_contract.errors import UsageError, one_line
from bundle_contract.lists import labels_json
from bundle_contract.tasks import get as get_task
from bundle_contract.tasks.classification import Classification
from bundle_contract.vocab import Vocab
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

if TYPE_CHECKING:
    import keras

    from keras_mha.model import ModelConfig

REQUIRED = ("model.keras", "metrics.json", "eval.npz", "calibration.npz", "labels.json")
EVAL_EXTRAS = ("cue", "nouns", "text")  # pronouns only (per test example)


def _load_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"not valid JSON ({one_line(error)})", path) from None
    except OSError as error:
        raise UsageError(f"cannot read it ({error.strerror or one_line(error)})", path) from None


def _load_eval(path: pathlib.Path) -> EvalSet:
    data = arrays.read_npz(path, ("x", "y", "probs"))
    with np.load(path, allow_pickle=False) as npz:  # readable: read_npz opened it
        extras = {key: npz[key] for key in EVAL_EXTRAS if key in npz.files}
    return EvalSet(data["x"], data["y"], data["probs"], extras)


@dataclasses.dataclass
class Run:
    """A validated run directory; `read_run` makes one, `RunWriter` writes one."""

    path: pathlib.Path
    metrics: dict
    config: ModelConfig  # metrics.json's `config`, as the model was built
    eval: EvalSet
    calibration: np.ndarray  # (M, ...) training inputs for int8 calibration
    labels: list[str]
    vocab: Any = None  # the Vocab of text datasets, else None

    task = get_task(Classification.name)  # the contract's task of these runs and their bundles
    max_length = None  # a text run's length is its vocab's

    @property
    def dataset(self) -> str:
        return str(self.metrics["dataset"])

    @property
    def eval_data(self) -> EvalData:
        """eval.npz as the bundle contract holds it."""
        ev = self.eval
        return EvalData(ev.x, ev.y.astype(np.int64), ev.probs.astype(np.float32))

    def bundle_files(self) -> dict[str, tuple[str, bytes]]:
        """The files a bundle of this run holds besides the models and eval.npz:
        Manifest field -> (file name, bytes)."""
        return {"labels": ("labels.json", labels_json(self.labels))}

    @property
    def seed(self) -> int:
        return int(self.metrics["seed"])

    @property
    def model_file(self) -> pathlib.Path:
        return self.path / "model.keras"

    def load_dataset(self):
        """The run's dataset, split as it was for training (same name and seed)."""
        from keras_mha.data import load_dataset

        return load_dataset(self.dataset, self.seed)

    def load_model(self) -> keras.Model:
        """model.keras, checked against metrics.json's config and eval.npz."""
        model = load_keras_model(self.model_file)
        check_model(model, self.config, self.model_file)
        return model


def read_run(path: str | os.PathLike) -> Run:
    """Read and validate a run directory (not its model: `Run.load_model()`).

    Raises:
        UsageError: a missing or unreadable file, or values that do not fit
            together, named in one line.
    """
    run = pathlib.Path(path)
    if not run.is_dir():
        what = "does not exist" if not run.exists() else "is not a directory"
        raise UsageError(f"{what}; expected a run directory ({', '.join(REQUIRED)})", run)
    for name in REQUIRED:
        if not (run / name).is_file():
            raise UsageError("missing; expected a run directory from keras-mha-train", run / name)
    metrics = _load_json(run / "metrics.json")
    config = model_config(metrics, run / "metrics.json")
    ev = _load_eval(run / "eval.npz")
    calibration = arrays.read_npz(run / "calibration.npz", ("x",))["x"]
    labels = _load_json(run / "labels.json")
    vocab = Vocab.load(run / "vocab.json") if (run / "vocab.json").is_file() else None
    return validate(run, metrics, config, ev, calibration, labels, vocab)


def validate(
    run: pathlib.Path,
    metrics: dict,
    config: ModelConfig,
    ev: EvalSet,
    calibration: np.ndarray,
    labels: Any,
    vocab: Any = None,
) -> Run:
    """Every cross-file check of a run directory; returns the `Run`."""
    check_eval(ev, run / "eval.npz")
    if ev.num_classes != config.num_classes:
        raise UsageError(
            f"array probs has {ev.num_classes} classes; metrics.json's model has "
            f"{config.num_classes}",
            run / "eval.npz",
        )
    shape, dtype = input_spec(config)
    vocab_size = config.feature_dim if config.input_kind == "tokens" else None
    for where, x in ((run / "eval.npz", ev.x), (run / "calibration.npz", calibration)):
        check_inputs(x, where, "x", shape=shape, dtype=dtype, vocab_size=vocab_size)
    labels = check_labels(labels, config.num_classes, run / "labels.json")
    if config.input_kind == "tokens" and vocab is None:
        raise UsageError("missing; a token model's run needs its vocabulary", run / "vocab.json")
    if vocab is not None:
        check_vocab(vocab, config, run / "vocab.json")
    ev = EvalSet(ev.x, ev.y.astype("int32"), ev.probs.astype("float32"), ev.extras)
    return Run(run, metrics, config, ev, calibration, labels, vocab)


def load_keras_model(path: str | os.PathLike) -> keras.Model:
    """A `.keras` file with keras_mha's layers registered; one-line errors."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise UsageError("missing", path)
    import keras

    import keras_mha.layers  # noqa: F401  (registers our layers before loading)

    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as error:  # Keras raises many kinds for a bad file
        text = str(error).strip()
        reason = text.splitlines()[0] if text else type(error).__name__
        raise UsageError(f"cannot load the model ({reason})", path) from None
