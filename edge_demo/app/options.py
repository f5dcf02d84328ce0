"""The edge command line, parsed: `DemoOptions` (cli.py parses, runs.py runs)."""

from __future__ import annotations

import dataclasses
import pathlib


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """The command line, parsed."""

    bundle: pathlib.Path
    quant: str | None = None  # None or "all" = every mode in the manifest
    runtime: str = "auto"  # "auto" | "litert" | "tflite-runtime"
    threads: int = 1
    repeat: int = 1
    json_path: pathlib.Path | None = None
    raw: pathlib.Path | None = None  # --raw FILE.npz: each mode's raw outputs (parity run)
    wide: bool = False  # the parity table with every column
    sample: int | None = None
    text: str | None = None
    view: pathlib.Path | None = None
    debug: str | None = None  # --debug MODE (debug/cli.py)
    embed: pathlib.Path | None = None  # --embed FILE.txt (embedding bundles)
    out: pathlib.Path | None = None  # --out FILE.npy (with --embed)
    pair: tuple[str, str] | None = None  # --pair QUERY PASSAGE (cross-encoder bundles)
    rerank: tuple[str, pathlib.Path] | None = None  # --rerank QUERY FILE.txt
    generate: str | None = None  # --generate PROMPT (language model bundles)
    chat: str | None = None  # --chat MESSAGE: the prompt in the model's chat template
    max_new_tokens: int = 32
