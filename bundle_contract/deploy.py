"""A mode's deploy file: its classifier without strings, the file TensorFlow Lite Micro runs.

Export writes, beside each `model_MODE.tflite`, `model_MODE.deploy.tflite`:
subgraph 0 only (the attention signature's subgraph dropped: TFLM crashes
on any model with two subgraphs, docs/field_notes.md) with the tensor names,
description and signature defs stripped (int8 digits: 73,768 -> 59,904
bytes). The manifest entry's `deploy` describes it (`DeployFile`) and
`micro` what TFLM needs for it (`arena_bytes`, `flash_bytes`) or why TFLM
cannot run it (`micro_json`).

The format only: which runtime runs which file is runtimes/policy.py's.
Standard library only.
"""

from __future__ import annotations

import dataclasses

from .fields import Fields, kind


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
