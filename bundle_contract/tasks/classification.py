"""Classification: a model that gives class probabilities; eval.npz has labels.

eval.npz: `x`, `y` (labels), `probs` (the float Keras model's softmax);
the bundle names its classes in labels.json. A mode is judged by the top-1
predictions it changes and its accuracy drop (parity.py's thresholds); the
device prints a prediction for one input.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from ..arrays import EvalData, check_eval
from ..attention import MAX_SAMPLES as ATTENTION_SAMPLES
from ..entries import EvalSpec, FileRef
from ..fields import Fields
from ..files import read_inside
from ..lists import MAX_LABELS_BYTES, parse_labels
from ..parity import Parity, Thresholds, default_thresholds, measure
from .base import Column, Task
from .registry import register


@register
class Classification(Task):
    name = "classification"
    output = "probs"
    labelled = True
    classes = True
    attention_samples = ATTENTION_SAMPLES
    summary = (
        Column("agreement", "agreement", ".4f"),
        Column("accuracy", "accuracy", ".4f"),
        Column("max|Δ|", "max_abs_diff", ".2g"),
    )

    def eval_arrays(self, spec: EvalSpec) -> dict[str, int]:
        return {**super().eval_arrays(spec), "y": spec.samples * 8}

    def check_eval(
        self, arrays: dict[str, np.ndarray], where: str | os.PathLike, pad_id: int = 0
    ) -> EvalData:
        return check_eval(arrays["x"], arrays["y"], arrays[self.output], where)

    def read_accuracy(self, fields: Fields, ev: dict) -> float | None:
        return fields.number(ev, "float_accuracy", "eval.")

    def read_files(self, fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
        files = {"labels": FileRef.from_json(fields, data, "labels")}
        if fields.get(data, "vocab") is not None:  # a token classifier's vocab.json
            files["vocab"] = FileRef.from_json(fields, data, "vocab")
        return {"files": files}

    def files_json(self, manifest) -> dict:
        vocab = manifest.file("vocab")
        return {
            "labels": manifest.file("labels").to_json(),
            "vocab": None if vocab is None else vocab.to_json(),
        }

    def load_files(self, root: pathlib.Path, manifest, evaluation: EvalData) -> dict:
        ref = manifest.file("labels")
        data = read_inside(root, ref.file, ref.sha256, max_bytes=MAX_LABELS_BYTES)
        return {"labels": parse_labels(data, manifest.eval.num_classes, root / ref.file)}

    def eval_json(self, spec: EvalSpec) -> dict:
        data = super().eval_json(spec)
        del data["task"]  # the default task: format 1 as it was
        return data

    def float_accuracy(self, evaluation: EvalData) -> float | None:
        return evaluation.float_accuracy

    def measure(self, outputs: np.ndarray, evaluation: EvalData) -> Parity:
        return measure(outputs, evaluation.y, evaluation.probs)

    def thresholds(self, mode: str, samples: int) -> Thresholds:
        return default_thresholds(mode, samples)

    def describe(self, num_classes: int, float_accuracy: float | None, max_length: int | None):
        return f"{num_classes} classes, float accuracy {float_accuracy:.4f}"

    def figures(self, parity: Parity, float_accuracy: float | None) -> str:
        return (
            f"agreement {parity.agreement:.4f}  accuracy {parity.accuracy:.4f} "
            f"(float {float_accuracy:.4f})  max|Δ| {parity.max_abs_diff:.2g}"
        )
