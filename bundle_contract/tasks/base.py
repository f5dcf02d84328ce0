"""The task interface: what one kind of bundle owns, in one object.

A task is what a model is for: `classification` (class probabilities,
labels), `embedding` (unit sentence vectors, nearest neighbours),
`text-classification`, `pair-scoring`. It owns everything that differs
between kinds of bundle:

- what eval.npz holds (`output`, `eval_arrays`, `check_eval`) and whether
  the data has labels (`labelled`: y, a float accuracy) and the output is
  class probabilities (`classes`: labels.json);
- its own files: what manifest.json says of them (`read_files`,
  `files_json`, `eval_json`; `Manifest.files`), reading them from a bundle
  (`load_files`), a sentence task's eval inputs (`inputs_file`,
  `inputs_json`, `parse_inputs`);
- how a mode is judged against the float model (`measure`) and with which
  thresholds (`thresholds`), and the figures the head tools report (`fidelity`);
- how it is described and reported (`describe`, `figures`, `columns`, `drops`);
- how its models run (`dynamic_length`, `attention_samples`) and the device's
  commands for one input (`commands`: `--text`, `--pair`, ...).

Export, the device and the library ask the task; none of them tests a
task's name (tests/test_import_graph.py counts). A new task is one module
beside these, its class registered where it is defined (`@register`,
registry.py), plus its tests (tests/test_tasks.py adds one in the test).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from typing import ClassVar

import numpy as np

from ..arrays import EvalData
from ..entries import EvalSpec
from ..fields import Fields
from ..files import DEFAULT_FILE_BYTES
from ..parity import Parity, Thresholds


@dataclasses.dataclass(frozen=True)
class Column:
    """A figure of the device's parity table: header, `Parity` field, format, shown unless --wide."""

    header: str
    field: str
    fmt: str
    narrow: bool = True


class Task:
    """One kind of bundle. Subclasses set the class attributes and the methods below."""

    name: ClassVar[str]
    output: ClassVar[str]  # eval.npz's array of the float model's outputs
    # eval.npz always has labels y (the float model's accuracy). A task whose eval
    # has them only sometimes says False; then `EvalData.labelled` tells.
    labelled: ClassVar[bool]
    classes: ClassVar[bool]  # the output is class probabilities; the bundle has labels.json
    search: ClassVar[bool] = False  # the device answers an input with its nearest eval inputs
    # The file generates: prefill and decode signatures over a KV cache the device
    # carries (edge_demo/runtimes/generate.py scores it, export/decoder_bundle.py
    # writes it); the manifest's `settings` say how to drive it.
    generates: ClassVar[bool] = False
    # The device's commands for one input besides the parity run: its flag -> what
    # the app does (edge_demo/app/cli.py `ACTIONS`: "predict", "search", "embed",
    # "score", "rank"). The app takes no other flag for a bundle of this task.
    commands: ClassVar[dict[str, str]] = {"--sample": "predict", "--text": "predict"}
    # The `Parity` figures the head tools report for a pruned model against the
    # unpruned one (keras_mha.heads.encoder.fidelity).
    fidelity: ClassVar[tuple[str, ...]] = ("agreement", "max_abs_diff", "mean_abs_diff")
    # keras-mha-rescale takes a pretrained encoder's run of this task (not a model
    # built on one): export's remedy for a left-out int8 or int16x8 names it
    rescalable: ClassVar[bool] = False
    dynamic_length: ClassVar[bool] = False  # each input runs at its own length (no TFLM file)
    max_model_bytes: ClassVar[int] = DEFAULT_FILE_BYTES  # a mode's file at most
    attention_samples: ClassVar[int]  # eval samples attention.npz holds
    max_samples: ClassVar[int | None] = None  # eval samples at most, if the task bounds them
    min_outputs: ClassVar[int] = 2  # eval.num_classes at least: classes, dimensions (a score: 1)
    columns: ClassVar[tuple[Column, ...]] = ()  # the device table's figures of this task
    drops: ClassVar[tuple[str, ...]] = ()  # the classifier's columns it has no figure for
    summary: ClassVar[tuple[Column, ...]]  # its figures in export's summary table

    # --- eval.npz ----------------------------------------------------------------
    def eval_arrays(self, spec: EvalSpec) -> dict[str, int]:
        """The arrays the device reads from eval.npz, each with the bytes it may hold."""
        return {
            "x": math.prod(spec.x_shape) * _itemsize(spec.x_dtype),
            self.output: spec.samples * spec.num_classes * 8,
        }

    def output_shape(self, spec: EvalSpec) -> tuple[int, ...]:
        """The shape of eval.npz's `output` array: a row of `num_classes` a sample."""
        return (spec.samples, spec.num_classes)

    def check_entry(
        self, fields: Fields, prefix: str, inp, out, signatures: dict, evaluation: EvalSpec
    ) -> None:
        """A `models.<mode>` entry's tensors (`TensorSpec` in and out, its other
        `Signature`s) against eval: batch 1, eval.x_shape in, a row of
        eval.num_classes out (`fields.fail` names the field)."""
        if inp.shape[0] != 1 or inp.shape[1:] != evaluation.x_shape[1:]:
            raise fields.fail(
                prefix + "input.shape",
                f"must be [1, {', '.join(map(str, evaluation.x_shape[1:]))}] "
                f"(batch 1, eval.x_shape), got {list(inp.shape)}",
            )
        if out.shape != (1, evaluation.num_classes):
            raise fields.fail(
                prefix + "output.shape",
                f"must be [1, {evaluation.num_classes}] (batch 1, eval.num_classes), "
                f"got {list(out.shape)}",
            )

    def check_models(self, fields: Fields, entries: dict, own: dict) -> None:
        """Every mode's entry against the task's own manifest fields (`read_files`' `own`)."""

    def check_eval(
        self, arrays: dict[str, np.ndarray], where: str | os.PathLike, pad_id: int = 0
    ) -> EvalData:
        """eval.npz's arrays, checked together (UsageError naming `where`); x is padded
        with `pad_id` (the manifest's)."""
        raise NotImplementedError

    # --- manifest.json ------------------------------------------------------------
    def read_accuracy(self, fields: Fields, ev: dict) -> float | None:
        """The manifest's `eval.float_accuracy` (None: the task has no labels)."""
        return None

    def read_files(self, fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
        """The manifest's entries of this task's own files, as `Manifest` fields:
        `files` ({name: FileRef}, what `Manifest.file(name)` finds) and any other
        field the task fills (a tokenizer's `max_length`, `pad_id`)."""
        return {"files": {}}

    def files_json(self, manifest) -> dict:
        """The manifest's entries of this task's own files (a Manifest's `files`)."""
        return {}

    def load_files(self, root: pathlib.Path, manifest, evaluation: EvalData) -> dict:
        """This task's own files of an opened bundle, checked, as `Bundle` fields."""
        return {}

    def eval_json(self, spec: EvalSpec) -> dict:
        """The manifest's `eval` entry."""
        return {**dataclasses.asdict(spec), "x_shape": list(spec.x_shape)}

    def float_accuracy(self, evaluation: EvalData) -> float | None:
        """What the manifest records as the float model's accuracy (None: no labels)."""
        return None

    # --- a sentence task's eval inputs as text (a run directory's and a bundle's) ----
    inputs_file: ClassVar[str | None] = None  # texts.json, pairs.json; None: no text

    def inputs_json(self, inputs) -> bytes:
        """The eval inputs' file (`inputs_file`), one entry per sample."""
        raise NotImplementedError

    def parse_inputs(self, data: bytes, samples: int, where: str | os.PathLike) -> tuple:
        """`inputs_file`'s entries, checked (a UsageError naming `where`)."""
        raise NotImplementedError

    # --- parity -------------------------------------------------------------------
    def measure(self, outputs: np.ndarray, evaluation: EvalData) -> Parity:
        """A mode's figures: its outputs on eval.npz against the float model's."""
        raise NotImplementedError

    def thresholds(self, mode: str, samples: int) -> Thresholds:
        """What export writes into `mode`'s entry, verified on `samples` eval samples."""
        raise NotImplementedError

    # --- words --------------------------------------------------------------------
    def describe(self, num_classes: int, float_accuracy: float | None, max_length: int | None):
        """What the model gives, for a header line."""
        raise NotImplementedError

    def figures(self, parity: Parity, float_accuracy: float | None) -> str:
        """A mode's figures on one line (export's log)."""
        raise NotImplementedError


def _itemsize(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize or 8
    except TypeError:  # the manifest's dtype is checked elsewhere; bound it by the widest
        return 8
