"""Shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile


def write_json_atomic(path: pathlib.Path, data) -> None:
    """Write `data` as JSON to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=2)
    os.replace(f.name, path)
    print(f"\nwrote {path}")
