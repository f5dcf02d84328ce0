"""A pretrained model's run directory: a checkpoint imported by `keras-mha-import`.

    RUN/
      model.keras      the encoder (keras_mha.pretrained.bert.build_encoder): ids -> unit
                       vectors (task "embedding") or class probabilities (a sequence
                       classifier: task "text-classification")
      metrics.json     {"task", "dataset", "seed", "config", "max_length", "source"}
      eval.npz         x (N, T) int32 token ids, padded with the config's pad_token_id;
                       the model's outputs under the task's name: embeddings (N, d) or
                       probs (N, C); a classifier fine-tuned on the user's labels
                       (keras-mha-train --from) also y (N,), the held-out gold labels
      calibration.npz  x (M, T') token ids (int8 calibration)
      texts.json       the eval sentences, one per row of x (a cross-encoder:
      pairs.json       the eval (query, passage) pairs, in groups of one query)
      tokenizer.json   the checkpoint's tokenizer (Hugging Face tokenizers)
      labels.json      a classifier's class names (config.json's id2label)
      heads/           optional: keras-mha-heads' results (coref.json: the best
                       coreference head, which export copies into the bundle)

metrics.json's `config` is a `BertConfig`; a pruned run's has `heads_per_layer`
(the model's heads per layer; `load_model` checks them).

Read and written with the device's own checks (the task's `check_eval`,
`parse_texts`, `Subwords`), so export cannot bundle what the device refuses.
Written whole or not at all (staged beside `out`, then renamed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil

import numpy as np

from bundle_contract import arrays
from bundle_contract.arrays import EvalData
from bundle_contract.errors import UsageError
from bundle_contract.files import staging_dir, swap_into_place
from bundle_contract.lists import labels_json
from bundle_contract.subwords import Subwords
from bundle_contract.tasks import Task
from bundle_contract.tasks import get as get_task
from bundle_contract.tasks.embedding import Embedding
from bundle_contract.tasks.pair_scoring import PairScoring
from bundle_contract.tasks.text_classification import TextClassification
from keras_mha.rundir.writing import check_out

TASK = get_task(Embedding.name)  # a sentence encoder's runs and bundles
CLASSIFIER_TASK = get_task(TextClassification.name)  # a sequence classifier's
PAIR_TASK = get_task(PairScoring.name)  # a cross-encoder's
FILES = ("model.keras", "metrics.json", "eval.npz", "calibration.npz", "tokenizer.json")


def task_for(config) -> Task:
    """The task of a run of `config` (a `BertConfig`): a cross-encoder's, a classifier's
    or an encoder's."""
    if config.score_activation:
        return PAIR_TASK
    return CLASSIFIER_TASK if config.labels else TASK


def _own_files(run) -> dict[str, bytes]:
    """The run's task files by manifest name: its eval inputs (texts, pairs) and, with
    classes, labels.json."""
    task = run.task
    files = {task.inputs_file.removesuffix(".json"): task.inputs_json(run.texts)}
    if task.classes:
        files["labels"] = labels_json(run.config.labels)
    return files


@dataclasses.dataclass
class EmbeddingRun:
    path: pathlib.Path
    metrics: dict
    config: object  # keras_mha.pretrained.bert.BertConfig
    max_length: int
    eval: EvalData  # x, y (float nearest neighbours), probs = the float vectors
    calibration: np.ndarray
    texts: tuple  # the eval sentences; a cross-encoder's (query, passage) pairs
    tokenizer: Subwords

    vocab = None  # word pieces come from tokenizer.json

    @property
    def task(self) -> Task:
        return task_for(self.config)

    @property
    def pad_id(self) -> int:
        """The id that pads x and that the model masks (BERT's [PAD] 0, RoBERTa's <pad> 1)."""
        return self.config.pad_token_id

    @property
    def dataset(self) -> str:
        return str(self.metrics.get("dataset", "corpus"))

    @property
    def gold_labels(self) -> np.ndarray | None:
        """The eval rows' gold labels (a classifier fine-tuned on the user's labels:
        its held-out split), None without; a run derived from this one keeps them."""
        return self.eval.y if self.eval.labelled else None

    @property
    def eval_data(self) -> EvalData:
        return self.eval

    def bundle_files(self) -> dict[str, tuple[str, bytes]]:
        """The files a bundle of this run holds besides the models and eval.npz:
        Manifest field -> (file name, bytes)."""
        return {
            "tokenizer": ("tokenizer.json", (self.path / "tokenizer.json").read_bytes()),
            **{name: (name + ".json", data) for name, data in _own_files(self).items()},
        }

    @property
    def model_file(self) -> pathlib.Path:
        return self.path / "model.keras"

    def load_model(self):
        from keras_mha.model import encoder_blocks
        from keras_mha.rundir.reading import load_keras_model

        model = load_keras_model(self.model_file)
        width = int(model.outputs[0].shape[-1])
        if width != _width(self.config):
            raise UsageError(
                f"outputs {width} values; metrics.json's config has {_width(self.config)}",
                self.model_file,
            )
        heads = [block.attention.num_heads for block in encoder_blocks(model)]
        if heads != self.heads_per_layer:
            raise UsageError(
                f"has {heads} heads per layer; metrics.json says {self.heads_per_layer}",
                self.model_file,
            )
        return model

    @property
    def heads_per_layer(self) -> list[int]:
        """The heads of each layer: the config's (`heads_per_layer` of a pruned run).

        A run pruned before the config recorded them has them only in
        `pruning.heads_after`.
        """
        pruning = self.metrics.get("pruning")
        after = pruning.get("heads_after") if isinstance(pruning, dict) else None
        if self.config.heads_per_layer is None and isinstance(after, list):
            return after
        return self.config.heads


def _width(config) -> int:
    """The model's output width: d (unit vectors), the classes or 1 (a score)."""
    return config.output_width


def _config(run: pathlib.Path, metrics: object):
    """metrics.json's `config` and `task`, which must be the config's."""
    from keras_mha.pretrained.config import BertConfig

    where = run / "metrics.json"
    if not isinstance(metrics, dict):
        raise UsageError("expected a JSON object", where)
    config = BertConfig.from_dict(metrics.get("config"), where)
    if metrics.get("task") != task_for(config).name:
        raise UsageError(
            f"expected task {task_for(config).name!r} (its config "
            f"{'has labels' if config.labels else 'scores pairs' if config.score_activation else 'is a sentence encoder'})",
            where,
        )
    return config


def _check(
    run: pathlib.Path, metrics: dict, x, vectors, calibration, texts, tokenizer_bytes, y=None
):
    config = _config(run, metrics)
    task = task_for(config)
    max_length = metrics.get("max_length")
    if not isinstance(max_length, int) or not 2 <= max_length <= config.max_length:
        raise UsageError(
            f"max_length must be an integer from 2 to {config.max_length}, got {max_length!r}",
            run / "metrics.json",
        )
    given = {"x": x, task.output: vectors, **({} if y is None else {"y": y})}
    ev = task.check_eval(given, run / "eval.npz", config.pad_token_id)
    if vectors.shape[1] != _width(config):
        raise UsageError(
            f"{task.output} have {vectors.shape[1]} values per row; the config has "
            f"{_width(config)}",
            run / "eval.npz",
        )
    for where, ids in ((run / "eval.npz", x), (run / "calibration.npz", calibration)):
        arrays.check_inputs(ids, where, "x")
        if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.shape[1] > max_length:
            raise UsageError(f"x must be token ids (N, T <= {max_length})", where)
        if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
            raise UsageError(f"x has ids outside 0..{config.vocab_size - 1}", where)
    name = task.inputs_file
    data = task.inputs_json(texts) if isinstance(texts, (list, tuple)) else texts
    texts = task.parse_inputs(data, len(x), run / name)
    tokenizer = Subwords.from_bytes(
        tokenizer_bytes, max_length, run / "tokenizer.json", config.pad_token_id
    )
    if tokenizer.vocab_size > config.vocab_size:
        raise UsageError(
            f"has {tokenizer.vocab_size} tokens; the model embeds {config.vocab_size}",
            run / "tokenizer.json",
        )
    return EmbeddingRun(run, metrics, config, max_length, ev, calibration, texts, tokenizer)


def read_embedding_run(path: str | os.PathLike) -> EmbeddingRun:
    """Read and check an embedding run directory (not its model: `load_model()`)."""
    run = pathlib.Path(path)
    for name in FILES:
        if not (run / name).is_file():
            raise UsageError("missing; expected a run from keras-mha-import", run / name)
    try:
        metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
        tokenizer = (run / "tokenizer.json").read_bytes()
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read it ({error})", run) from None
    config = _config(run, metrics)
    task = task_for(config)
    name = task.inputs_file
    if not (run / name).is_file():
        raise UsageError("missing; expected a run from keras-mha-import", run / name)
    try:
        texts = (run / name).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read it ({error})", run / name) from None
    labels = ("y",) if task.classes else ()  # a fine-tuned classifier's held-out labels
    ev = arrays.read_npz(run / "eval.npz", ("x", task.output), optional=labels)
    calibration = arrays.read_npz(run / "calibration.npz", ("x",))["x"]
    return _check(
        run, metrics, ev["x"], ev[task.output], calibration, texts, tokenizer, ev.get("y")
    )


def write_embedding_run(
    out: str | os.PathLike,
    model,
    metrics: dict,
    x: np.ndarray,
    vectors: np.ndarray,
    calibration: np.ndarray,
    texts: list,
    tokenizer_bytes: bytes,
    overwrite: bool = False,
    extra: dict[str, bytes] | None = None,
    y: np.ndarray | None = None,
) -> EmbeddingRun:
    """Check everything as `read_embedding_run` would, then write the run whole
    (with `extra` files: name -> bytes, e.g. keras_mha.qat's ranges.json; `y`:
    a classifier's gold labels of the eval rows, its held-out split)."""
    out = check_out(out, overwrite)
    from keras_mha.pretrained.config import BertConfig

    task = task_for(BertConfig.from_dict(metrics.get("config"), "metrics.json"))
    metrics = {**metrics, "task": task.name}
    run = _check(out, metrics, x, vectors, calibration, list(texts), tokenizer_bytes, y)
    staging = staging_dir(out)
    try:
        model.save(staging / "model.keras")
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        labels = {} if y is None else {"y": run.eval.y}
        np.savez(
            staging / "eval.npz",
            x=x.astype(np.int32),
            **{task.output: vectors.astype(np.float32)},
            **labels,
        )
        np.savez(staging / "calibration.npz", x=calibration.astype(np.int32))
        (staging / "tokenizer.json").write_bytes(tokenizer_bytes)
        for name, data in _own_files(run).items():
            (staging / f"{name}.json").write_bytes(data)
        for name, data in (extra or {}).items():
            (staging / name).write_bytes(data)
        swap_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dataclasses.replace(run, path=out)
