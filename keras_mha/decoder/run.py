"""A language model as a run directory (keras-mha-import SOURCE --out RUN).

The run is a transformers Llama folder, so everything that reads one reads it
(keras_mha.decoder.load, transformers' LlamaForCausalLM):

    config.json             the sizes (DecoderConfig.to_llama_config)
    model.safetensors       every weight in float32, transformers' names; a GGUF's
                            dequantized, its query and key rows in Hugging Face's order
    tokenizer.json          Hugging Face `tokenizers`
    tokenizer_config.json   the chat template, the end token
    metrics.json            task "language-model", the source and its sha256, the
                            versions, the sha256 of each file above

It is written beside `out` and renamed into place: whole or not at all.
Reading it back is a safetensors map, not a dequantization: what the
backends' tests and make llm load after one import.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import pathlib
import shutil

from bundle_contract.files import _umask, sha256_file, staging_dir, swap_into_place

TASK = "language-model"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def versions() -> dict[str, str]:
    import platform

    import keras
    import numpy as np

    from keras_mha import __version__

    found = {"keras_mha": __version__, "keras": keras.__version__, "numpy": np.__version__,
             "python": platform.python_version()}  # fmt: skip
    for name in ("gguf", "tokenizers", "safetensors"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def require_run(run_dir) -> pathlib.Path:
    """`run_dir` as a language model's run folder; a UsageError saying how to
    make one (for a GGUF file, a known name, another folder)."""
    from bundle_contract.errors import UsageError

    folder = pathlib.Path(run_dir)
    if not (folder / "model.safetensors").is_file():
        raise UsageError(
            f"is not a language model's run; make one with keras-mha-import {run_dir} --out RUN",
            run_dir,
        )
    return folder


@dataclasses.dataclass(frozen=True)
class LanguageRun:
    """A language model's run as keras_mha.rundir.tasks.read_any gives it: its
    folder and task; `load()` builds the model (keras_mha.decoder.load)."""

    path: pathlib.Path
    task: object

    def load(self, implementation: str = "fused"):
        from . import load

        return load(self.path, implementation)


def read_language_run(run_dir) -> LanguageRun:
    """keras_mha.rundir.tasks' reader of a language model's run (checked, not loaded)."""
    from bundle_contract.tasks import get

    return LanguageRun(require_run(run_dir), get(TASK))


def _source_sha256(source, parts) -> str | None:
    """The pinned sha256 of a KNOWN name (checked when read), else the file's."""
    from . import KNOWN

    if str(source) in KNOWN:
        return KNOWN[str(source)]["sha256"]
    return sha256_file(parts.source_file) if parts.source_file is not None else None


def import_language_model(source, out, overwrite: bool = False, log=print) -> pathlib.Path:
    """Read `source` (a KNOWN name, a .gguf file, a Llama folder), check that its
    weights build our Decoder, and write the run `out`; returns its path."""
    from safetensors.numpy import save_file

    from keras_mha.rundir.writing import check_out

    from . import build, read_parts

    out = check_out(out, overwrite)
    parts = read_parts(source)
    lm = build(parts)  # every tensor there and of its shape, or one line
    c = parts.config
    log(f"{source}: {c.num_hidden_layers} blocks, {c.num_attention_heads} query heads in "
        f"{c.num_key_value_heads} key/value groups, d_model {c.hidden_size}, "
        f"{lm.model.count_params():,} weights")  # fmt: skip
    del lm
    staging = staging_dir(out)
    try:
        (staging / "config.json").write_text(json.dumps(c.to_llama_config(), indent=1) + "\n")
        save_file(dict(parts.tensors), str(staging / "model.safetensors"))
        parts.tokenizer.save(str(staging / "tokenizer.json"))
        eos = c.eos_token_id
        settings = {
            "chat_template": parts.chat_template,
            "eos_token": parts.tokenizer.id_to_token(eos) if eos is not None else None,
        }
        (staging / "tokenizer_config.json").write_text(json.dumps(settings, indent=1) + "\n")
        mode = 0o666 & ~_umask()  # safetensors writes 0600; a run is read by others too
        for name in FILES:
            os.chmod(staging / name, mode)
        metrics = {
            "task": TASK,
            "source": str(source),
            "source_sha256": _source_sha256(source, parts),
            "config": c.to_dict(),
            "versions": versions(),
            "files": {name: sha256_file(staging / name) for name in FILES},
        }
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        swap_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"wrote {out} (keras_mha.decoder.load reads it; so does transformers)")
    return out
