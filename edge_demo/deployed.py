"""A mode's deploy file: its classifier without strings, the file TensorFlow Lite Micro runs.

Export writes, beside each `model_MODE.tflite`, `model_MODE.deploy.tflite`:
subgraph 0 only (the attention signature's subgraph dropped: TFLM crashes
on any model with two subgraphs, docs/field_notes.md) with the tensor names,
description and signature defs stripped (int8 digits: 73,768 -> 59,904
bytes). The manifest entry's `deploy` describes it and `micro` what TFLM
needs for it (`arena_bytes`, `flash_bytes`) or why TFLM cannot run it.

Runtimes marked in `DEPLOY_RUNTIMES` (TFLM) run the deploy file; the others
run the named model. The deploy file has no tensor names and no attention
signature, so the entry it is checked against has neither
(`runtime_entry`). Standard library and numpy.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .command import UsageError
from .fields import Fields, kind

if TYPE_CHECKING:
    from .bundle import Bundle
    from .entries import ModelEntry
    from .runtime import Runtime

DEPLOY_RUNTIMES = frozenset({"tflite-micro"})  # run `deploy.file`, never the named model
MICRO_RUNTIME = "tflite-micro"


def deploy_name(mode: str) -> str:
    """The deploy file's name in the bundle."""
    return f"model_{mode}.deploy.tflite"


@dataclasses.dataclass(frozen=True)
class DeployFile:
    """`models.<mode>.deploy`: the stripped classifier and the runtimes it was checked on."""

    file: str
    sha256: str
    bytes: int
    verified_with: tuple[str, ...] = ()  # runtimes giving bit-identical raw outputs

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "verified_with": list(self.verified_with),
        }

    @classmethod
    def from_json(cls, fields: Fields, data: dict, key: str, prefix: str) -> DeployFile:
        entry = fields.obj(data, key, prefix)
        prefix = f"{prefix}{key}."
        verified = entry.get("verified_with", [])
        if not isinstance(verified, list) or not all(isinstance(v, str) for v in verified):
            raise fields.fail(
                prefix + "verified_with", f"must be a list of runtime names, got {kind(verified)}"
            )
        return cls(
            file=fields.filename(entry, "file", prefix),
            sha256=fields.sha256(entry, "sha256", prefix),
            bytes=fields.integer(entry, "bytes", prefix, minimum=1),
            verified_with=tuple(verified),
        )


def micro_json(value: object) -> dict:
    """`models.<mode>.micro`, read leniently (for people): numbers, or a `reason`."""
    if not isinstance(value, dict):
        return {}
    return {
        str(k): v
        for k, v in value.items()
        if (isinstance(v, (int, float)) and not isinstance(v, bool))
        or isinstance(v, str)
        or v is None
    }


def uses_deploy(runtime: Runtime) -> bool:
    return runtime.name in DEPLOY_RUNTIMES


def runtime_entry(entry: ModelEntry, runtime: Runtime) -> ModelEntry:
    """The entry `runtime`'s model is checked against: for a deploy file, without
    tensor names and signatures (stripped), with its file, bytes and sha256."""
    if not uses_deploy(runtime):
        return entry
    if entry.deploy is None:
        raise UsageError(
            f"{runtime.name} runs a mode's deploy file, and models.{entry.mode}.deploy "
            "is missing (re-export the bundle)",
            "manifest.json",
        )
    unnamed = {"name": ""}
    return dataclasses.replace(
        entry,
        file=entry.deploy.file,
        sha256=entry.deploy.sha256,
        bytes=entry.deploy.bytes,
        input=dataclasses.replace(entry.input, **unnamed),
        output=dataclasses.replace(entry.output, **unnamed),
        signatures={},
        attention=None,
    )


def runtime_content(bundle: Bundle, mode: str, runtime: Runtime) -> bytes:
    """The model bytes `runtime` runs for `mode`: the deploy file (checked like any
    model file: size, header, sha256) or the named model already read."""
    if not uses_deploy(runtime):
        return bundle.model_bytes[mode]
    from .bundle import read_model

    return read_model(bundle.root, runtime_entry(bundle.manifest.models[mode], runtime))
