"""What an export reads, checked before anything is converted.

A source is a run directory (docs/artifacts.md: `model.keras`, `eval.npz`,
`calibration.npz`, `labels.json`, optional `vocab.json` and `metrics.json`) or
explicit files (`SourcePaths`). `load_source()` reads and validates all of it
and raises `InputError` with a one-line message on anything wrong: missing or
corrupt files, unknown custom objects, arrays whose shape or dtype do not
match the model's input, labels that do not match the classes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import re
import zipfile
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import keras


class InputError(Exception):
    """Bad input to an export; the message is one line, for the user."""


@dataclasses.dataclass(frozen=True)
class SourcePaths:
    """Files an export reads. `labels`, `vocab`, `metrics` are optional."""

    model: pathlib.Path
    calibration: pathlib.Path
    eval: pathlib.Path
    labels: pathlib.Path | None = None
    vocab: pathlib.Path | None = None
    metrics: pathlib.Path | None = None

    @classmethod
    def from_run_dir(cls, run_dir: str | os.PathLike) -> SourcePaths:
        """The files of a run directory written by `keras-mha-train`."""
        run = pathlib.Path(run_dir)
        if not run.exists():
            raise InputError(f"run directory {run} does not exist")
        if not run.is_dir():
            raise InputError(f"{run} is not a directory (expected a run directory)")
        optional = {name: run / f"{name}.json" for name in ("vocab", "metrics")}
        return cls(
            model=run / "model.keras",
            calibration=run / "calibration.npz",
            eval=run / "eval.npz",
            labels=run / "labels.json",
            **{name: path if path.is_file() else None for name, path in optional.items()},
        )

    def required(self) -> dict[str, pathlib.Path]:
        files = {"model": self.model, "calibration": self.calibration, "eval": self.eval}
        if self.labels is not None:
            files["labels"] = self.labels
        if self.vocab is not None:
            files["vocab"] = self.vocab
        return files


@dataclasses.dataclass
class Source:
    """A loaded, validated source: the model and the arrays it is checked on."""

    paths: SourcePaths
    model: Any  # keras.Model
    calibration: np.ndarray  # (M, ...) model inputs
    x: np.ndarray  # eval inputs (N, ...)
    y: np.ndarray  # eval labels (N,)
    probs: np.ndarray  # float Keras softmax on x (N, C)
    labels: list[str]
    labels_generated: bool  # no labels.json: class indices as names
    vocab: dict | None
    dataset: str | None

    @property
    def num_classes(self) -> int:
        return int(self.probs.shape[1])

    @property
    def float_accuracy(self) -> float:
        return float((self.probs.argmax(-1) == self.y).mean())


def _check_files(paths: SourcePaths) -> None:
    for role, path in paths.required().items():
        if not path.exists():
            raise InputError(f"{role} file {path} does not exist")
        if not path.is_file():
            raise InputError(f"{role} file {path} is not a file")


def _load_npz(path: pathlib.Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in keys if key not in data.files]
            if missing:
                raise InputError(
                    f"{path} has no array {missing[0]!r} (has: {', '.join(data.files) or 'none'})"
                )
            return {key: data[key] for key in keys}
    except InputError:
        raise
    except Exception as error:  # zipfile/pickle/format errors all mean "unreadable"
        raise InputError(f"cannot read {path}: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _load_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"cannot read {path}: {_first_line(error)}") from None


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype.name} {tuple(array.shape)}"


def _check_arrays(paths: SourcePaths) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    evaluation = _load_npz(paths.eval, ("x", "y", "probs"))
    x, y, probs = evaluation["x"], evaluation["y"], evaluation["probs"]
    calibration = _load_npz(paths.calibration, ("x",))["x"]
    if x.ndim < 2 or x.shape[0] == 0:
        raise InputError(f"{paths.eval}: x must be a non-empty batch (N, ...), got {_describe(x)}")
    n = x.shape[0]
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"{paths.eval}: y must be integer labels ({n},), got {_describe(y)}")
    if probs.ndim != 2 or probs.shape[0] != n or probs.shape[1] < 2:
        raise InputError(f"{paths.eval}: probs must be ({n}, classes), got {_describe(probs)}")
    if not np.issubdtype(probs.dtype, np.floating) or not np.isfinite(probs).all():
        raise InputError(f"{paths.eval}: probs must be finite floats, got {_describe(probs)}")
    if y.min() < 0 or y.max() >= probs.shape[1]:
        raise InputError(
            f"{paths.eval}: labels y must lie in [0, {probs.shape[1]}), got [{y.min()}, {y.max()}]"
        )
    if calibration.ndim < 2 or calibration.shape[0] == 0:
        raise InputError(
            f"{paths.calibration}: x must be a non-empty batch (M, ...), got {_describe(calibration)}"
        )
    return calibration, x, y.astype(np.int64), probs.astype(np.float32)


def _load_error(path: pathlib.Path, error: BaseException) -> InputError:
    """A one-line message for a failed `keras.saving.load_model`."""
    chain, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(str(current))
        current = current.__cause__ or current.__context__
    text = "\n".join(chain)
    match = re.search(r"Could not locate (?:class|function) '([^']+)'", text) or re.search(
        r"Unknown (?:layer|object|class)[^:]*: '?([\w.>]+)'?", text
    )
    if match:
        return InputError(
            f"cannot load {path}: unknown custom object {match.group(1)!r}; keras_mha layers "
            "are registered, others need their module imported first (--import-module MODULE)"
        )
    return InputError(f"cannot load {path}: {_first_line(error)}")


def load_model(path: pathlib.Path, import_modules: tuple[str, ...] = ()) -> keras.Model:
    """Load a `.keras` model after registering keras_mha's (and given) layers."""
    if path.suffix != ".keras":
        raise InputError(f"model file {path} must be a .keras file")
    if not zipfile.is_zipfile(path):
        raise InputError(f"cannot load {path}: not a .keras archive (corrupt or another format)")
    from .convert import captured_output, import_tensorflow

    import_tensorflow()  # also imports keras_mha, registering its layers
    for name in import_modules:
        try:
            importlib.import_module(name)
        except Exception as error:
            raise InputError(f"cannot import module {name!r}: {_first_line(error)}") from None
    import keras

    try:
        with captured_output():
            return keras.saving.load_model(path, compile=False)
    except Exception as error:
        raise _load_error(path, error) from None


def _check_model(model: keras.Model, paths: SourcePaths, num_classes: int) -> None:
    """The model has one input, a batch of None or 1, and `num_classes` outputs."""
    inputs = getattr(model, "inputs", None)
    outputs = getattr(model, "outputs", None)
    if not inputs or not outputs:
        raise InputError(
            f"{paths.model}: expected a Functional or Sequential Keras model with known inputs"
        )
    if len(inputs) != 1 or len(outputs) != 1:
        raise InputError(
            f"{paths.model}: expected one input and one output, got {len(inputs)} and {len(outputs)}"
        )
    if inputs[0].shape[0] not in (None, 1):
        raise InputError(f"{paths.model}: input batch size {inputs[0].shape[0]} must be None or 1")
    out_shape = tuple(outputs[0].shape)
    if len(out_shape) != 2 or out_shape[1] != num_classes:
        raise InputError(
            f"{paths.model}: output shape {out_shape} does not match eval probs "
            f"with {num_classes} classes"
        )


def _check_inputs(model: keras.Model, path: pathlib.Path, x: np.ndarray) -> None:
    """`x` holds model inputs: same trailing shape and dtype as the model's input."""
    spec = model.inputs[0]
    want_shape = tuple(spec.shape[1:])
    want_dtype = np.dtype(spec.dtype).name
    if tuple(x.shape[1:]) != want_shape or x.dtype.name != want_dtype:
        raise InputError(
            f"{path}: x is {_describe(x)} but the model takes {want_dtype} "
            f"(N, {', '.join(str(d) for d in want_shape)})"
        )


def _check_token_ids(model: keras.Model, path: pathlib.Path, x: np.ndarray) -> None:
    """Integer inputs feeding an Embedding must be valid ids (TFLite's GATHER fails otherwise)."""
    import keras

    if not np.issubdtype(x.dtype, np.integer):
        return
    embeddings = [layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)]
    if embeddings:
        vocab_size = int(embeddings[0].input_dim)
        if x.min() < 0 or x.max() >= vocab_size:
            raise InputError(
                f"{path}: token ids must lie in [0, {vocab_size}), got [{x.min()}, {x.max()}]"
            )


def load_source(
    paths: SourcePaths, dataset: str | None = None, import_modules: tuple[str, ...] = ()
) -> Source:
    """Read and validate everything an export needs; raise `InputError` if not usable."""
    _check_files(paths)
    calibration, x, y, probs = _check_arrays(paths)
    num_classes = probs.shape[1]
    labels_generated = paths.labels is None
    if labels_generated:
        labels = [str(i) for i in range(num_classes)]
    else:
        labels = _load_json(paths.labels)
        if not isinstance(labels, list) or not all(isinstance(v, str) for v in labels):
            raise InputError(f"{paths.labels}: expected a JSON list of class names")
        if len(labels) != num_classes:
            raise InputError(
                f"{paths.labels}: {len(labels)} class names but eval probs has {num_classes} classes"
            )
    vocab = None
    if paths.vocab is not None:
        vocab = _load_json(paths.vocab)
        if not isinstance(vocab, dict) or not isinstance(vocab.get("tokens"), list):
            raise InputError(f"{paths.vocab}: expected a JSON object with a 'tokens' list")
    if dataset is None and paths.metrics is not None:
        metrics = _load_json(paths.metrics)
        if isinstance(metrics, dict) and isinstance(metrics.get("dataset"), str):
            dataset = metrics["dataset"]
    model = load_model(paths.model, import_modules)
    _check_model(model, paths, num_classes)
    for path, array in ((paths.eval, x), (paths.calibration, calibration)):
        _check_inputs(model, path, array)
        _check_token_ids(model, path, array)
    return Source(
        paths=paths,
        model=model,
        calibration=calibration,
        x=x,
        y=y,
        probs=probs,
        labels=labels,
        labels_generated=labels_generated,
        vocab=vocab,
        dataset=dataset,
    )
