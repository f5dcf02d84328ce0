"""Compile full-integer models for Arm's Ethos-U NPUs with Vela, and read what it estimates.

An Ethos-U (U55 and U65 beside a Cortex-M, U85 beside a Cortex-A or M) runs
int8 and int16x8 operators it has kernels for; Vela, Arm's compiler, turns
the supported parts of a .tflite into command streams (one `ethos-u` custom
operator per NPU partition) and leaves the rest as TFLite operators for the
CPU. Every unsupported operator splits the graph and runs on the CPU.

`compile_for(model, accelerator, workdir)` runs Vela (`python -m ethosu.vela`,
in a child process: its errors and its prints stay there) for one of
`ACCELERATORS`, each with Vela's default system configuration and memory mode
for that NPU, named explicitly so the figures say what they assume. It reads:

- the compiled file: which TFLite operators stayed on the CPU (named, in the
  TFLite schema's names) and into how many NPU partitions the rest fell;
- Vela's summary CSV: SRAM and flash/DRAM use and traffic, cycles, MACs and
  inferences per second at the configuration's clock;
- Vela's per-layer CSV: the MACs it maps to the NPU; those of matrix
  operators left on the CPU are counted from their shapes (`op_macs`).

These are estimates (no NPU or simulator runs here); export records them in
the manifest (`bundle_contract.npu`) and keeps the compiled files.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import math
import pathlib
import re
import subprocess
import sys
from collections.abc import Sequence

from bundle_contract.errors import UsageError
from bundle_contract.npu import NpuTarget

from .graph import INTEGER_IO, GraphInfo, OpInfo, op_histogram, read_graph

NPU_OP = "CUSTOM:ethos-u"
VELA_SECONDS = 1800  # a MiniLM-sized graph takes minutes on 2 cores


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """An Ethos-U configuration and the Vela system configuration it is estimated in."""

    name: str  # Vela's --accelerator-config
    system_config: str  # Vela's default for this NPU (vela.ini)
    memory_mode: str


ACCELERATORS = (
    # Cortex-M55 + U55 in a microcontroller: weights in off-chip flash, SRAM shared.
    Accelerator("ethos-u55-128", "Ethos_U55_High_End_Embedded", "Shared_Sram"),
    # U65 beside a Cortex-A (i.MX 93): weights in DRAM, a 384 KiB SRAM cache.
    Accelerator("ethos-u65-256", "Ethos_U65_Client_Server", "Dedicated_Sram_384KB"),
    # U85 (transformer operators too): DRAM, a 384 KiB SRAM cache.
    Accelerator("ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram_384KB"),
)
BY_NAME = {a.name: a for a in ACCELERATORS}


def parse_accelerators(value: str | Sequence[str] | None) -> tuple[Accelerator, ...]:
    """`"all"`, `"ethos-u55-128,ethos-u85-256"` or names -> accelerators (UsageError if unknown)."""
    if not value:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [n.strip() for n in names if n.strip()]
    if "all" in names:
        return ACCELERATORS
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise UsageError(
            f"unknown accelerator {unknown[0] if unknown else ''!r}; choose 'all' or from "
            + ", ".join(BY_NAME),
            "--npu",
        )
    return tuple(a for a in ACCELERATORS if a.name in names)


def npu_request(value: str | Sequence[str] | None, modes: Sequence[str]) -> tuple[Accelerator, ...]:
    """The accelerators `--npu` names, checked against the modes asked for and Vela.

    UsageError (one line) for an unknown accelerator, no full-integer mode
    among `modes` (only those compile), or no Vela installed.
    """
    accelerators = parse_accelerators(value)
    if not accelerators:
        return ()
    if not set(modes) & set(INTEGER_IO):
        raise UsageError(
            f"compiles full-integer modes ({', '.join(INTEGER_IO)}); --quant asks for none",
            "--npu",
        )
    require_vela()
    return accelerators


def vela_version() -> str | None:
    """The installed ethos-u-vela's version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ethos-u-vela")
    except PackageNotFoundError:
        return None


def require_vela() -> str:
    """Vela's version; UsageError in one line when it is not installed."""
    found = vela_version()
    if found is None:
        raise UsageError(
            "needs Arm's Vela compiler: pip install ethos-u-vela (make install does)", "--npu"
        )
    return found


def _number(text: str) -> float:
    value = float(text)
    return int(value) if value.is_integer() else value


def _summary(rows: list[dict]) -> dict:
    """The figures of Vela's summary CSV (one row)."""
    row = rows[0]
    kib = {
        "sram_kib": "sram_memory_used",
        "dram_kib": "dram_memory_used",
        "on_chip_flash_kib": "on_chip_flash_memory_used",
        "off_chip_flash_kib": "off_chip_flash_memory_used",
    }
    found = {key: round(float(row[column]), 2) for key, column in kib.items()}
    for area in ("sram", "dram", "on_chip_flash", "off_chip_flash"):
        found[f"{area}_bytes_per_inference"] = _number(row[f"{area}_total_bytes"])
    found.update(
        macs=_number(row["nn_macs"]),
        clock_hz=_number(row["core_clock"]),
        cycles=_number(row["cycles_total"]),
        inferences_per_second=round(float(row["inferences_per_second"]), 1),
        inference_seconds=float(row["inference_time"]),
    )
    return found


def _vela_counts(stdout: str) -> dict:
    """Vela's own operator counts ('CPU operators = 12 (6.5%)') from its printed summary."""
    found = {}
    for side in ("npu", "cpu"):
        match = re.search(rf"^{side.upper()} operators = (\d+)", stdout, re.MULTILINE)
        if match:
            found[f"vela_{side}_operators"] = int(match.group(1))
    return found


def _prod(shape) -> int:
    return int(math.prod(shape))


def op_macs(graph: GraphInfo, op: OpInfo) -> int:
    """Multiply-accumulates of one matrix operator (0 for the others), from its shapes.

    Vela counts the MACs of what it maps to the NPU only; this counts those
    an operator left on the CPU does, so the NPU's share is of the whole.
    """
    if op.name not in ("FULLY_CONNECTED", "BATCH_MATMUL", "CONV_2D", "DEPTHWISE_CONV_2D"):
        return 0
    out = graph.tensor(op.outputs[0]).shape
    if op.name == "FULLY_CONNECTED":  # weights (units, inputs)
        return _prod(out) * graph.tensor(op.inputs[1]).shape[-1]
    if op.name == "BATCH_MATMUL":  # (..., M, K) or, adjoint, (..., K, M) -> (..., M, N)
        lhs = graph.tensor(op.inputs[0]).shape
        inner = lhs[-1] if lhs[-2] == out[-2] else lhs[-2]
        return _prod(out) * inner
    if op.name == "CONV_2D":  # weights (out, kh, kw, in)
        return _prod(out) * _prod(graph.tensor(op.inputs[1]).shape[1:])
    # DEPTHWISE_CONV_2D: weights (1, kh, kw, channels)
    return _prod(out) * _prod(graph.tensor(op.inputs[1]).shape[1:3])


def compile_for(model: bytes, accelerator: Accelerator, workdir: pathlib.Path) -> NpuTarget:
    """Compile `model` for `accelerator` in `workdir`; the record (with `reason` if Vela fails).

    The compiled file is `workdir/<stem>_vela.tflite` (`NpuTarget.file` names
    it relative to `workdir`).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "model.tflite"
    source.write_bytes(model)
    out = workdir / "out"
    command = [
        sys.executable,
        "-m",
        "ethosu.vela",
        str(source),
        "--accelerator-config",
        accelerator.name,
        "--system-config",
        accelerator.system_config,
        "--memory-mode",
        accelerator.memory_mode,
        "--output-dir",
        str(out),
        "--verbose-performance",
    ]
    record = NpuTarget(accelerator.name, accelerator.system_config, accelerator.memory_mode)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=VELA_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        return dataclasses.replace(record, reason=f"Vela took over {VELA_SECONDS} s")
    compiled = out / "model_vela.tflite"
    summaries = sorted(out.glob("model_summary_*.csv"))
    if done.returncode != 0 or not compiled.is_file() or not summaries:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit status {done.returncode}"
        return dataclasses.replace(record, reason=f"Vela failed: {why}"[:300])
    original = op_histogram(read_graph(model))
    left_graph = read_graph(compiled.read_bytes())
    left = op_histogram(left_graph)
    cpu_ops = {name: count for name, count in left.items() if name != NPU_OP}
    with open(summaries[0], newline="") as handle:
        figures = _summary(list(csv.DictReader(handle)))
    layers = out / "model_per-layer.csv"
    if layers.is_file():
        with open(layers, newline="") as handle:
            rows = list(csv.DictReader(handle))
        figures["npu_macs"] = sum(int(r["MAC Count"]) for r in rows if r["Target"] == "NPU")
    data = compiled.read_bytes()
    total = sum(original.values())
    figures.update(
        tflite_operators=total,
        npu_tflite_operators=total - sum(cpu_ops.values()),
        npu_partitions=left.get(NPU_OP, 0),
        cpu_macs=sum(op_macs(left_graph, op) for op in left_graph.ops),
        compiled_bytes=len(data),
        **_vela_counts(done.stdout),
    )
    return dataclasses.replace(
        record,
        figures=figures,
        cpu_ops=dict(sorted(cpu_ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        file=str(compiled.relative_to(workdir)),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def compiled_name(mode: str, accelerator: Accelerator) -> str:
    """The compiled file's name in the bundle."""
    return f"model_{mode}.{accelerator.name}.vela.tflite"
