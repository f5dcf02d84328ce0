"""Quantization-aware Keras 3 models: int8's rounding simulated where TFLite rounds.

A full-integer TFLite model stores every tensor between two ops as int8,
x ~ scale * (q - zero_point) with q in [-128, 127], one (scale, zero_point)
per tensor from a range [lo, hi] chosen at conversion. Our layers name the
tensors that matter with `point(layer, name, x)`: the projections' outputs,
the attention scores and weights, the heads, each residual sum, the FFN's
hidden units, each LayerNorm's steps. `point` returns x unchanged unless a
hook is attached to the layer, so a model without hooks is the float model,
on every backend:

- `record(model)`: a `Recorder` keeps a sample of each point's values
  (calibration, eager calls);
- `choose_ranges(recorder, rule)`: a range per point, by min/max, a
  percentile or the smallest squared error after rounding ("mse");
- `attach(model, ranges)`: each point rounds to its range with
  `keras.quantizers.fake_quant_with_min_max_vars` (a straight-through
  gradient on JAX and PyTorch, TensorFlow's FakeQuant op on TensorFlow).
  Trained so (`keras_mha.qat.train`), the weights learn to live with the
  steps; written to a SavedModel so, the TFLite converter takes each
  point's range as that tensor's int8 range and calibrates the others.

The ranges are plain numbers keyed by `layer.path + "/" + name` (ranges.json
in a run directory, `save_ranges`/`load_ranges`), not variables: the saved
model stays the float model and the hooks are reattached for training and
for the int8 export.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np

__all__ = [
    "RULES",
    "Recorder",
    "attach",
    "choose_ranges",
    "detach",
    "load_ranges",
    "point",
    "ranges_json",
    "record",
    "save_ranges",
    "unused_ranges",
]

RULES = ("minmax", "percentile", "mse")
HOOK = "_int8_hook"  # the attribute `point` looks for (set outside Keras's tracking)
LEVELS = 255  # 8 bits, full range: TFLite's int8 activations
# The softmax's int8 output is fixed by TFLite: scale 1/256, zero point -128.
SOFTMAX_RANGE = (0.0, 255.0 / 256.0)
_SOFTMAX_OUTPUT = re.compile(r"weights(_\d+)?")  # all heads', or head i's (the lesson's path)
_PER_CALL = 4096  # values sampled per call and point, besides the largest 1 %


def point(layer, name: str, x, head: int | None = None):
    """x as the int8 model will hold it: unchanged unless a hook is attached to `layer`.

    `head`: x is that head's own tensor, the point `{name}_{head}` (the
    lesson's per-head path: `scores_0`, `query_1`, ...); None, the point `name`.
    """
    hook = layer.__dict__.get(HOOK)
    if hook is None:
        return x
    return hook(f"{layer.path}/{name}" + ("" if head is None else f"_{head}"), x)


def _layers(model) -> list:
    """Every layer that may call `point` (ours: they import this module)."""
    return [
        layer
        for layer in model._flatten_layers(include_self=True, recursive=True)
        if type(layer).__module__.startswith("keras_mha.")
    ]


def _forget_traces(model) -> None:
    """Drop the functions `fit`, `evaluate` and `predict` traced and keep: they
    were traced with or without the hooks."""
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, None)


def _set_hook(model, hook) -> None:
    for layer in _layers(model):
        object.__setattr__(layer, HOOK, hook)  # not a tracked attribute
    _forget_traces(model)


def detach(model) -> None:
    """The float model again: every `point` returns its input."""
    for layer in _layers(model):
        layer.__dict__.pop(HOOK, None)
    _forget_traces(model)


class Recorder:
    """Keeps each point's exact min and max and a weighted sample of its values:
    the largest 1 % (by magnitude) of each call's values all kept, the rest a
    uniform sample standing for all of them (so a range chosen by error sees
    the tail as often as it occurs)."""

    def __init__(self, seed: int = 0):
        self.low: dict[str, float] = {}
        self.high: dict[str, float] = {}
        self.samples: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._rng = np.random.default_rng(seed)

    def __call__(self, key: str, x):
        import keras  # here: layers.py imports this module while keras registers them

        values = np.asarray(keras.ops.convert_to_numpy(x), dtype="float32").ravel()
        if values.size == 0:
            return x
        self.low[key] = min(self.low.get(key, np.inf), float(values.min()))
        self.high[key] = max(self.high.get(key, -np.inf), float(values.max()))
        weights = np.ones_like(values)
        if values.size > _PER_CALL:
            order = np.argsort(np.abs(values))
            tail, rest = order[-values.size // 100 :], order[: -values.size // 100]
            kept = self._rng.choice(rest, _PER_CALL, replace=False)
            weights = np.concatenate(
                [np.ones(tail.size), np.full(_PER_CALL, rest.size / _PER_CALL)]
            )
            values = np.concatenate([values[tail], values[kept]])
        self.samples.setdefault(key, []).append((values, weights.astype("float32")))
        return x

    def values(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, weights): what `key` saw, each value standing for `weight` of them."""
        parts = self.samples[key]
        return np.concatenate([v for v, _ in parts]), np.concatenate([w for _, w in parts])


class _Calls:
    """A hook that keeps what each point saw, in the order the points ran."""

    def __init__(self):
        self.seen: list[tuple[str, np.ndarray]] = []

    def __call__(self, key: str, x):
        import keras

        self.seen.append((key, np.asarray(keras.ops.convert_to_numpy(x), dtype="float32")))
        return x


RECORD_BATCH = 64  # rows a call when every input has one length


def record(model, inputs, *, lengths=None, seed: int = 0) -> Recorder:
    """Run `model` eagerly on the inputs and keep what every point saw, as if
    each ran alone (batch 1; token ids cut to `lengths`).

    Inputs of one length (`lengths` None) run RECORD_BATCH rows a call, and
    the recorder is then given each row's values, row by row and in the
    order the points ran, as a call of its own would have given them: the
    same sample from the same seed, a batch's rounding aside. The pronouns
    model's 256 calibration rows, per head: 24.6 CPU-s one row a call, 0.8
    so, and the same ranges to the bit (Intel Xeon).
    """
    recorder = Recorder(seed)
    try:
        if lengths is None:
            calls = _Calls()
            _set_hook(model, calls)
            for start in range(0, len(inputs), RECORD_BATCH):
                batch = np.asarray(inputs[start : start + RECORD_BATCH])
                calls.seen.clear()
                model(batch, training=False)
                for key, values in calls.seen:
                    if values.shape[:1] != batch.shape[:1]:
                        raise ValueError(
                            f"Expected the point {key!r} to hold one row per input; "
                            f"got shape {values.shape} for {len(batch)} inputs."
                        )
                for row in range(len(batch)):
                    for key, values in calls.seen:
                        recorder(key, values[row : row + 1])
        else:
            _set_hook(model, recorder)
            for i, x in enumerate(inputs):
                model(x[None, : int(lengths[i])], training=False)
    finally:
        detach(model)
    if not recorder.low:
        raise ValueError(
            "The model has no quantization points: it needs keras_mha's "
            "MultiHeadAttention, TransformerEncoderBlock or LayerNorm."
        )
    return recorder


def nudge(low: float, high: float) -> tuple[float, float]:
    """The range TensorFlow's FakeQuant (and so TFLite) uses: 0 exactly on the grid."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if high - low < 1e-12:
        return 0.0, 1e-6 * LEVELS
    scale = (high - low) / LEVELS
    zero = float(np.clip(np.round(-low / scale), 0, LEVELS))
    return -zero * scale, (LEVELS - zero) * scale


def rounded(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """`values` clamped to the nudged [low, high] and rounded to its 256 steps."""
    low, high = nudge(low, high)
    scale = (high - low) / LEVELS
    return np.round((np.clip(values, low, high) - low) / scale) * scale + low


def _mse_range(values, weights, low: float, high: float) -> tuple[float, float]:
    """The clipped range (c * low, c * high) with the smallest squared rounding error."""
    best, best_error = (low, high), np.inf
    for c in np.geomspace(0.05, 1.0, 60):
        error = float(
            np.average((rounded(values, c * low, c * high) - values) ** 2, weights=weights)
        )
        if error < best_error:
            best, best_error = (c * low, c * high), error
    return best


def _weighted_percentiles(values, weights, percents) -> list[float]:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order]) / np.sum(weights)
    return [float(values[order][np.searchsorted(cumulative, q / 100)]) for q in percents]


def choose_ranges(recorder: Recorder, rule: str = "mse", percentile: float = 99.99) -> dict:
    """{point: (low, high)}, by `rule`: "minmax" (what the converter does),
    "percentile" (of the values seen) or "mse"; the softmax's points keep
    TFLite's fixed output range."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, not {rule!r}")
    ranges = {}
    for key in sorted(recorder.low):
        low, high = recorder.low[key], recorder.high[key]
        if _SOFTMAX_OUTPUT.fullmatch(key.rsplit("/", 1)[-1]):  # fixed by TFLite
            ranges[key] = SOFTMAX_RANGE
            continue
        if rule == "percentile":
            low, high = _weighted_percentiles(*recorder.values(key), (100 - percentile, percentile))
        elif rule == "mse":
            low, high = _mse_range(*recorder.values(key), low, high)
        ranges[key] = nudge(low, high)
    return ranges


class _Rounder:
    def __init__(self, ranges: dict):
        self.ranges = {key: (float(lo), float(hi)) for key, (lo, hi) in ranges.items()}
        self.used: set[str] = set()

    def __call__(self, key: str, x):
        found = self.ranges.get(key)
        if found is None:
            return x
        self.used.add(key)
        import keras

        return keras.quantizers.fake_quant_with_min_max_vars(x, found[0], found[1], num_bits=8)


def attach(model, ranges: dict) -> None:
    """Make every point of `model` round to its range in `ranges` (from
    `choose_ranges` or `load_ranges`); points without one stay float."""
    _set_hook(model, _rounder_for(model, ranges))


def _rounder_for(model, ranges: dict) -> _Rounder:
    """The hook that rounds to `ranges`; ValueError if a key names no layer of `model`."""
    known = {f"{layer.path}/" for layer in _layers(model)}
    stray = sorted(key for key in ranges if key.rsplit("/", 1)[0] + "/" not in known)
    if stray:
        raise ValueError(
            f"{len(stray)} ranges name no layer of this model (first: {stray[0]!r}); "
            "expected the ranges chosen for this model"
        )
    return _Rounder(ranges)


def unused_ranges(model, ranges: dict, x) -> list[str]:
    """The keys of `ranges` no point of `model` rounds on input `x` (one call),
    sorted: ranges chosen for another graph (the fused attention's for the
    per-head one, or the other way round) name points this one lacks."""
    rounder = _rounder_for(model, ranges)  # a key naming no layer of the model: ValueError
    _set_hook(model, rounder)
    try:
        model(x, training=False)
    finally:
        detach(model)
    return sorted(set(ranges) - rounder.used)


def ranges_json(ranges: dict, **meta) -> bytes:
    """ranges.json's bytes: {...meta, "ranges": {point: [low, high]}}."""
    body = {**meta, "ranges": {k: [float(lo), float(hi)] for k, (lo, hi) in ranges.items()}}
    return (json.dumps(body, indent=1) + "\n").encode("utf-8")


def save_ranges(ranges: dict, path: str | os.PathLike, **meta) -> None:
    """`ranges_json` written to `path` atomically."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(ranges_json(ranges, **meta))
    os.replace(tmp, path)


def load_ranges(path: str | os.PathLike) -> dict:
    """The ranges of a ranges.json; ValueError naming what is wrong."""
    try:
        body = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
        ranges = body["ranges"]
        out = {}
        for key, pair in ranges.items():
            low, high = (float(v) for v in pair)
            if not (np.isfinite(low) and np.isfinite(high) and low <= 0.0 <= high < np.inf):
                raise ValueError(f"range of {key!r} is [{low}, {high}]")
            out[str(key)] = (low, high)
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(
            f"{path}: not a ranges file ({error}); expected "
            '{"ranges": {point: [low <= 0, high >= 0]}}'
        ) from None
    return out
