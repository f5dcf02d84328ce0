"""The one model wrapper every caller runs through: `EdgeModel`.

The device's parity run, `--sample`, `--text`, `--view`, export's
verification and the benchmarks all go through it. Inputs are quantized and
outputs dequantized with the interpreter's own `TensorSpec`; `run` is the
one sample-by-sample loop. A model the runtime cannot load, or whose tensors
differ from its manifest entry, is a `UsageError` naming the file; a failure
while running a loaded model is an `InferenceError`.
"""

from __future__ import annotations

import os
import time

import numpy as np

from bundle_contract.arrays import own_lengths, pad_ids
from bundle_contract.entries import ModelEntry, Signature
from bundle_contract.errors import UsageError
from bundle_contract.tensors import TensorSpec

from .runtime import Runtime, load_interpreter


class InferenceError(Exception):
    """The runtime failed while running a model it had loaded (a model problem)."""


def manifest_mismatch(where: str | os.PathLike, entry: ModelEntry, inputs, outputs) -> None:
    """Raise UsageError unless the model has one input and one output as `entry` says."""
    if len(inputs) != 1 or len(outputs) != 1:
        raise UsageError(
            f"expected 1 input and 1 output tensor, found {len(inputs)} and {len(outputs)}",
            where,
        )
    for role, actual, expected in (
        ("input", inputs[0], entry.input),
        ("output", outputs[0], entry.output),
    ):
        found = actual.differences(expected)
        if found:
            raise UsageError(
                f"{role} tensor differs from manifest.json: {'; '.join(found)} (model vs manifest)",
                where,
            )


def fit_length(x: np.ndarray, spec: TensorSpec, pad_id: int) -> np.ndarray:
    """Token ids `(N, T)` for a fixed-length token-id input `spec` of shape `(1, L)`.

    A bundle exported at a fixed length (keras-mha-export --length L, for an
    NPU) takes every sentence padded with `pad_id` to L; the model masks the
    padding, so the output is the sentence's own. Rows wider than L lose
    trailing padding only: a sentence of more than L tokens is a UsageError
    (the tokenizer's max_length is L in such a bundle, so it cuts them first).
    Anything else (images, a dynamic axis, quantized inputs) is returned as is.
    """
    x = np.asarray(x)
    dtype = np.dtype(spec.dtype)
    if x.ndim != 2 or len(spec.shape) != 2 or spec.quantized or dtype.kind not in "iu":
        return x
    length, width = int(spec.shape[1]), x.shape[1]
    if width == length or length <= 0:
        return x
    longest = int(own_lengths(x, pad_id).max()) if x.shape[0] else 0
    if longest > length:
        raise UsageError(
            f"a sentence of {longest} tokens; this model takes at most {length} "
            "(exported at a fixed length)"
        )
    return pad_ids(x, length, pad_id)


def _pad_to(value: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A raw output of one sentence at its own length, padded to `spec`'s shape
    (without the batch) with the value that dequantizes to 0."""
    shape = tuple(spec.shape[1:])
    if value.shape == shape or len(shape) != value.ndim:
        return value
    fill = spec.zero_point if spec.quantized else 0
    out = np.full(shape, fill, value.dtype)
    out[tuple(slice(0, n) for n in value.shape)] = value
    return out


class EdgeModel:
    """One TFLite model in a runtime, at batch 1, with its quantization handled.

    Args:
        runtime: from `select_runtime` (or any `Runtime`).
        content: the model's bytes (already checked by `bundle.read_model`).
        threads: the interpreter's `num_threads`.
        where: the model file, for messages.

    Raises:
        UsageError: the runtime cannot load the model.
    """

    def __init__(
        self,
        runtime: Runtime,
        content: bytes,
        threads: int = 1,
        where: str = "model",
        pad_id: int = 0,
    ):
        self.runtime = runtime
        self.pad_id = int(pad_id)  # what pads a row: a dynamic-length model runs it cut off
        self.where = where
        interpreter, _, self.load_ms = load_interpreter(
            runtime, content, threads, where, lambda made: made.allocate_tensors()
        )
        self.interpreter = interpreter
        details = interpreter.get_input_details(), interpreter.get_output_details()
        self.inputs = tuple(TensorSpec.from_detail(d) for d in details[0])
        self.outputs = tuple(TensorSpec.from_detail(d) for d in details[1])
        self._indices = (
            tuple(int(d["index"]) for d in details[0]),
            tuple(int(d["index"]) for d in details[1]),
        )
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            raise UsageError(
                f"expected 1 input and 1 output tensor, found {len(self.inputs)} and "
                f"{len(self.outputs)}",
                where,
            )
        self.input, self.output = self.inputs[0], self.outputs[0]
        self.signatures: dict[str, Signature] = {}  # from check_manifest
        # A dynamic sequence axis (shape_signature [1, -1]): resized per sample.
        signature = details[0][0].get("shape_signature")
        self.dynamic_length = signature is not None and len(signature) == 2 and signature[1] == -1
        self._length = None  # the length the input is allocated for

    def check_manifest(self, entry: ModelEntry) -> None:
        """Raise UsageError if the model's tensors differ from its manifest entry.

        Also keeps the entry's `signatures` for `run_signature`.
        """
        if entry.dynamic_length != self.dynamic_length:
            raise UsageError(
                f"input sequence axis is {'dynamic' if self.dynamic_length else 'fixed'}; "
                f"manifest.json says dynamic_length={entry.dynamic_length}",
                self.where,
            )
        if self.dynamic_length:  # described at the longest length the bundle uses
            self._resize(entry.input.shape[1])
        manifest_mismatch(self.where, entry, self.inputs, self.outputs)
        self.signatures = dict(entry.signatures)

    def _resize(self, length: int) -> None:
        """Resize a dynamic input to `(1, length)` and re-plan the arena."""
        if length == self._length:
            return
        interpreter = self.interpreter
        index = self._indices[0][0]
        try:
            interpreter.resize_tensor_input(index, [1, int(length)])
            interpreter.allocate_tensors()
        except (RuntimeError, ValueError) as exc:
            raise InferenceError(f"{self.runtime.name} cannot resize to {length}: {exc}") from None
        self._length = int(length)
        self.inputs = (TensorSpec.from_detail(interpreter.get_input_details()[0]),)
        self.outputs = (TensorSpec.from_detail(interpreter.get_output_details()[0]),)
        self.input, self.output = self.inputs[0], self.outputs[0]

    own_lengths = staticmethod(own_lengths)  # bundle_contract/arrays.py

    def run_signature(
        self, name: str, x: np.ndarray, signature: Signature | None = None
    ) -> dict[str, np.ndarray]:
        """Samples `(N, ...)` through signature `name`, one at a time: output -> float32 `(N, ...)`.

        Inputs are quantized and outputs dequantized with the manifest's
        `TensorSpec`s (`signature`, default the entry given to `check_manifest`),
        checked against the runner's own. Raises UsageError if the model has
        no such signature or it differs from the manifest, InferenceError if
        the runtime cannot run it (tflite-runtime 2.14 and some modes).
        """
        signature = signature or self.signatures.get(name)
        if signature is None:
            raise UsageError(f"manifest.json describes no signature {name!r}", self.where)
        if len(signature.inputs) != 1:
            raise UsageError(f"signature {name!r} must have one input", self.where)
        ((input_name, input_spec),) = signature.inputs.items()
        try:
            if name not in self.interpreter.get_signature_list():
                raise UsageError(f"the model has no signature {name!r}", self.where)
            runner = self.interpreter.get_signature_runner(name)
            if self.dynamic_length:  # its tensors are described at the manifest's width
                runner(**{input_name: np.zeros(input_spec.shape, input_spec.dtype)})
            details = runner.get_input_details(), runner.get_output_details()
        except (RuntimeError, ValueError, AttributeError) as exc:
            raise InferenceError(
                f"{self.runtime.name} cannot run signature {name!r}: {exc}"
            ) from None
        for side, specs, found in (
            ("input", signature.inputs, details[0]),
            ("output", signature.outputs, details[1]),
        ):
            if set(specs) != set(found):
                raise UsageError(
                    f"signature {name!r} has {side}s {sorted(found)}, manifest.json says {sorted(specs)}",
                    self.where,
                )
            for key, spec in specs.items():
                problems = TensorSpec.from_detail(found[key]).differences(spec)
                if problems:
                    raise UsageError(
                        f"signature {name!r} {side} {key} differs from manifest.json: "
                        f"{'; '.join(problems)} (model vs manifest)",
                        self.where,
                    )
        try:
            prepared = input_spec.quantize(fit_length(x, input_spec, self.pad_id))
        except ValueError as exc:
            raise UsageError(str(exc), self.where) from None
        # A dynamic-length model runs each sentence at its own length, grouped by
        # length, as `run` does (calibration never saw padding, so a padded row is
        # not what it was made for); each output is padded back to the described
        # shape with its zero and kept in the bundle's order.
        n = prepared.shape[0]
        lengths = self.own_lengths(prepared, self.pad_id) if self.dynamic_length else None
        order = range(n) if lengths is None else np.argsort(lengths, kind="stable").tolist()
        raw = {key: [None] * n for key in signature.outputs}
        i = 0
        try:
            for i in order:
                row = prepared[i : i + 1] if lengths is None else prepared[i : i + 1, : lengths[i]]
                out = runner(**{input_name: row})
                for key in raw:
                    value = np.array(out[key][0])
                    if lengths is not None:
                        value = _pad_to(value, signature.outputs[key])
                    raw[key][i] = value
        except (RuntimeError, ValueError, KeyError) as exc:
            raise InferenceError(
                f"{self.runtime.name} failed on sample {i} of signature {name!r}: {exc}"
            ) from None
        return {key: signature.outputs[key].dequantize(np.stack(v)) for key, v in raw.items()}

    def prepare(self, x: np.ndarray) -> np.ndarray:
        """Samples `(N, ...)` as the input tensor takes them (quantized if it is)."""
        try:
            return self.input.quantize(fit_length(x, self.input, self.pad_id))
        except ValueError as exc:
            raise UsageError(str(exc), self.where) from None

    def finish(self, raw: np.ndarray) -> np.ndarray:
        """Raw outputs -> float32 probabilities (dequantized if quantized)."""
        return self.output.dequantize(raw)

    def run(
        self, prepared: np.ndarray, repeat: int = 1, progress=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Invoke once per sample, `repeat` passes; time set_tensor + invoke + get_tensor.

        Returns the first pass's raw outputs `(N, C)` and every latency in ns.
        `progress(done, repeat, seconds)` is called after each pass (None: not).
        Raises InferenceError if the runtime fails on a sample.
        """
        interpreter = self.interpreter
        set_tensor, invoke, get_tensor = (
            interpreter.set_tensor,
            interpreter.invoke,
            interpreter.get_tensor,
        )
        (in_index,), (out_index,) = self._indices
        n = prepared.shape[0]
        outputs = np.empty((n, *self.output.shape[1:]), self.output.dtype)
        latencies = np.empty(n * repeat, np.int64)
        clock = time.perf_counter_ns
        # A dynamic-length model runs each sentence at its own length, the
        # samples grouped by length (the bundle's order within a group): the
        # interpreter re-plans its arena once per length, not at nearly every
        # sample (a reranker's 600 pairs: half the time; the outputs are the
        # same in any order). A resize is timed with the sample it precedes.
        lengths = self.own_lengths(prepared, self.pad_id) if self.dynamic_length else None
        order = range(n) if lengths is None else np.argsort(lengths, kind="stable").tolist()
        resize = self._resize
        i, began = 0, clock()
        try:
            i = k = order[0] if n else 0  # the first sample the loop runs (errors name it)
            first = prepared[k : k + 1]
            if lengths is not None:
                resize(int(lengths[k]))
                first = first[:, : lengths[k]]
            set_tensor(in_index, first)  # warm-up: the first invoke plans memory
            invoke()
            for r in range(repeat):
                for i in order:
                    row = prepared[i : i + 1]
                    start = clock()
                    if lengths is not None:
                        resize(int(lengths[i]))
                        row = row[:, : lengths[i]]
                    set_tensor(in_index, row)
                    invoke()
                    out = get_tensor(out_index)
                    latencies[r * n + i] = clock() - start
                    if r == 0:
                        outputs[i] = out[0]
                if progress is not None:
                    progress(r + 1, repeat, (clock() - began) / 1e9)
        except (RuntimeError, ValueError) as exc:
            raise InferenceError(f"{self.runtime.name} failed on sample {i}: {exc}") from None
        return outputs, latencies

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Float32 probabilities `(N, C)` for samples `(N, ...)`, one at a time."""
        raw, _ = self.run(self.prepare(x))
        return self.finish(raw)

    def close(self) -> None:
        """Drop the interpreter (frees its arena before the next mode loads)."""
        self.interpreter = None
