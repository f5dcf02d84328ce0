"""Test helpers for bundles: made by the export command, or written through the contract.

- `export_command` / `export_bundle(run_dir, out, quant)`: `python -m
  keras_mha_export RUN --out OUT --quant QUANT` (this venv has TensorFlow);
  `export_bundle` fails the test if it fails.
- `make_text_run(out)`: a small untrained token classifier as a run directory
  with vocab.json (written by `bundle_contract.vocab.Vocab`).
- `example_manifest()`: a valid two-mode `Manifest` built from the contract's
  dataclasses (not a hand-written JSON copy).
- `edit_manifest`, `match_model_file`, `match_file`: break a bundle copy the
  way a forger would (edits that keep sha256 and sizes consistent).
- `edge_python(runtime)`: the TensorFlow-free venv's python for a runtime.
- `run_main(main, argv)`: a command's `main(argv)` in this process:
  (status, stdout, stderr).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from environment import venv_python

from bundle_contract.entries import EvalSpec, FileRef, ModelEntry
from bundle_contract.files import sha256_file
from bundle_contract.manifest import Manifest
from bundle_contract.parity import Parity, default_thresholds
from bundle_contract.tensors import TensorSpec
from bundle_contract.vocab import Vocab

REPO = pathlib.Path(__file__).resolve().parents[1]


def copy_device_app(folder: pathlib.Path) -> pathlib.Path:
    """`folder` holding what a device copies (edge_demo.DEVICE_PACKAGES) and
    nothing else of the repository; returns it."""
    from edge_demo import DEVICE_PACKAGES

    for name in DEVICE_PACKAGES:
        shutil.copytree(REPO / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


EDGE_VENVS = {
    "litert": ("KERAS_MHA_EDGE_PYTHON", REPO / ".venv-edge" / "bin" / "python"),
    "tflite-runtime": ("KERAS_MHA_TFLITE_PYTHON", REPO / ".venv-edge-tflite" / "bin" / "python"),
}


def edge_python(runtime: str) -> pathlib.Path:
    """The TensorFlow-free interpreter for `runtime`; `missing(...)` if the venv is not there."""
    env_var, default = EDGE_VENVS[runtime]
    path = pathlib.Path(os.environ.get(env_var) or default)
    return venv_python(path, f"run `make edge-venvs` or set {env_var}; `make test` creates it")


def export_command(run_dir: pathlib.Path, out: pathlib.Path, quant: str = "all"):
    """`python -m keras_mha_export RUN_DIR --out OUT --quant QUANT` as a user runs it.

    TF_CPP_MIN_LOG_LEVEL is removed from the environment: the command quiets
    TensorFlow itself. Returns the CompletedProcess (text).
    """
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    argv = [sys.executable, "-m", "keras_mha_export", str(run_dir), "--out", str(out)]
    return subprocess.run(
        [*argv, "--quant", quant], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )


def export_bundle(run_dir: pathlib.Path, out: pathlib.Path, quant: str = "all") -> pathlib.Path:
    """`export_command(...)`; fails the test if it fails. Returns `out`."""
    proc = export_command(run_dir, out, quant)
    if proc.returncode != 0 or not (out / "manifest.json").exists():
        pytest.fail(
            f"python -m keras_mha_export failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}",
            pytrace=False,
        )
    return out


def make_text_run(out: pathlib.Path, seed: int = 0, implementation: str = "fused") -> pathlib.Path:
    """A small untrained token classifier as a run directory, with vocab.json.

    Untrained weights are enough to exercise the text path of the edge demo:
    `eval.npz` holds the model's own softmax as the reference.
    """
    import keras

    from keras_mha.model import ModelConfig, build_classifier

    words = "the cat dog sat on a mat it was happy sad big small ran home".split()
    vocab = Vocab(tokens=("<pad>", "<unk>", *words), max_length=6, token_pattern="[a-z']+")
    config = ModelConfig(
        input_kind="tokens",
        sequence_length=vocab.max_length,
        feature_dim=len(vocab),
        num_classes=2,
        d_model=16,
        num_heads=2,
        ff_dim=16,
        dropout=0.0,
        seed=seed,
        implementation=implementation,
    )
    model = build_classifier(config)
    rng = np.random.default_rng(seed)
    length = vocab.max_length
    x = rng.integers(2, len(vocab), size=(40, length)).astype("int32")
    lengths = rng.integers(2, length + 1, size=40)
    x[np.arange(length)[None, :] >= lengths[:, None]] = 0  # padding at the end
    probs = model.predict(x, verbose=0).astype("float32")
    y = probs.argmax(-1).astype("int32")
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.keras")
    np.savez(out / "eval.npz", x=x, y=y, probs=probs)
    np.savez(out / "calibration.npz", x=x)
    (out / "labels.json").write_text(json.dumps(["negative", "positive"]))
    vocab.save(out / "vocab.json")
    metrics = {
        "dataset": "toy-text",
        "seed": seed,
        "config": config.to_dict(),
        "test_accuracy": 1.0,
        "versions": {"keras": keras.__version__},
    }
    (out / "metrics.json").write_text(json.dumps(metrics))
    return out


def example_manifest() -> Manifest:
    """A valid two-mode digits manifest (int8 and float32), from the contract's classes."""

    def entry(mode: str, dtype: str, scale: float | None, zero_point: int | None) -> ModelEntry:
        return ModelEntry(
            mode=mode,
            file=f"model_{mode}.tflite",
            sha256="a" * 64,
            bytes=24000,
            input=TensorSpec("in", (1, 8, 8), dtype, scale, zero_point),
            output=TensorSpec("out", (1, 10), dtype, scale, zero_point),
            thresholds=default_thresholds(mode, 360),
            runtimes={"ai-edge-litert": True, "tflite-runtime": True},
            verified=True,
            parity=Parity(accuracy=0.98, agreement=1.0, max_abs_diff=0.08, mean_abs_diff=0.004),
            ops={"FULLY_CONNECTED": 4},
        )

    return Manifest(
        eval=EvalSpec("eval.npz", "c" * 64, 360, (360, 8, 8), "float32", 10, 0.98),
        files={"labels": FileRef("labels.json", "d" * 64)},
        models={
            "int8": entry("int8", "int8", 0.0039, -128),
            "float32": entry("float32", "float32", None, None),
        },
        created_by={"keras_mha": "0.1.0"},
        source_model=FileRef("model.keras", "b" * 64),
        dataset="digits",
    )


def copy_bundle(bundle: pathlib.Path, to: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(bundle, to))


def edit_manifest(bundle: pathlib.Path, edit) -> None:
    """Apply `edit(manifest_dict)` to bundle/manifest.json."""
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def match_model_file(bundle: pathlib.Path, mode: str) -> None:
    """Make the manifest's size and sha256 for `mode` match the file (as a forger would)."""
    path = bundle / f"model_{mode}.tflite"

    def edit(manifest):
        manifest["models"][mode].update(bytes=path.stat().st_size, sha256=sha256_file(path))

    edit_manifest(bundle, edit)


def match_file(bundle: pathlib.Path, key: str) -> None:
    """Make manifest `key` (eval, labels, vocab) sha256 match its file."""
    edit_manifest(bundle, lambda m: m[key].update(sha256=sha256_file(bundle / m[key]["file"])))


def run_main(main, argv: list[str]) -> tuple[int, str, str]:
    """`main(argv)` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def one_error_line(stderr: str, prog: str, *fragments: str) -> str:
    """Exactly one line `PROG: error: ...` holding every fragment, no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
