"""Parity with the float Keras model, and the one threshold check.

`measure(probs, y, reference)` gives a classifier's figures on eval.npz
(the other tasks' own measures sit in their modules, tasks/);
`Thresholds.failures(parity, float_accuracy)` says which thresholds it
misses. Export's verification and the device's run call exactly these, so a
mode export calls verified passes on the device by construction. A NaN (or
infinite) output makes every figure NaN, and NaN misses every threshold.

`default_thresholds(mode, samples)` is what export writes into each entry:
float32 and float16 bound every probability; the quantized modes may change
at most 1 % of the float model's top-1 predictions, judged with the
statistics of the eval set's size (`changes_allowed`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .fields import Fields, lenient_figures

EMBEDDING_FIGURES = ("min_cosine", "mean_cosine", "top1", "top5")
# A language model's figures (tasks/language_model.py, `measure_language`).
LANGUAGE_FIGURES = ("decided_agreement", "perplexity_ratio", "greedy_prefix")
_EPS = 1e-9  # slack when comparing ratios of sample counts: 351/360 meets 0.975


@dataclasses.dataclass(frozen=True)
class Parity:
    """A mode against the float Keras model on eval.npz (NaN when unknown).

    A classifier fills the first four. An embedding model (`task
    "embedding"`) has no labels: `accuracy` is NaN, `agreement` is its
    top-1 nearest-neighbour agreement (below), the |Δ| figures are over the
    vectors' elements, and the cosine and neighbour figures are set.
    """

    accuracy: float
    agreement: float  # top-1 agreement with eval.npz `probs` (embeddings: = top1)
    max_abs_diff: float  # max |Δprob| (embeddings: max |Δ| of an element)
    mean_abs_diff: float
    min_cosine: float = math.nan  # embeddings: cosine of each vector to the float one
    mean_cosine: float = math.nan
    top1: float = math.nan  # share of sentences whose nearest other sentence is the float's
    top5: float = math.nan  # share whose float nearest neighbour is among the mode's 5 nearest
    # A language model (`task "language-model"`): `agreement` is the next-token
    # top-1 agreement over every scored position, the |Δ| figures are over each
    # position's NLL of the eval text's next token, and these are set.
    decided_agreement: float = math.nan  # top-1 agreement where the float model is decided
    perplexity_ratio: float = math.nan  # the mode's eval-text perplexity / the float model's
    greedy_prefix: float = math.nan  # mean share of the float greedy tokens repeated first

    def to_json(self) -> dict:
        data = {k: (v if math.isfinite(v) else None) for k, v in dataclasses.asdict(self).items()}
        for name in (
            EMBEDDING_FIGURES + LANGUAGE_FIGURES
        ):  # a classifier's stays as format 1 wrote it
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: object) -> Parity | None:
        """Lenient: figures are informative, so a malformed entry reads as None."""
        values = lenient_figures(data, [f.name for f in dataclasses.fields(cls)])
        if values is None:
            return None
        return cls(*(math.nan if v is None else float(v) for v in values))


def nearest(vectors: np.ndarray, k: int = 1, block: int = 1024) -> np.ndarray:
    """Each row's `k` nearest other rows by cosine, nearest first: (N, k) indices.

    Ties break by index (a stable sort), so equal inputs give equal answers.
    Computed `block` rows at a time: memory grows with N, not N^2."""
    v = np.asarray(vectors, np.float64)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    n = len(v)
    out = np.empty((n, min(k, max(n - 1, 0))), np.int64)
    for start in range(0, n, block):
        similarity = v[start : start + block] @ v.T
        rows = np.arange(similarity.shape[0])
        similarity[rows, rows + start] = -np.inf  # a sentence is not its own neighbour
        out[start : start + block] = np.argsort(-similarity, axis=1, kind="stable")[
            :, : out.shape[1]
        ]
    return out


def measure(probs: np.ndarray, y: np.ndarray | None, reference: np.ndarray) -> Parity:
    """Figures of `probs (N, C)` against labels `y (N,)` and the float model's `reference`
    (`y` None: no labels, accuracy NaN; a classifier imported without its data)."""
    probs = np.asarray(probs, np.float64)
    if not np.isfinite(probs).all():
        return Parity(math.nan, math.nan, math.nan, math.nan)
    diff = np.abs(probs - np.asarray(reference, np.float64))
    top = probs.argmax(-1)
    return Parity(
        accuracy=math.nan if y is None else float((top == y).mean()),
        agreement=float((top == np.asarray(reference).argmax(-1)).mean()),
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
    )


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """What a mode must meet against eval.npz; a None field is not checked.

    `max_accuracy_drop` bounds `eval.float_accuracy - accuracy`.
    """

    max_abs_diff: float | None = None
    min_agreement: float | None = None
    max_accuracy_drop: float | None = None
    min_cosine: float | None = None  # embeddings (`measure_embeddings`)
    min_mean_cosine: float | None = None
    min_top5: float | None = None
    min_decided_agreement: float | None = None  # a language model's (`measure_language`)
    max_perplexity_ratio: float | None = None
    min_greedy_prefix: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str, prefix: str = "") -> Thresholds:
        return cls(**fields.numbers(data, key, [f.name for f in dataclasses.fields(cls)], prefix))

    def failures(self, parity: Parity, float_accuracy: float) -> list[str]:
        """The thresholds `parity` misses, one readable line each; NaN misses every one."""
        found = []
        if self.max_abs_diff is not None and not parity.max_abs_diff <= self.max_abs_diff:
            found.append(f"max |Δprob| {parity.max_abs_diff:.3g} > {self.max_abs_diff:.3g}")
        if self.min_agreement is not None and not parity.agreement >= self.min_agreement - _EPS:
            found.append(f"agreement {parity.agreement:.4f} < {self.min_agreement:.4f}")
        if self.max_accuracy_drop is not None:
            drop = float_accuracy - parity.accuracy
            if not drop <= self.max_accuracy_drop + _EPS:
                found.append(
                    f"accuracy {parity.accuracy:.4f} is {drop:.4f} below the float "
                    f"{float_accuracy:.4f} (> {self.max_accuracy_drop:.4f})"
                )
        for name, value, label, fmt in (
            ("min_cosine", parity.min_cosine, "min cosine", ".6f"),
            ("min_mean_cosine", parity.mean_cosine, "mean cosine", ".6f"),
            ("min_top5", parity.top5, "top-5 neighbour agreement", ".6f"),
            ("min_decided_agreement", parity.decided_agreement, "decided next-token agreement",
             ".4f"),
            ("min_greedy_prefix", parity.greedy_prefix, "greedy prefix", ".4f"),
        ):  # fmt: skip
            bound = getattr(self, name)
            if bound is not None and not value >= bound - _EPS:
                found.append(f"{label} {format(value, fmt)} < {format(bound, fmt)}")
        ratio = self.max_perplexity_ratio
        if ratio is not None and not parity.perplexity_ratio <= ratio + _EPS:
            found.append(f"perplexity ratio {parity.perplexity_ratio:.5f} > {ratio:.5f}")
        return found

    def describe(self) -> str:
        """A short table cell: `agree≥0.975, drop≤0.025`."""
        # Four significant digits: 1,500 samples allow 25 changes, 0.983333.
        cells = (("|Δp|≤", self.max_abs_diff, ".0e"), ("agree≥", self.min_agreement, ".4g"),
                 ("drop≤", self.max_accuracy_drop, ".4g"), ("cos≥", self.min_cosine, ".6g"),
                 ("mean cos≥", self.min_mean_cosine, ".6g"), ("top5≥", self.min_top5, ".4g"),
                 ("decided≥", self.min_decided_agreement, ".4g"),
                 ("ppl×≤", self.max_perplexity_ratio, ".4g"),
                 ("greedy≥", self.min_greedy_prefix, ".4g"))  # fmt: skip
        parts = [f"{label}{format(bound, fmt)}" for label, bound, fmt in cells if bound is not None]
        return ", ".join(parts)


# What export writes into each mode's `thresholds` (docs/artifacts.md).
# The float modes are bounded elementwise; the quantized modes by how many of
# the float model's top-1 predictions they change (`quantized_thresholds`).
FLOAT_THRESHOLDS: dict[str, Thresholds] = {
    "float32": Thresholds(max_abs_diff=1e-5),
    "float16": Thresholds(max_abs_diff=1e-2),
}
QUANTIZED_MODES = ("dynamic", "int8", "int16x8")
# A quantized mode may change at most 1 % of the float model's predictions:
# MLPerf Inference's quality target for a quantized model is 99 % of the
# float model's accuracy. eval.npz holds a few hundred samples, too few to
# tell a 0.3 % rate from a 1 % one, so the check fails a mode only when it
# changes more predictions than a 1 % rate gives by chance in 99 of 100 runs.
CHANGE_RATE = 0.01
FALSE_ALARM = 0.01


def changes_allowed(
    samples: int, rate: float = CHANGE_RATE, false_alarm: float = FALSE_ALARM
) -> int:
    """The smallest k with P(Binomial(samples, rate) > k) <= false_alarm.

    A mode changing `rate` of all predictions changes more than k of
    `samples` with probability at most `false_alarm`. 360 samples: k = 9.
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if not 0 < rate < 1 or not 0 < false_alarm < 1:
        raise ValueError(f"rate and false_alarm must be in (0, 1), got {rate}, {false_alarm}")
    log_p, log_q = math.log(rate), math.log1p(-rate)
    cumulative = 0.0
    for k in range(samples + 1):  # pmf in log space: no overflow for large `samples`
        log_pmf = (
            math.lgamma(samples + 1)
            - math.lgamma(k + 1)
            - math.lgamma(samples - k + 1)
            + k * log_p
            + (samples - k) * log_q
        )
        cumulative += math.exp(log_pmf)
        if cumulative >= 1 - false_alarm:
            return k
    return samples


def quantized_thresholds(samples: int) -> Thresholds:
    """At most `changes_allowed(samples)` changed predictions, and no larger accuracy drop.

    A drop of d in accuracy takes at least d * samples changed predictions,
    so both bounds count the same allowance. 360 samples: agreement >= 0.975,
    drop <= 0.025.
    """
    allowed = changes_allowed(samples)
    return Thresholds(
        min_agreement=(samples - allowed) / samples,
        max_accuracy_drop=allowed / samples,
    )


def default_thresholds(mode: str, samples: int) -> Thresholds:
    """The thresholds export writes for a classifier's `mode` verified on `samples` eval samples."""
    if mode in FLOAT_THRESHOLDS:
        return FLOAT_THRESHOLDS[mode]
    if mode in QUANTIZED_MODES:
        return quantized_thresholds(samples)
    raise ValueError(f"unknown mode {mode!r}")
