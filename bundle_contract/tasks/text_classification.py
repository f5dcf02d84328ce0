"""Text classification: a checkpoint's classifier, class probabilities from sentences.

A sequence-classification checkpoint (`BertForSequenceClassification`, the
DistilBERT, RoBERTa and XLM-R ones) imported by keras-mha-import: its eval
sentences are the project's corpus, which the checkpoint's labels say nothing
about, so eval.npz has no labels; or a classifier fine-tuned on the user's
labelled text (keras-mha-train --from), whose eval set is its held-out split
with the gold labels. eval.npz: `x` (token ids, padded with the tokenizer's
pad id), `probs` (the float Keras model's softmax) and, when labelled, `y`
(the manifest then records the float model's accuracy, `eval.float_accuracy`,
which is how the device knows to read y); the bundle names the classes in
labels.json and holds the sentences (texts.json) and the checkpoint's
tokenizer.json. A mode is judged against the float model: float32 and
float16 bound every probability, the quantized modes may change at most 1 %
of its top-1 predictions (`unlabelled_thresholds` below); with labels
each mode's accuracy on them is reported too. Each sentence runs at its own
length; `--text` on the device prints the label and the probabilities.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from ..arrays import EvalData, check_eval, check_probabilities, check_token_ids, describe_array
from ..entries import EvalSpec
from ..errors import UsageError
from ..fields import Fields
from ..parity import (
    FLOAT_THRESHOLDS,
    QUANTIZED_MODES,
    Parity,
    Thresholds,
    measure,
    quantized_thresholds,
)
from .base import Column, Task
from .classification import Classification
from .registry import register
from .text import (
    TEXT_ATTENTION_SAMPLES,
    TextInputs,
    load_text_files,
    read_text_files,
    text_files_json,
    with_files,
)

MAX_TEXT_SAMPLES = 50_000


@register
class TextClassification(TextInputs, Task):
    name = "text-classification"
    output = "probs"
    labelled = False  # not always: a fine-tuned classifier's eval has labels (EvalData.labelled)
    classes = True
    dynamic_length = True
    attention_samples = TEXT_ATTENTION_SAMPLES
    max_samples = MAX_TEXT_SAMPLES
    summary = (
        Column("agreement", "agreement", ".4f"),
        Column("max|Δ|", "max_abs_diff", ".2g"),
    )
    drops = ("accuracy",)

    def eval_arrays(self, spec: EvalSpec) -> dict[str, int]:
        arrays = super().eval_arrays(spec)
        if spec.float_accuracy is not None:  # labelled: the held-out gold labels
            arrays["y"] = spec.samples * 8
        return arrays

    def check_eval(
        self, arrays: dict[str, np.ndarray], where: str | os.PathLike, pad_id: int = 0
    ) -> EvalData:
        return check_text_eval(arrays["x"], arrays[self.output], where, pad_id, arrays.get("y"))

    def read_accuracy(self, fields: Fields, ev: dict) -> float | None:
        if ev.get("float_accuracy") is None:
            return None
        return fields.number(ev, "float_accuracy", "eval.")

    def float_accuracy(self, evaluation: EvalData) -> float | None:
        return evaluation.float_accuracy if evaluation.labelled else None

    def read_files(self, fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
        labels = Classification().read_files(fields, data, evaluation)["files"]
        return with_files(read_text_files(fields, data, evaluation), **labels)

    def files_json(self, manifest) -> dict:
        return {**Classification().files_json(manifest), **text_files_json(manifest)}

    def load_files(self, root: pathlib.Path, manifest, evaluation: EvalData) -> dict:
        labels = Classification().load_files(root, manifest, evaluation)
        return {**labels, **load_text_files(root, manifest, evaluation.x)}

    def measure(self, outputs: np.ndarray, evaluation: EvalData) -> Parity:
        return measure(outputs, evaluation.y if evaluation.labelled else None, evaluation.probs)

    def thresholds(self, mode: str, samples: int) -> Thresholds:
        return unlabelled_thresholds(mode, samples)

    def describe(self, num_classes: int, float_accuracy: float | None, max_length: int | None):
        if float_accuracy is not None:
            return (
                f"{num_classes} classes from text, up to {max_length} tokens; held-out "
                f"labels, float accuracy {float_accuracy:.4f}; judged against the float model"
            )
        return (
            f"{num_classes} classes from text, up to {max_length} tokens; no labelled eval "
            "data: judged against the float model"
        )

    def figures(self, parity: Parity, float_accuracy: float | None) -> str:
        line = f"agreement {parity.agreement:.4f}  max|Δp| {parity.max_abs_diff:.2g}"
        if float_accuracy is None:
            return line
        return f"{line}  accuracy {parity.accuracy:.4f} (float {float_accuracy:.4f})"


# --- the task's own checks and thresholds ----------------------------------------


def check_text_eval(
    x: np.ndarray,
    probs: np.ndarray,
    where: str | os.PathLike,
    pad_id: int = 0,
    y: np.ndarray | None = None,
) -> EvalData:
    """A text classifier's `eval.npz`: token ids `x (N, T)` (padded with `pad_id`),
    the float model's class probabilities `probs (N, C)` and, for a classifier
    fine-tuned on the user's labels, its held-out gold labels `y (N,)`. Without
    y, y is the float model's own top-1 class (`labelled` False: no accuracy)."""
    n = check_token_ids(x, where, pad_id)
    if y is not None:
        return check_eval(x, y, probs, where)
    if probs.ndim != 2 or probs.shape[0] != n:
        raise UsageError(
            f"probs must be float of shape [{n}, classes], got {describe_array(probs)}", where
        )
    check_probabilities(probs, where)
    return EvalData(x, probs.argmax(-1).astype(np.int64), probs.astype(np.float32), labelled=False)


def unlabelled_thresholds(mode: str, samples: int) -> Thresholds:
    """A classifier without labelled eval data (an imported checkpoint's): the float
    modes bounded elementwise, the quantized ones by the float model's top-1
    predictions they change (the 1 % rule); there is no accuracy to drop."""
    if mode in FLOAT_THRESHOLDS:
        return FLOAT_THRESHOLDS[mode]
    if mode in QUANTIZED_MODES:
        return dataclasses.replace(quantized_thresholds(samples), max_accuracy_drop=None)
    raise ValueError(f"unknown mode {mode!r}")
