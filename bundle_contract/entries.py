"""A manifest's entries: `EvalSpec` (eval.npz), `FileRef` (labels, vocab, the source
model) and per mode `ModelEntry` (one model file), `Signature`, `ModeFailure`.

Part of manifest.json's format (manifest.py reads and writes the whole).
Fields the device relies on are validated with dotted-field messages; the
exporter's fields for people (`checks`, `failures`, `weights`, ...) are read
leniently.
"""

from __future__ import annotations

import dataclasses

from .attention import AttentionCheck, output_name
from .deploy import DeployFile, micro_json
from .errors import safe
from .fields import Fields, kind
from .files import MAX_FILE_BYTES
from .npu import NpuReport
from .parity import Parity, Thresholds
from .tensors import TensorSpec


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """The manifest's `eval` entry: eval.npz and what its arrays must be.

    `task` names the bundle's task (tasks/: "classification", probabilities
    over `num_classes` classes, or "embedding", unit sentence vectors of
    `num_classes` dimensions with no labels, so `float_accuracy` is None).
    The task writes the entry (`Task.eval_json`).
    """

    file: str
    sha256: str
    samples: int
    x_shape: tuple[int, ...]
    x_dtype: str
    num_classes: int  # classes, or an embedding's dimensions
    float_accuracy: float | None
    task: str = "classification"


@dataclasses.dataclass(frozen=True)
class FileRef:
    """A `{"file": ..., "sha256": ...}` entry (labels, vocab, the source model)."""

    file: str
    sha256: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str) -> FileRef:
        entry = fields.obj(data, key)
        return cls(
            fields.filename(entry, "file", f"{key}."), fields.sha256(entry, "sha256", f"{key}.")
        )


MAX_SIGNATURES = 16
MAX_SIGNATURE_TENSORS = 256


@dataclasses.dataclass(frozen=True)
class Signature:
    """A named entry point of a model: its input and output tensors by name.

    The classifier's own signature is the entry's `input` / `output`; others
    (e.g. attention weights) go in `ModelEntry.signatures`.
    """

    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]

    def to_json(self) -> dict:
        return {
            "inputs": {k: v.to_json() for k, v in self.inputs.items()},
            "outputs": {k: v.to_json() for k, v in self.outputs.items()},
        }

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str, prefix: str) -> Signature:
        entry = fields.obj(data, key, prefix)
        prefix = f"{prefix}{key}."
        sides = {}
        for side in ("inputs", "outputs"):
            tensors = fields.obj(entry, side, prefix)
            if len(tensors) > MAX_SIGNATURE_TENSORS:
                raise fields.fail(
                    prefix + side, f"has {len(tensors)} tensors (at most {MAX_SIGNATURE_TENSORS})"
                )
            sides[side] = {
                name: TensorSpec.from_json(fields, tensors, name, f"{prefix}{side}.")
                for name in tensors
            }
        return cls(**sides)


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One `models.<mode>` entry: the file, its tensors, thresholds and what export found."""

    mode: str
    file: str
    sha256: str
    bytes: int
    input: TensorSpec
    output: TensorSpec  # the class probabilities (an embedding model: the vector)
    thresholds: Thresholds
    runtimes: dict[str, bool] = dataclasses.field(default_factory=dict)  # name -> can load it
    verified: bool | None = None
    parity: Parity | None = None
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    signatures: dict[str, Signature] = dataclasses.field(default_factory=dict)
    attention: AttentionCheck | None = None  # which signature, thresholds, figures
    deploy: DeployFile | None = None  # the stripped classifier TFLM runs (deploy.py)
    micro: dict = dataclasses.field(default_factory=dict)  # TFLM arena/flash bytes, or reason
    npu: NpuReport | None = None  # Vela's compile for Ethos-U (npu.py), for people
    # Written by the exporter for people; the device does not rely on them.
    checks: dict[str, bool] = dataclasses.field(default_factory=dict)
    failures: tuple[str, ...] = ()
    weights: dict[str, int] = dataclasses.field(default_factory=dict)
    verified_with: str | None = None
    convert_seconds: float | None = None
    size_vs_float32: float | None = None
    note: str | None = None
    # The input's sequence axis is dynamic: `input.shape` is the longest
    # (eval.x_shape) and the device resizes it to each sentence's own length.
    dynamic_length: bool = False

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())

    def to_json(self) -> dict:
        data = {
            "file": self.file,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "input": self.input.to_json(),
            "output": self.output.to_json(),
            "ops": dict(self.ops),
            "op_count": self.op_count,
            "parity": None if self.parity is None else self.parity.to_json(),
            "thresholds": self.thresholds.to_json(),
            "verified": self.verified,
            "runtimes": dict(self.runtimes),
            "checks": dict(self.checks),
            "failures": list(self.failures),
            "weights": dict(self.weights),
        }
        if self.signatures:
            data["signatures"] = {k: v.to_json() for k, v in self.signatures.items()}
        if self.attention is not None:
            data["attention"] = self.attention.to_json()
        if self.deploy is not None:
            data["deploy"] = self.deploy.to_json()
        if self.micro:
            data["micro"] = dict(self.micro)
        if self.npu is not None:
            data["npu"] = self.npu.to_json()
        for name in ("verified_with", "convert_seconds", "size_vs_float32", "note"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        if self.dynamic_length:
            data["dynamic_length"] = True
        return data

    @classmethod
    def from_json(
        cls, fields: Fields, mode: str, entry: object, evaluation: EvalSpec
    ) -> ModelEntry:
        prefix = f"models.{mode}."
        if not isinstance(entry, dict):
            raise fields.fail(f"models.{mode}", f"must be an object, got {kind(entry)}")
        inp = TensorSpec.from_json(fields, entry, "input", prefix)
        out = TensorSpec.from_json(fields, entry, "output", prefix)
        dynamic_length = fields.optional(entry, "dynamic_length", bool, prefix) or False
        if dynamic_length and len(inp.shape) != 2:
            raise fields.fail(
                prefix + "dynamic_length", "needs an input of shape [1, T] (token ids)"
            )
        runtimes = entry.get("runtimes") or {}
        if not isinstance(runtimes, dict) or not all(
            isinstance(v, bool) for v in runtimes.values()
        ):
            raise fields.fail(prefix + "runtimes", "must map runtime names to true/false")
        signatures = fields.optional(entry, "signatures", dict, prefix) or {}
        if len(signatures) > MAX_SIGNATURES:
            raise fields.fail(
                prefix + "signatures", f"has {len(signatures)} (at most {MAX_SIGNATURES})"
            )
        verified = entry.get("verified")
        attention = None
        if entry.get("attention") is not None:
            attention = AttentionCheck.from_json(fields, entry, "attention", prefix)
            if attention.signature not in signatures:
                raise fields.fail(
                    prefix + "attention.signature",
                    f"names {attention.signature!r}, which is not in {prefix}signatures",
                )
        parsed = {
            name: Signature.from_json(fields, signatures, name, prefix + "signatures.")
            for name in signatures
        }
        if attention is not None:
            outputs = list(parsed[attention.signature].outputs)
            expected = [output_name(i) for i in range(len(outputs))]
            if not outputs or sorted(outputs) != sorted(expected):
                raise fields.fail(
                    f"{prefix}signatures.{attention.signature}.outputs",
                    f"must be {', '.join(expected[:3]) or output_name(0)}"
                    f"{' ...' if len(expected) > 3 else ''} (one per layer), got "
                    f"{', '.join(repr(safe(n, 40)) for n in sorted(outputs)[:5])}",
                )
        return cls(
            mode=mode,
            file=fields.filename(entry, "file", prefix),
            sha256=fields.sha256(entry, "sha256", prefix),
            bytes=fields.integer(entry, "bytes", prefix, minimum=1, maximum=MAX_FILE_BYTES),
            input=inp,
            output=out,
            thresholds=Thresholds.from_json(fields, entry, "thresholds", prefix),
            runtimes=dict(runtimes),
            verified=verified if isinstance(verified, bool) else None,
            parity=Parity.from_json(entry.get("parity")),
            ops=_counts(entry.get("ops")),
            signatures=parsed,
            attention=attention,
            deploy=None
            if entry.get("deploy") is None
            else DeployFile.from_json(fields, entry, "deploy", prefix),
            micro=micro_json(entry.get("micro")),
            npu=NpuReport.from_json(entry.get("npu")),
            dynamic_length=dynamic_length,
            **_report_fields(entry),
        )


def _report_fields(entry: dict) -> dict:
    """The exporter's fields for people, read leniently (the device does not rely on them)."""
    checks = entry.get("checks")
    failures = entry.get("failures")
    found: dict = {
        "checks": {safe(k, 60): v for k, v in checks.items() if isinstance(v, bool)}
        if isinstance(checks, dict)
        else {},
        "failures": tuple(safe(f, 300) for f in failures[:64] if isinstance(f, str))
        if isinstance(failures, list)
        else (),
        "weights": _counts(entry.get("weights")),
    }
    for name, kinds in (
        ("verified_with", str),
        ("convert_seconds", (int, float)),
        ("size_vs_float32", (int, float)),
        ("note", str),
    ):
        value = entry.get(name)
        if isinstance(value, kinds) and not isinstance(value, bool):
            found[name] = safe(value, 300) if isinstance(value, str) else float(value)
    return found


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {
        safe(k, 60): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)
    }


@dataclasses.dataclass(frozen=True)
class ModeFailure:
    """Why export left a mode out (or kept it unverified): the manifest's `failed.<mode>`."""

    stage: str  # "convert", "graph", "verify" or "parity"
    reasons: tuple[str, ...]
    parity: Parity | None = None
    bytes: int | None = None
    ops: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        data: dict = {"stage": self.stage, "reasons": list(self.reasons)}
        if self.parity is not None:
            data.update(parity=self.parity.to_json(), bytes=self.bytes, ops=dict(self.ops))
        return data

    @classmethod
    def from_json(cls, data: object) -> ModeFailure | None:
        """Lenient, like every field the device does not rely on."""
        if not isinstance(data, dict) or not isinstance(data.get("stage"), str):
            return None
        reasons = data.get("reasons")
        size = data.get("bytes")
        return cls(
            safe(data["stage"], 40),
            tuple(safe(r, 300) for r in reasons[:64] if isinstance(r, str))
            if isinstance(reasons, list)
            else (),
            Parity.from_json(data.get("parity")),
            size if isinstance(size, int) and not isinstance(size, bool) else None,
            _counts(data.get("ops")),
        )
