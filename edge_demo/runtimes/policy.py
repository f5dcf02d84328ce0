"""Which file a runtime runs for a mode: the named model, or the mode's deploy file.

Runtimes in `DEPLOY_RUNTIMES` (TFLM) run the deploy file
(bundle_contract/deploy.py: the classifier alone, without tensor names and
signatures); the others run the named model. The deploy file has no tensor
names and no attention signature, so the entry it is checked against has
neither (`runtime_entry`). Standard library only.
"""

from __future__ import annotations

import dataclasses

from bundle_contract.bundle import Bundle, read_model
from bundle_contract.entries import ModelEntry
from bundle_contract.errors import UsageError

from .runtime import MICRO_RUNTIME, Runtime

DEPLOY_RUNTIMES = frozenset({MICRO_RUNTIME})  # run `deploy.file`, never the named model


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
    return read_model(bundle.root, runtime_entry(bundle.manifest.models[mode], runtime))
