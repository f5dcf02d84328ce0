"""Per mode, what the bundle says about devices: the deploy file and TensorFlow Lite Micro.

`add_devices` runs while export stages the bundle, before LiteRT's verification:

1. writes each mode's deploy file (`deploy.deploy_bytes`: classifier only,
   strings stripped) and checks it gives bit-identical raw outputs on LiteRT
   (against the named model) and, if TFLM runs it, on TFLM (against the
   named classifier): `models.MODE.deploy`;
2. if `tflite_micro` imports, probes the deploy file in TFLM in a child
   process (TFLM can crash instead of refusing), scores every eval sample
   with the device's `score.run_mode` under TFLM and the manifest's
   thresholds, and sizes it (`micro.footprint`): `models.MODE.runtimes
   ["tflite-micro"]` and `models.MODE.micro` = {arena_bytes, flash_bytes,
   weight_bytes, reported_arena_bytes} or {reason} in one line.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Callable

import numpy as np

from bundle_contract.bundle import add_file, open_bundle
from bundle_contract.deploy import DeployFile, deploy_name
from bundle_contract.entries import ModelEntry
from bundle_contract.errors import UsageError
from bundle_contract.manifest import Manifest
from edge_demo.runtimes.runtime import MICRO_RUNTIME, Runtime, select_runtime

from .deploy import deploy_bytes, verify_stripped


def _runtime(choice: str) -> Runtime | None:
    try:
        return select_runtime(choice)
    except UsageError:
        return None


def _finite(value: float) -> float | None:
    return round(float(value), 4) if math.isfinite(value) else None


def _micro_probe(micro: Runtime, content: bytes, entry: ModelEntry, x: np.ndarray) -> str:
    """An empty string if TFLM loads and invokes the deploy file in a child process, else why not."""
    from edge_demo.runtimes.probe import probe_model

    probe = probe_model(micro, content, deploy_name(entry.mode), entry.input.quantize(x[:1]))
    return "" if probe.ok else probe.reason


def add_devices(
    staging: pathlib.Path,
    entries: dict[str, ModelEntry],
    x: np.ndarray,
    manifest: Callable[[dict[str, ModelEntry]], Manifest],
    log: Callable[[str], None],
) -> dict[str, ModelEntry]:
    """The entries with `deploy`, and with TFLM's `runtimes` and `micro` when it imports.

    Writes the deploy files and the manifest (with them) into `staging`.
    """
    from edge_demo.runtimes.micro_footprint import footprint

    litert, micro = _runtime("litert"), _runtime(MICRO_RUNTIME)
    done: dict[str, ModelEntry] = {}
    runnable: dict[str, bytes] = {}
    for mode, entry in entries.items():
        named = (staging / entry.file).read_bytes()
        classifier, stripped = deploy_bytes(named)
        reason = _micro_probe(micro, stripped, entry, x) if micro is not None else None
        checks = [(litert, named)] if litert is not None else []
        if micro is not None and not reason:
            checks.append((micro, classifier))
        try:
            verified = [
                name for rt, ref in checks for name in verify_stripped(ref, stripped, x, [rt])
            ]
        except (ValueError, UsageError) as exc:  # not bit-identical: no deploy file
            log(f"  {mode:<8} no deploy file: {exc}")
            done[mode] = entry
            continue
        ref = add_file(staging, deploy_name(mode), stripped)
        deploy = DeployFile(ref.file, ref.sha256, len(stripped), tuple(verified))
        runtimes, found = dict(entry.runtimes), {}
        if micro is not None:
            runtimes[MICRO_RUNTIME] = not reason
            found = {"reason": reason} if reason else {}
            if not reason:
                runnable[mode] = stripped
        done[mode] = dataclasses.replace(entry, deploy=deploy, runtimes=runtimes, micro=found)
    manifest(done).write(staging)
    if not runnable:
        return done
    from edge_demo.runtimes.score import run_mode

    bundle = open_bundle(staging)
    for mode, stripped in runnable.items():
        entry = done[mode]
        result = run_mode(bundle, mode, micro)
        sample = [entry.input.quantize(x[:1])]
        found = {
            **footprint(stripped, sample),
            "named_flash_bytes": entry.bytes,
            "accuracy": _finite(result.accuracy),
            "agreement": _finite(result.agreement),
        }
        if not result.passed:
            found["reason"] = "; ".join(result.failures)
        log(
            f"  {mode:<8} tflite-micro: accuracy {result.accuracy:.4f}, agreement "
            f"{result.agreement:.4f}; arena {found['arena_bytes']:,} B, deploy file "
            f"{found['flash_bytes']:,} B (named model {entry.bytes:,} B)"
        )
        runtimes = dict(entry.runtimes, **{MICRO_RUNTIME: bool(result.passed)})
        done[mode] = dataclasses.replace(entry, runtimes=runtimes, micro=found)
    return done
