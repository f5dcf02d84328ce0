"""What every export shares, a classifier's or encoder's (bundle.py) and a language
model's (decoder_bundle.py): the output directory's check, the versions a
manifest records, and the failure that writes no bundle."""

from __future__ import annotations

import pathlib
import platform
from typing import TYPE_CHECKING

from bundle_contract.errors import UsageError
from bundle_contract.files import check_writable

if TYPE_CHECKING:
    from bundle_contract.manifest import Manifest

TOOL = "keras-mha-export"


class ExportFailed(Exception):
    """No requested mode passed verification, so no bundle was written.

    `manifest` holds what was measured (`failed` says why each mode failed).
    """

    def __init__(self, message: str, manifest: Manifest):
        super().__init__(message)
        self.manifest = manifest


def _is_within(path: pathlib.Path, directory: pathlib.Path) -> bool:
    path, directory = path.resolve(), directory.resolve()
    return path == directory or directory in path.parents


def check_target(out: pathlib.Path, overwrite: bool, files: dict[str, pathlib.Path]) -> None:
    """Refuse an unwritable `out`, a file, a non-empty directory (unless `overwrite`),
    or a directory holding the source files."""
    check_writable(out, "--out")
    if out.exists() and not out.is_dir():
        raise UsageError("exists and is not a directory", f"--out {out}")
    for role, path in files.items():
        if _is_within(path, out):
            raise UsageError(f"holds the {role} file {path}; choose another --out", f"--out {out}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UsageError("exists and is not empty (use --overwrite)", f"--out {out}")


def tool_versions(quantizer: bool = False) -> dict[str, str]:
    """The tools that made the bundle; `quantizer`: ai-edge-quantizer made a model."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_mha

    versions = {
        "keras_mha": keras_mha.__version__,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "tool": TOOL,
    }
    from importlib.metadata import version

    try:
        versions["ai_edge_litert"] = version("ai-edge-litert")
    except Exception:  # not installed: verification fell back to TensorFlow
        pass
    if quantizer:
        versions["ai_edge_quantizer"] = version("ai-edge-quantizer")
    return versions
