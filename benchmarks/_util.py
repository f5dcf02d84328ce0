"""Shared by the benchmark scripts."""

from __future__ import annotations

import pathlib

from bundle_contract.files import write_json_atomic as _write


def write_json_atomic(path: pathlib.Path, data) -> None:
    """Write `data` as JSON to `path` through a temporary file and a rename; say so."""
    _write(path, data)
    print(f"\nwrote {path}")
