"""Run an exported model over eval.npz and compare it with the float Keras model.

The interpreter is LiteRT's (`ai_edge_litert`). TF 2.21's own
`tf.lite.Interpreter` with its default XNNPACK delegate computes wrong int8
results for these models (FIELD_NOTES.md); without LiteRT we fall back to it
with `BUILTIN_WITHOUT_DEFAULT_DELEGATES`, which is correct but slower.

Every sample goes through as a batch of 1, quantized with the input tensor's
own `(scale, zero_point)` and dequantized with the output tensor's, exactly as
docs/artifacts.md tells the edge demo to do.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Per docs/artifacts.md: what each mode must meet against eval.npz `probs`.
THRESHOLDS: dict[str, dict[str, float]] = {
    "float32": {"max_abs_diff": 1e-5},
    "float16": {"max_abs_diff": 1e-2},
    "dynamic": {"min_agreement": 0.995, "max_accuracy_drop": 0.005},
    "int8": {"min_agreement": 0.995, "max_accuracy_drop": 0.005},
    "int16x8": {"min_agreement": 0.995, "max_accuracy_drop": 0.005},
}
# Figures are compared with this slack, so that 199/200 meets 0.995.
_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Name, shape, dtype and (scale, zero_point) of a model input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: float | None
    zero_point: int | None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale": self.scale,
            "zero_point": self.zero_point,
        }


def _spec(detail: dict) -> TensorSpec:
    scale, zero_point = detail["quantization"]
    dtype = np.dtype(detail["dtype"]).name
    quantized = bool(scale) and not dtype.startswith("float")
    return TensorSpec(
        name=str(detail["name"]),
        shape=tuple(int(d) for d in detail["shape"]),
        dtype=dtype,
        scale=float(scale) if quantized else None,
        zero_point=int(zero_point) if quantized else None,
    )


def quantize(x: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """`round(x / scale) + zero_point`, clipped to the dtype (round half away from 0)."""
    dtype = np.dtype(spec.dtype)
    if spec.scale is None:
        return np.asarray(x).astype(dtype)
    scaled = np.asarray(x, dtype=np.float64) / spec.scale
    q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + spec.zero_point
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """`(q - zero_point) * scale` as float32 (float tensors pass through)."""
    if spec.scale is None:
        return np.asarray(q, dtype=np.float32)
    return ((np.asarray(q, dtype=np.float64) - spec.zero_point) * spec.scale).astype(np.float32)


def make_interpreter(model: bytes):
    """(interpreter, runtime name) for `model`: LiteRT, else TF without delegates."""
    from .convert import captured_output

    with captured_output():  # "INFO: Created TensorFlow Lite XNNPACK delegate"
        try:
            from ai_edge_litert.interpreter import Interpreter

            interpreter, runtime = Interpreter(model_content=model, num_threads=1), "ai-edge-litert"
        except ImportError:
            import tensorflow as tf

            interpreter = tf.lite.Interpreter(
                model_content=model,
                num_threads=1,
                experimental_op_resolver_type=(
                    tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                ),
            )
            runtime = "tensorflow-builtin-without-default-delegates"
        interpreter.allocate_tensors()
    return interpreter, runtime


def run_model(model: bytes, x: np.ndarray) -> tuple[np.ndarray, TensorSpec, TensorSpec, str]:
    """Outputs of `model` for every row of `x`, one at a time.

    Returns `(outputs (N, C) float32, input spec, output spec, runtime name)`.
    """
    interpreter, runtime = make_interpreter(model)
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"expected one input and one output, got {len(inputs)} and {len(outputs)}")
    in_spec, out_spec = _spec(inputs[0]), _spec(outputs[0])
    in_index, out_index = inputs[0]["index"], outputs[0]["index"]
    results = []
    for row in x:
        interpreter.set_tensor(in_index, quantize(row[None], in_spec))
        interpreter.invoke()
        results.append(dequantize(interpreter.get_tensor(out_index)[0], out_spec))
    return np.stack(results), in_spec, out_spec, runtime


def parity(probs: np.ndarray, reference: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, top-1 agreement with the reference, max and mean |Δprob|."""
    diff = np.abs(probs.astype(np.float64) - reference.astype(np.float64))
    top = probs.argmax(-1)
    return {
        "accuracy": float((top == labels).mean()),
        "agreement": float((top == reference.argmax(-1)).mean()),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
    }


def failures(
    figures: dict[str, float], thresholds: dict[str, float], float_accuracy: float
) -> list[str]:
    """Why `figures` miss `thresholds` (empty when they meet them)."""
    reasons = []
    if "max_abs_diff" in thresholds and figures["max_abs_diff"] > thresholds["max_abs_diff"] + _EPS:
        reasons.append(
            f"max |Δprob| {figures['max_abs_diff']:.3g} > {thresholds['max_abs_diff']:g}"
        )
    if "min_agreement" in thresholds and figures["agreement"] < thresholds["min_agreement"] - _EPS:
        reasons.append(
            f"top-1 agreement {figures['agreement']:.4f} < {thresholds['min_agreement']:g}"
        )
    if "max_accuracy_drop" in thresholds:
        drop = float_accuracy - figures["accuracy"]
        if drop > thresholds["max_accuracy_drop"] + _EPS:
            reasons.append(
                f"accuracy drop {drop * 100:.2f} points > {thresholds['max_accuracy_drop'] * 100:g}"
            )
    return reasons
