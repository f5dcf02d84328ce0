"""`models.<mode>.npu`: what Arm's Vela compiler made of a full-integer model for Ethos-U.

Export compiles each verified full-integer mode's deploy file with Vela
(`export/npu.py`) for the accelerators it is asked for and records, per
accelerator, what Vela reports. Every figure is Vela's estimate for the
named system configuration; nothing here ran on an NPU (no Ethos-U hardware
or simulator runs the compiled command stream on a CPU). The compiled file
itself is in the bundle for flashing; its `ethos-u` custom operator only the
NPU's driver runs, so the device's parity is the int8 file Vela consumed.

The device does not rely on this entry: it is read leniently, for people.
"""

from __future__ import annotations

import dataclasses

# What one accelerator's record holds, beside the compiled file and the CPU's operators.
NUMBERS = (
    "tflite_operators",  # in the file Vela consumed
    "npu_tflite_operators",  # of those, mapped to the NPU
    "npu_partitions",  # ethos-u custom operators left in the compiled file
    "vela_npu_operators",  # Vela's own operator counts (after its decompositions)
    "vela_cpu_operators",
    "macs",  # Vela's count of the multiply-accumulates it maps (NPU side)
    "npu_macs",
    "cpu_macs",  # those of matrix operators left on the CPU (export/npu.py op_macs)
    "clock_hz",
    "cycles",
    "inferences_per_second",
    "inference_seconds",
    "sram_kib",  # peak SRAM used
    "dram_kib",
    "on_chip_flash_kib",
    "off_chip_flash_kib",
    "sram_bytes_per_inference",  # traffic: bytes read and written per inference
    "dram_bytes_per_inference",
    "off_chip_flash_bytes_per_inference",
    "on_chip_flash_bytes_per_inference",
    "compiled_bytes",
)
TEXTS = ("accelerator", "system_config", "memory_mode", "file", "sha256", "reason")


@dataclasses.dataclass(frozen=True)
class NpuTarget:
    """One accelerator's compile: Vela's figures, the CPU's operators and the compiled file."""

    accelerator: str
    system_config: str
    memory_mode: str
    figures: dict[str, float | int] = dataclasses.field(default_factory=dict)
    cpu_ops: dict[str, int] = dataclasses.field(default_factory=dict)  # TFLite names
    file: str | None = None
    sha256: str | None = None
    reason: str | None = None  # why Vela could not compile it

    def get(self, name: str, default=None):
        return self.figures.get(name, default)

    @property
    def npu_fraction(self) -> float | None:
        total, npu = self.get("tflite_operators"), self.get("npu_tflite_operators")
        return npu / total if total and npu is not None else None

    @property
    def mac_fraction(self) -> float | None:
        """The NPU's share of every multiply-accumulate, the CPU's matrix operators' included."""
        npu, cpu = self.get("npu_macs"), self.get("cpu_macs")
        return npu / (npu + cpu) if npu is not None and cpu is not None and npu + cpu else None

    def to_json(self) -> dict:
        data = {
            "accelerator": self.accelerator,
            "system_config": self.system_config,
            "memory_mode": self.memory_mode,
            **self.figures,
            "cpu_ops": dict(self.cpu_ops),
        }
        for name in ("file", "sha256", "reason"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_json(cls, value: object) -> NpuTarget | None:
        if not isinstance(value, dict):
            return None
        texts = {k: value.get(k) for k in TEXTS if isinstance(value.get(k), str)}
        figures = {
            k: value[k]
            for k in NUMBERS
            if isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool)
        }
        cpu = value.get("cpu_ops")
        cpu_ops = (
            {str(k): v for k, v in cpu.items() if isinstance(v, int) and not isinstance(v, bool)}
            if isinstance(cpu, dict)
            else {}
        )
        return cls(
            accelerator=texts.get("accelerator", "?"),
            system_config=texts.get("system_config", "?"),
            memory_mode=texts.get("memory_mode", "?"),
            figures=figures,
            cpu_ops=cpu_ops,
            file=texts.get("file"),
            sha256=texts.get("sha256"),
            reason=texts.get("reason"),
        )


@dataclasses.dataclass(frozen=True)
class NpuReport:
    """`models.<mode>.npu`: the Vela version, the file it compiled and one record per accelerator."""

    vela: str
    source: str  # the bundle file Vela compiled (the mode's deploy file)
    targets: tuple[NpuTarget, ...] = ()
    estimate: str = "Vela's estimates for the named system configurations; not run on an NPU"

    def target(self, accelerator: str) -> NpuTarget | None:
        return next((t for t in self.targets if t.accelerator == accelerator), None)

    def to_json(self) -> dict:
        return {
            "vela": self.vela,
            "source": self.source,
            "estimate": self.estimate,
            "targets": [t.to_json() for t in self.targets],
        }

    @classmethod
    def from_json(cls, value: object) -> NpuReport | None:
        """The report, or None when `value` is not one (read leniently)."""
        if not isinstance(value, dict) or not isinstance(value.get("vela"), str):
            return None
        targets = value.get("targets")
        parsed = [NpuTarget.from_json(t) for t in targets] if isinstance(targets, list) else []
        return cls(
            vela=value["vela"],
            source=value["source"] if isinstance(value.get("source"), str) else "?",
            targets=tuple(t for t in parsed[:16] if t is not None),
        )
