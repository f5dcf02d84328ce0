"""What a training run writes: its metrics, the parity reference, calibration, plots.

The files themselves are written (and validated) by `keras_mha.rundir.RunWriter`;
this module decides their content (docs/artifacts.md).
"""

from __future__ import annotations

import dataclasses
import platform
from typing import TYPE_CHECKING

import numpy as np

from keras_mha import data as datasets
from keras_mha.rundir import EvalSet, RunWriter

if TYPE_CHECKING:
    from keras_mha.model import ModelConfig
    from keras_mha.train.fit import Fitted
    from keras_mha.train.presets import TrainSettings


def calibration_sample(x_train: np.ndarray, seed: int, size: int = 256) -> np.ndarray:
    """A seeded random sample of training inputs for int8 calibration."""
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(x_train), size=min(size, len(x_train)), replace=False))
    return x_train[pick]


def eval_set(data: datasets.Dataset, probs: np.ndarray) -> EvalSet:
    """eval.npz: the test split as the model takes it, with the float model's softmax."""
    extras = {}
    if data.cue_test is not None:
        extras = {
            "cue": data.cue_test.astype(str),
            "nouns": data.nouns_test.astype("int32"),
            "text": data.text_test.astype(str),
        }
    return EvalSet(data.x_test, data.y_test.astype("int32"), probs, extras)


def versions() -> dict[str, str]:
    """The versions the run was trained with: Keras's backend and its package too."""
    import importlib.metadata

    import keras

    from keras_mha import __version__

    backend = keras.backend.backend()
    package = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(backend, backend)
    try:
        backend_version = importlib.import_module(package).__version__
    except (ImportError, AttributeError):
        backend_version = importlib.metadata.version(package)
    return {
        "keras_mha": __version__,
        package: backend_version,
        "keras": keras.__version__,
        "backend": backend,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def run_metrics(
    data: datasets.Dataset,
    config: ModelConfig,
    settings: TrainSettings,
    fitted: Fitted,
    distribute: str | None,
    deterministic: bool,
) -> dict:
    """metrics.json of a training run (docs/artifacts.md)."""
    from keras_mha.model import count_params

    correct = fitted.test_probs.argmax(-1) == data.y_test
    metrics = {
        "dataset": data.name,
        "seed": config.seed,
        "config": config.to_dict(),
        "test_accuracy": float(correct.mean()),
        "per_class_accuracy": [
            float(correct[data.y_test == c].mean()) if (data.y_test == c).any() else None
            for c in range(data.num_classes)
        ],
        "validation_accuracy": float((fitted.val_probs.argmax(-1) == data.y_val).mean()),
        "num_params": count_params(fitted.model),
        "train_seconds": round(fitted.train_seconds, 2),
        "epochs_run": len(fitted.history["loss"]),
        "best_epoch": fitted.best_epoch,
        "training": dataclasses.asdict(settings),
        "samples": {
            "train": len(data.y_train),
            "train_augmented": fitted.train_augmented,
            "validation": len(data.y_val),
            "test": len(data.y_test),
        },
        "distribute": {"strategy": distribute, "replicas": fitted.replicas, **fitted.mesh},
        "deterministic": deterministic,
        "history": fitted.history,
        "versions": versions(),
    }
    if data.cue_test is not None:
        metrics["per_cue_accuracy"] = {
            cue: float(correct[data.cue_test == cue].mean()) for cue in datasets.CUES
        }
        metrics["per_structure_accuracy"] = {
            f"{cue}, {nouns} nouns": float(
                correct[(data.cue_test == cue) & (data.nouns_test == nouns)].mean()
            )
            for cue, nouns in datasets.STRUCTURES
        }
    return metrics


def write_training_run(
    writer: RunWriter, data: datasets.Dataset, config: ModelConfig, fitted: Fitted, metrics: dict
) -> None:
    """Every file of the run, into `writer`'s staging directory."""
    writer.write(
        fitted.model,
        metrics,
        config,
        eval_set(data, fitted.test_probs),
        calibration_sample(data.x_train, config.seed),
        list(data.labels),
        data.vocab,
    )
    save_plots(writer.staging, data, fitted, metrics)


def _attention_samples(data: datasets.Dataset, count: int = 3) -> np.ndarray:
    """A few test samples to draw; for pronouns one per cue."""
    if data.cue_test is not None:
        structures = (("number", 2), ("semantic", 2), ("both", 3))
        picks = [
            np.flatnonzero((data.cue_test == cue) & (data.nouns_test == nouns))[:1]
            for cue, nouns in structures
        ]
        return np.concatenate(picks)
    return np.arange(min(count, len(data.y_test)))


def save_plots(run, data: datasets.Dataset, fitted: Fitted, metrics: dict) -> None:
    """training_curves.png and attention_heads.png."""
    from keras_mha import plots
    from keras_mha.model import forward

    plots.save_training_curves(
        fitted.history,
        run / "training_curves.png",
        best_epoch=metrics["best_epoch"],
        title=f"{data.name}: test accuracy {metrics['test_accuracy']:.3f}",
    )
    picks = _attention_samples(data)
    predicted = fitted.test_probs.argmax(-1)
    _, scores = forward(fitted.model, data.x_test[picks], return_attention_scores=True)
    plots.save_attention_heads(
        [np.asarray(s) for s in scores],
        [data.token_labels(x) for x in data.x_test[picks]],
        run / "attention_heads.png",
        sample_titles=[
            (f"{data.cue_test[i]} cue: " if data.cue_test is not None else "")
            + f"true {data.labels[data.y_test[i]]}, predicted {data.labels[predicted[i]]}"
            for i in picks
        ],
        images=data.x_test[picks] if data.vocab is None else None,
    )
