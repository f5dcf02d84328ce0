"""Bundle fixtures for the edge and export tests, as a plugin a module requests:

    pytest_plugins = ["edge_fixtures"]

Each bundle is exported once per session however many modules use it. The
bundles are read-only; `bundle_copy` and `text_copy` are private copies for breaking.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
from edge_bundle import copy_device_app, export_bundle, export_command, make_text_run
from environment import missing
from once import once_per_run


@pytest.fixture(scope="session")
def digits_export(digits_run, tmp_path_factory) -> dict:
    """`python -m keras_mha_export RUN --out B` on the digits run, once, as a user runs it.

    {"out", "run", "status", "stdout", "stderr", "manifest" (dict or None)}.
    """

    def make(folder: pathlib.Path) -> None:
        done = export_command(digits_run, folder / "bundle")
        result = {"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        (folder / "command.json").write_text(json.dumps(result))

    folder = once_per_run(tmp_path_factory, "digits_export", make)
    out = folder / "bundle"
    manifest = json.loads((out / "manifest.json").read_text()) if out.is_dir() else None
    return {
        "out": out,
        "run": digits_run,
        **json.loads((folder / "command.json").read_text()),
        "manifest": manifest,
    }


@pytest.fixture(scope="session")
def digits_bundle(digits_export) -> pathlib.Path:
    """Every mode of the trained digits run (`digits_export`). Read-only."""
    if digits_export["status"] != 0 or digits_export["manifest"] is None:
        pytest.fail(f"export failed: {digits_export['stderr'][-3000:]}", pytrace=False)
    return digits_export["out"]


@pytest.fixture(scope="session")
def text_run(tmp_path_factory) -> pathlib.Path:
    return once_per_run(tmp_path_factory, "text_run", lambda d: make_text_run(d / "run")) / "run"


@pytest.fixture(scope="session")
def text_bundle(text_run, tmp_path_factory) -> pathlib.Path:
    """A text bundle (vocab.json) in float32, float16 and int8. Read-only."""
    make = lambda d: export_bundle(text_run, d / "bundle", "float32,float16,int8")  # noqa: E731
    return once_per_run(tmp_path_factory, "text_bundle", make) / "bundle"


@pytest.fixture(scope="session")
def app_dir(tmp_path_factory) -> pathlib.Path:
    """A folder holding what a device copies (edge_demo/, bundle_contract/) and nothing else."""
    root = tmp_path_factory.mktemp("device")
    return copy_device_app(root)


@pytest.fixture
def bundle_copy(digits_bundle, tmp_path) -> pathlib.Path:
    """A private copy of the digits bundle, for breaking."""
    return pathlib.Path(shutil.copytree(digits_bundle, tmp_path / "bundle"))


@pytest.fixture
def text_copy(text_bundle, tmp_path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(text_bundle, tmp_path / "text_bundle"))


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nothing can write in: a read-only tmpfs (as root) or mode 0o555."""
    directory = tmp_path / "ro"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield directory
        directory.chmod(0o755)
        return
    try:
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(directory)],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        missing("the mount command (for a read-only tmpfs)")
    if mount.returncode != 0:
        missing(f"a read-only tmpfs mount as root ({mount.stderr.decode().strip()})")
    yield directory
    subprocess.run(["umount", str(directory)], check=True)
