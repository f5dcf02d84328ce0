"""What an export reads, checked before anything is converted.

A source is a run directory, read and validated by `keras_mha.rundir`
(`read_run`: metrics.json's config, eval.npz, calibration.npz, labels.json,
vocab.json; `Run.load_model`), or explicit files (`SourcePaths`: any Keras
classifier, checked with the same rundir and edge functions). Every problem
is a `UsageError` with one line naming the file and the array: probs that
are not probabilities, NaN calibration, shapes that do not match the model,
labels that do not match the classes, a vocabulary the device would refuse.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import os
import pathlib
import re
import zipfile
from typing import TYPE_CHECKING, Any

import numpy as np

from bundle_contract.arrays import EvalData, own_lengths, pad_ids, read_npz
from bundle_contract.attention import CorefHead
from bundle_contract.bundle import check_text_inputs
from bundle_contract.errors import UsageError, one_line
from bundle_contract.lists import labels_json
from bundle_contract.tasks import Task
from bundle_contract.tasks import get as get_task
from bundle_contract.tasks.classification import Classification
from bundle_contract.vocab import Vocab

if TYPE_CHECKING:
    import keras


@dataclasses.dataclass(frozen=True)
class SourcePaths:
    """Explicit files to export (instead of a run directory). `labels`, `vocab` are optional."""

    model: pathlib.Path
    calibration: pathlib.Path
    eval: pathlib.Path
    labels: pathlib.Path | None = None
    vocab: pathlib.Path | None = None

    def files(self) -> dict[str, pathlib.Path]:
        """Role -> path of every file given."""
        named = {"model": self.model, "calibration": self.calibration, "eval": self.eval}
        named.update({k: v for k, v in (("labels", self.labels), ("vocab", self.vocab)) if v})
        return {role: pathlib.Path(path) for role, path in named.items()}


@dataclasses.dataclass
class Source:
    """A loaded, validated source: the model and the arrays it is checked on."""

    files: dict[str, pathlib.Path]  # role -> path: model, eval, calibration, [labels, vocab]
    model: Any  # keras.Model
    calibration: np.ndarray  # (M, ...) model inputs
    eval: EvalData
    task: Task  # what the model is for (bundle_contract.tasks)
    # The task's own files: Manifest field -> (file name, bytes) (labels.json;
    # an embedding run's texts.json and tokenizer.json).
    own_files: dict[str, tuple[str, bytes]]
    vocab: Vocab | None
    dataset: str | None
    max_length: int | None = None  # the tokenizer's longest input (an embedding run)
    pad_id: int = 0  # the id that pads token ids and that the model masks
    # ranges.json (keras_mha.qat): int8 ranges the int8 conversion takes as given.
    ranges: dict | None = None
    # The best coreference head (a run's heads/coref.json, keras-mha-heads coref),
    # or why there is none for this model.
    coref_head: CorefHead | None = None
    coref_note: str | None = None
    # --length L: token ids padded to L and the model traced at (1, L) (`at_length`).
    length: int | None = None
    eval_bytes: bytes | None = None  # eval.npz as the bundle holds it (None: the file's)
    # What export did to the model's attention (`on_our_layer`): converted to
    # keras_mha's, or why it could not.
    attention_note: str | None = None
    # Explicit files (--model): a model the project did not build. What export
    # cannot read of it (its attention weights) is left out with a reason; in
    # a run the project wrote, the same failure is a bug and stops the export.
    user_model: bool = False

    @property
    def dynamic(self) -> bool:
        """Whether the models convert with a dynamic sequence axis (no fixed `length`)."""
        return self.task.dynamic_length and self.length is None

    def eval_file(self) -> bytes:
        """eval.npz's bytes for the bundle: the source file, or its padded copy."""
        return self.files["eval"].read_bytes() if self.eval_bytes is None else self.eval_bytes

    @property
    def has_blocks(self) -> bool:
        """Whether the model has keras_mha blocks (which coreference heads are read from)."""
        from keras_mha.layers import TransformerEncoderBlock

        return any(isinstance(layer, TransformerEncoderBlock) for layer in self.model.layers)

    @functools.cached_property
    def attention_problem(self) -> str | None:
        """Why the bundle cannot show the model's attention weights; None: it can
        (`keras_mha.model.attention_model` builds on the model: keras_mha
        attention layers, at any depth, each run once by its call, each giving
        `(batch, heads, T, T)` weights over the input's T tokens, which is what
        the device's parity check and head view read)."""
        from keras_mha.layer_swap import keras_error_line
        from keras_mha.model import attention_model, attention_recorders

        if not attention_recorders(self.model):
            return "the model has no keras_mha MultiHeadAttention"
        try:
            probe = attention_model(self.model, batch_size=1)
        except Exception as error:
            # attention_model's refusals (a layer run twice, or whose own call
            # never records) are ValueErrors; anything else from a model the
            # project built is a bug, not a model to export without its view
            if not (isinstance(error, ValueError) or self.user_model):
                raise
            return f"its attention weights cannot be read ({one_line(keras_error_line(error))})"
        tokens = self.model.inputs[0].shape[1]
        for weights in probe.outputs:
            shape = tuple(weights.shape)
            t = shape[2] if len(shape) == 4 else None
            if len(shape) != 4 or shape[3] != t or (None not in (t, tokens) and t != tokens):
                return (
                    f"an attention layer's weights are {shape}, not (batch, heads, T, T) "
                    f"over the input's {tokens or 'T'} tokens"
                )
        return None

    @property
    def has_attention(self) -> bool:
        """Whether the bundle gets the attention signature (`attention_problem`)."""
        return self.attention_problem is None

    @property
    def num_classes(self) -> int:
        return self.eval.num_classes


def run_files(run_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """The files of a run directory an export reads (for the target checks)."""
    names = {"model": "model.keras", "eval": "eval.npz", "calibration": "calibration.npz"}
    names.update(labels="labels.json", vocab="vocab.json", metrics="metrics.json")
    names.update(texts="texts.json", tokenizer="tokenizer.json", ranges="ranges.json")
    return {role: run_dir / name for role, name in names.items()}


def _load_error(path: pathlib.Path, error: BaseException) -> UsageError:
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
        return UsageError(
            f"cannot load it: unknown custom object {match.group(1)!r}; keras_mha layers "
            "are registered, others need their module imported first (--import-module MODULE)",
            path,
        )
    text = str(error).strip()
    return UsageError(
        f"cannot load it: {text.splitlines()[0] if text else type(error).__name__}", path
    )


def load_keras_file(path: pathlib.Path, import_modules: tuple[str, ...] = ()) -> keras.Model:
    """Load any `.keras` classifier after importing `import_modules` (its custom layers)."""
    if path.suffix != ".keras":
        raise UsageError("must be a .keras file", path)
    if not path.is_file():
        raise UsageError("does not exist" if not path.exists() else "is not a file", path)
    if not zipfile.is_zipfile(path):
        raise UsageError("cannot load it: not a .keras archive (corrupt or another format)", path)
    from keras_mha.quiet_tensorflow import captured_output

    from .convert import import_tensorflow

    import_tensorflow()  # also imports keras_mha, registering its layers
    for name in import_modules:
        try:
            importlib.import_module(name)
        except Exception as error:
            raise UsageError(
                f"cannot import it: {one_line(error)}", f"--import-module {name}"
            ) from None
    import keras

    try:
        with captured_output():
            return keras.saving.load_model(path, compile=False)
    except Exception as error:
        raise _load_error(path, error) from None


def check_model_io(model: keras.Model, where: pathlib.Path, num_classes: int) -> None:
    """What export needs of any model: one input of batch None or 1, `num_classes` outputs."""
    inputs = getattr(model, "inputs", None)
    outputs = getattr(model, "outputs", None)
    if not inputs or not outputs:
        raise UsageError("expected a Functional or Sequential Keras model with known inputs", where)
    if len(inputs) != 1 or len(outputs) != 1:
        raise UsageError(
            f"expected one input and one output, got {len(inputs)} and {len(outputs)}", where
        )
    if inputs[0].shape[0] not in (None, 1):
        raise UsageError(f"input batch size {inputs[0].shape[0]} must be None or 1", where)
    out_shape = tuple(outputs[0].shape)
    if len(out_shape) != 2 or out_shape[1] != num_classes:
        raise UsageError(
            f"output shape {out_shape} does not match eval probs with {num_classes} classes", where
        )


def _vocab_size(model: keras.Model) -> int | None:
    import keras

    embeddings = [layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)]
    return int(embeddings[0].input_dim) if embeddings else None


def load_run_dir(run_dir: pathlib.Path) -> Source:
    """A run directory, read by its task's reader (`keras_mha.rundir.tasks.read_any`),
    which validates every file."""
    from keras_mha.quiet_tensorflow import captured_output

    from .convert import import_tensorflow

    import_tensorflow()
    from keras_mha.rundir.tasks import read_any

    run = read_any(run_dir)  # UsageError, one line, for any file that is not right
    with captured_output():
        model = run.load_model()
    ev = run.eval_data
    check_model_io(model, run.model_file, ev.num_classes)
    vocab = (
        None if run.vocab is None else Vocab.from_json(run.vocab.to_json(), run_dir / "vocab.json")
    )
    if vocab is not None:
        check_text_inputs(vocab, ev.x, run_dir / "vocab.json")
    source = Source(
        files={k: v for k, v in run_files(run_dir).items() if v.exists()},
        model=model,
        calibration=run.calibration,
        eval=ev,
        task=run.task,
        own_files=run.bundle_files(),
        vocab=vocab,
        dataset=run.dataset,
        max_length=run.max_length,
        pad_id=getattr(run, "pad_id", 0),
    )
    return _with_coref(_with_ranges(source, run_dir), run_dir)


def _with_coref(source: Source, run_dir: pathlib.Path) -> Source:
    """RUN_DIR/heads/coref.json's best head (keras-mha-heads coref), if it is this model's."""
    if not source.has_blocks:
        return source
    from keras_mha.heads.coref import read_best_head
    from keras_mha.heads.masks import heads_per_layer

    source.coref_head, source.coref_note = read_best_head(
        run_dir, heads_per_layer(source.model), source.files["model"]
    )
    return source


def _with_ranges(source: Source, run_dir: pathlib.Path) -> Source:
    """The run's ranges.json (keras_mha.qat), checked against its model, if it has one."""
    path = run_dir / "ranges.json"
    if not path.exists():
        return source
    from keras_mha import qat

    try:
        source.ranges = qat.load_ranges(path)
        # names a layer the model lacks: ValueError; a point its graph lacks: unused
        unused = qat.unused_ranges(source.model, source.ranges, source.calibration[:1])
    except ValueError as error:
        raise UsageError(str(error).removeprefix(f"{path}: "), path) from None
    if unused:
        raise UsageError(
            f"{len(unused)} of its {len(source.ranges)} ranges name no point of the "
            f"model's graph (first: {unused[0]!r}); expected the ranges chosen for this "
            "model (the same attention implementation)",
            path,
        )
    return source


def load_files(paths: SourcePaths, import_modules: tuple[str, ...] = ()) -> Source:
    """Explicit files, checked with the run directory's functions against the model."""
    from .convert import import_tensorflow

    import_tensorflow()
    from keras_mha.rundir import EvalSet, check_eval, check_inputs, check_labels

    files = paths.files()
    for role, path in files.items():
        if not path.exists():
            raise UsageError(f"{role} file does not exist", path)
        if not path.is_file():
            raise UsageError(f"{role} file is not a file", path)
    arrays = read_npz(paths.eval, ("x", "y", "probs"))
    calibration = read_npz(paths.calibration, ("x",))["x"]
    check_eval(EvalSet(arrays["x"], arrays["y"], arrays["probs"]), paths.eval)
    num_classes = int(arrays["probs"].shape[1])
    labels = [str(i) for i in range(num_classes)]
    if paths.labels is not None:
        try:
            raw = paths.labels.read_bytes()
        except OSError as error:
            raise UsageError(f"cannot read it ({one_line(error)})", paths.labels) from None
        labels = check_labels(raw, num_classes, paths.labels)  # the device's own parser
    vocab = None if paths.vocab is None else Vocab.load(paths.vocab)
    model = load_keras_file(paths.model, import_modules)
    check_model_io(model, paths.model, num_classes)
    model, note = on_our_layer(model)
    spec = model.inputs[0]
    shape, dtype = tuple(spec.shape[1:]), np.dtype(spec.dtype).name
    vocab_size = _vocab_size(model) if dtype.startswith("int") else None
    for path, x in ((paths.eval, arrays["x"]), (paths.calibration, calibration)):
        check_inputs(x, path, "x", shape=shape, dtype=dtype, vocab_size=vocab_size)
    if vocab is not None:
        check_text_inputs(vocab, arrays["x"], paths.vocab)
    ev = EvalData(arrays["x"], arrays["y"].astype(np.int64), arrays["probs"].astype(np.float32))
    task = get_task(Classification.name)  # explicit files: a classifier's
    own = {"labels": ("labels.json", labels_json(labels))}
    source = Source(files, model, calibration, ev, task, own, vocab, dataset=None)
    source.attention_note = note
    source.user_model = True
    return source


def on_our_layer(model: keras.Model) -> tuple[keras.Model, str | None]:
    """A model on `keras.layers.MultiHeadAttention` (a user's, a keras-hub
    model's), converted to keras_mha's (`keras_mha.convert`), so that the
    bundle can show its attention weights; and a line saying what was done.

    The copy computes the same function: convert checks each replaced layer
    against the original on a random input (equal to 1e-5), and the float32
    model's parity with eval.npz's probs (the original's) checks the whole.
    A model convert refuses is exported as it is, without the attention
    signature, and the line says why. A model with none: unchanged, no line.
    """
    from keras_mha.layer_swap import convert, keras_attention_layers, keras_error_line

    found = keras_attention_layers(model)
    if not found:
        return model, None
    try:
        converted = convert(model)
    except Exception as error:  # a layer convert refuses, or cannot copy
        return model, f"its attention stays Keras's ({one_line(keras_error_line(error))})"
    return converted, (
        f"its {len(found)} keras.layers.MultiHeadAttention converted to keras_mha's "
        "(keras_mha.convert; outputs equal to 1e-5)"
    )


def load_source(
    source: str | os.PathLike | SourcePaths,
    import_modules: tuple[str, ...] = (),
    length: int | None = None,
) -> Source:
    """Read and validate everything an export needs; UsageError if it is not usable.

    `length`: export at that fixed sequence length (`at_length`)."""
    if isinstance(source, SourcePaths):
        loaded = load_files(source, import_modules)
    else:
        loaded = load_run_dir(pathlib.Path(source))
    return loaded if length is None else at_length(loaded, length)


def check_length(length) -> int:
    """`--length L`: an integer >= 2 (a sentence is at least [CLS] [SEP])."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise UsageError(f"must be an integer >= 2, got {length!r}", "--length")
    return length


def at_length(loaded: Source, length: int) -> Source:
    """The source exported at a fixed sequence length `length` (an NPU needs fixed shapes).

    For a model whose input is token ids with a dynamic sequence axis (an
    encoder): eval.npz's and calibration's ids padded with `pad_id` to
    `length` (the device pads a sentence the same way, and the mask makes the
    padding invisible, so the float references hold), the tokenizer's
    `max_length` becomes `length`. Eval sentences longer than `length` are
    refused (their references are of the whole sentence); calibration
    sentences longer than it are left out. A model of fixed shape is refused.
    """
    length = check_length(length)
    if not loaded.task.dynamic_length:
        shape = tuple(loaded.model.inputs[0].shape[1:])
        raise UsageError(
            f"the model's input is already fixed at (1, {', '.join(map(str, shape))}); "
            "--length is for token-id models with a dynamic sequence axis (encoders)",
            "--length",
        )
    if loaded.max_length is not None and length > loaded.max_length:
        raise UsageError(
            f"{length} is longer than the tokenizer's max_length {loaded.max_length}", "--length"
        )
    x = loaded.eval.x
    longest = int(own_lengths(x, loaded.pad_id).max())
    if longest > length:
        raise UsageError(
            f"{length} is shorter than the longest eval sentence ({longest} tokens); "
            f"expected --length >= {longest}",
            "--length",
        )
    calibration = loaded.calibration
    fits = own_lengths(calibration, loaded.pad_id) <= length
    if not fits.any():
        raise UsageError(f"every calibration sentence is longer than {length} tokens", "--length")
    names = _npz_members(loaded.files["eval"])
    arrays = read_npz(loaded.files["eval"], names)
    arrays["x"] = pad_ids(x, length, loaded.pad_id)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return dataclasses.replace(
        loaded,
        calibration=pad_ids(calibration[fits], length, loaded.pad_id),
        eval=dataclasses.replace(loaded.eval, x=arrays["x"]),
        max_length=length,
        length=length,
        eval_bytes=buffer.getvalue(),
    )


def _npz_members(path: pathlib.Path) -> tuple[str, ...]:
    try:
        with zipfile.ZipFile(path) as archive:
            return tuple(name.removesuffix(".npy") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile) as error:
        raise UsageError(f"cannot read it ({one_line(error)})", path) from None
