"""Language model: next-token logits over a KV cache the device carries.

The bundle's file has two signatures, prefill and decode (export/decoder.py;
the device's edge_demo/runtimes/generate.py), and the manifest's
`generation` entry says how to drive them: the context S, the prefill
chunk P, the cache's shape and bytes a token, the end token, and the chat
template as the text before and after a user's message.

eval.npz (`LanguageEval`):

    x (N, T) int32        held-out sentences in the model's tokens, right-padded
    lengths (N,)          each sentence's tokens (>= 2)
    top1 (N, T) int32     the float model's next token at each position (-1: none)
    margin (N, T)         its top logit minus the runner-up's, in nats
    nll (N, T)            its NLL of the sentence's next token (0: no next token)
    prompts (P, Tp) int32 prompts (sentence starts), right-padded
    prompt_lengths (P,)
    greedy (P, G) int32   the float model's first G greedy tokens after each

A mode is judged by what a user of a language model sees (`measure_language`,
`language_thresholds`): the next token, teacher-forced over the eval text;
the perplexity; the greedy continuation of each prompt.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib

import numpy as np

from ..arrays import EvalData, check_inputs, describe_array
from ..entries import EvalSpec, FileRef
from ..errors import UsageError
from ..fields import Fields
from ..files import MAX_FILE_BYTES, read_inside
from ..parity import Parity, Thresholds, changes_allowed
from ..subwords import MAX_TOKENIZER_BYTES, parse_tokenizer
from .base import Column, Task
from .registry import register

SETTINGS = "generation"  # the manifest's entry of how to drive the file
SIGNATURES = ("prefill", "decode")
MAX_CONTEXT = 32_768
MAX_PROMPTS = 256
MAX_GREEDY = 1024
MAX_TEMPLATE_CHARS = 4096
# The figures' meanings and bounds (docs/decoder.md, "Verified on the device").
DECIDED_MARGIN = 1.0  # nats: the float model prefers its token e times over the runner-up
PERPLEXITY_RATIO = {"float32": 1.001, "float16": 1.01, "dynamic": 1.02}


@dataclasses.dataclass(frozen=True)
class LanguageEval(EvalData):
    """eval.npz of a language model: `EvalData` (x, y = top1, probs = nll) and the rest."""

    lengths: np.ndarray | None = None
    margin: np.ndarray | None = None
    prompts: np.ndarray | None = None
    prompt_lengths: np.ndarray | None = None
    greedy: np.ndarray | None = None

    @property
    def scored(self) -> np.ndarray:
        """(N, T) bool: position t predicts token t + 1 of its sentence."""
        return np.arange(self.x.shape[1])[None, :] < (self.lengths[:, None] - 1)

    @property
    def decided(self) -> np.ndarray:
        """Scored positions where the float model's top logit leads by `DECIDED_MARGIN`."""
        return self.scored & (self.margin >= DECIDED_MARGIN)

    def prompt(self, row: int) -> list[int]:
        return [int(t) for t in self.prompts[row, : int(self.prompt_lengths[row])]]


@dataclasses.dataclass(frozen=True)
class LanguageOutputs:
    """A mode's answers on eval.npz, as the device computed them."""

    top1: np.ndarray  # (N, T) its next token at each position (teacher-forced)
    nll: np.ndarray  # (N, T) its NLL of each sentence's next token
    greedy: np.ndarray  # (P, G) its greedy tokens after each prompt


@dataclasses.dataclass(frozen=True)
class Generation:
    """The manifest's `generation` entry."""

    context: int  # S: positions the cache holds
    prefill: int  # P: prompt tokens a prefill call takes
    cache_shape: tuple[int, ...]  # (L, 2, 1, S, h_kv, d), float32
    query_heads: int
    eos_id: int | None = None
    chat_before: str | None = None  # the chat template around one user message
    chat_after: str | None = None

    @property
    def key_value_heads(self) -> int:
        return self.cache_shape[4]

    @property
    def cache_bytes_per_token(self) -> int:
        """float32 bytes the cache holds a token: L x 2 (keys, values) x h_kv x d x 4."""
        layers, _, _, _, heads, dim = self.cache_shape
        return layers * 2 * heads * dim * 4

    @property
    def cache_bytes_per_token_all_heads(self) -> int:
        """The same with every query head's keys and values cached: GQA's saving x h / h_kv."""
        return self.cache_bytes_per_token // self.key_value_heads * self.query_heads

    def to_json(self) -> dict:
        return {
            "context": self.context,
            "prefill": self.prefill,
            "cache_shape": list(self.cache_shape),
            "query_heads": self.query_heads,
            "key_value_heads": self.key_value_heads,
            # for people: the device derives both from cache_shape and checks them
            "cache_bytes_per_token": self.cache_bytes_per_token,
            "cache_bytes_per_token_all_heads": self.cache_bytes_per_token_all_heads,
            "eos_id": self.eos_id,
            "chat": None
            if self.chat_before is None
            else {"before": self.chat_before, "after": self.chat_after},
        }

    @classmethod
    def from_json(cls, fields: Fields, data: dict, evaluation: EvalSpec) -> Generation:
        entry = fields.obj(data, SETTINGS)
        p = f"{SETTINGS}."
        context = fields.integer(entry, "context", p, minimum=2, maximum=MAX_CONTEXT)
        prefill = fields.integer(entry, "prefill", p, minimum=1, maximum=context)
        shape = fields.shape(entry, "cache_shape", p)
        if len(shape) != 6 or shape[1] != 2 or shape[2] != 1 or shape[3] != context:
            raise fields.fail(
                p + "cache_shape", f"must be [L, 2, 1, {context}, h_kv, d], got {list(shape)}"
            )
        heads = fields.integer(entry, "query_heads", p, minimum=1, maximum=4096)
        eos = entry.get("eos_id")
        if eos is not None:
            eos = fields.integer(entry, "eos_id", p, minimum=0, maximum=evaluation.num_classes - 1)
        before = after = None
        if entry.get("chat") is not None:
            chat = fields.obj(entry, "chat", p)
            before, after = (_text(fields, chat, key, p + "chat.") for key in ("before", "after"))
        found = cls(context, prefill, tuple(shape), heads, eos, before, after)
        if heads % found.key_value_heads:
            raise fields.fail(p + "query_heads", f"is {heads}; the cache's "
                              f"{found.key_value_heads} key/value heads must divide it")  # fmt: skip
        for key in ("key_value_heads", "cache_bytes_per_token", "cache_bytes_per_token_all_heads"):
            if fields.integer(entry, key, p, minimum=1) != getattr(found, key):
                raise fields.fail(p + key, f"must be {getattr(found, key)} for the cache")
        return found


def _text(fields: Fields, data: dict, key: str, prefix: str) -> str:
    value = fields.get(data, key, prefix)
    if not isinstance(value, str) or len(value) > MAX_TEMPLATE_CHARS:
        raise fields.fail(prefix + key, f"must be text of at most {MAX_TEMPLATE_CHARS} characters")
    return value


class TextTokens:
    """The model's tokenizer.json: text to ids and back, no special tokens added
    (keras_mha.decoder.LanguageModel.encode, the ids the eval text was made of)."""

    def __init__(self, data: bytes, where: str | os.PathLike):
        self.tokenizer = parse_tokenizer(data, where)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


@register
class LanguageModel(Task):
    name = "language-model"
    output = "nll"
    labelled = False
    classes = False
    generates = True
    commands = {"--generate": "generate", "--chat": "chat"}
    fidelity = ("agreement", "decided_agreement", "perplexity_ratio")
    attention_samples = 0
    max_model_bytes = MAX_FILE_BYTES  # SmolLM2-135M in float32: 652 MB
    min_outputs = 2  # eval.num_classes: the vocabulary
    columns = (
        Column("top-1", "agreement", ".4f"),
        Column("decided", "decided_agreement", ".4f"),
        Column("ppl ×", "perplexity_ratio", ".5f"),
        Column("greedy", "greedy_prefix", ".3f"),
        Column("max|Δnll|", "max_abs_diff", ".2e"),
        Column("prefill tok/s", "prefill_tokens_per_s", ".1f"),
        Column("decode tok/s", "decode_tokens_per_s", ".1f"),
    )
    summary = (
        Column("decided", "decided_agreement", ".4f"),
        Column("ppl ×", "perplexity_ratio", ".5f"),
        Column("greedy", "greedy_prefix", ".3f"),
    )
    drops = ("accuracy", "agreement", "max|Δp|", "mean|Δp|", "attn max|Δ|", "attn tail",
             "attn agree", "p50 µs", "p90 µs", "p99 µs")  # fmt: skip

    def output_shape(self, spec: EvalSpec) -> tuple[int, ...]:
        return (spec.samples, spec.x_shape[1])

    def check_entry(
        self, fields: Fields, prefix: str, inp, out, signatures: dict, evaluation: EvalSpec
    ) -> None:
        """`input` and `output` are the decode signature's ids (1, 1) and logits
        (1, 1, V); prefill and decode take ids, cache, index and give logits, cache."""
        vocabulary = evaluation.num_classes
        if inp.shape != (1, 1) or inp.dtype != "int32":
            raise fields.fail(prefix + "input", f"must be int32 [1, 1] (decode's ids), got "
                              f"{inp.dtype} {list(inp.shape)}")  # fmt: skip
        if out.shape != (1, 1, vocabulary):
            raise fields.fail(prefix + "output.shape", f"must be [1, 1, {vocabulary}] "
                              f"(decode's logits), got {list(out.shape)}")  # fmt: skip
        for name in SIGNATURES:
            if name not in signatures:
                raise fields.fail(prefix + "signatures", f"has no {name!r} signature; a "
                                  "language model's file has prefill and decode")  # fmt: skip
            found = signatures[name]
            if set(found.inputs) != {"ids", "cache", "index"} or set(found.outputs) != {
                "logits",
                "cache",
            }:
                raise fields.fail(
                    f"{prefix}signatures.{name}",
                    "must take ids, cache and index and give logits and cache",
                )

    def check_models(self, fields: Fields, entries: dict, own: dict) -> None:
        """Each mode's cache and prefill chunk are the `generation` entry's."""
        settings = own["settings"]
        for mode, entry in entries.items():
            for name, width in (("prefill", settings.prefill), ("decode", 1)):
                found = entry.signatures[name]
                where = f"models.{mode}.signatures.{name}"
                cache = found.inputs["cache"].shape
                if cache != settings.cache_shape or found.outputs["cache"].shape != cache:
                    raise fields.fail(f"{where}.inputs.cache.shape", f"is {list(cache)}; "
                                      f"generation.cache_shape is {list(settings.cache_shape)}")  # fmt: skip
                if found.inputs["ids"].shape != (1, width):
                    raise fields.fail(f"{where}.inputs.ids.shape",
                                      f"must be [1, {width}], got "
                                      f"{list(found.inputs['ids'].shape)}")  # fmt: skip

    def eval_arrays(self, spec: EvalSpec) -> dict[str, int]:
        n, t = spec.x_shape[0], spec.x_shape[1]
        per_row = n * t * 8
        bound = MAX_PROMPTS * (MAX_CONTEXT + MAX_GREEDY) * 8
        return {"x": per_row, "lengths": n * 8, "top1": per_row, "margin": per_row,
                "nll": per_row, "prompts": bound, "prompt_lengths": MAX_PROMPTS * 8,
                "greedy": MAX_PROMPTS * MAX_GREEDY * 8}  # fmt: skip

    def check_eval(
        self, arrays: dict[str, np.ndarray], where: str | os.PathLike, pad_id: int = 0
    ) -> LanguageEval:
        return check_language_eval(arrays, where)

    def read_files(self, fields: Fields, data: dict, evaluation: EvalSpec) -> dict:
        return {
            "files": {"tokenizer": FileRef.from_json(fields, data, "tokenizer")},
            "settings": Generation.from_json(fields, data, evaluation),
        }

    def files_json(self, manifest) -> dict:
        return {"tokenizer": manifest.file("tokenizer").to_json(),
                SETTINGS: manifest.settings.to_json()}  # fmt: skip

    def load_files(self, root: pathlib.Path, manifest, evaluation: LanguageEval) -> dict:
        ref = manifest.file("tokenizer")
        where = root / ref.file
        tokens = TextTokens(
            read_inside(root, ref.file, ref.sha256, max_bytes=MAX_TOKENIZER_BYTES), where
        )
        vocabulary = manifest.eval.num_classes
        if tokens.vocab_size > vocabulary:
            raise UsageError(
                f"has {tokens.vocab_size} tokens but the model's logits have {vocabulary}", where
            )
        top = max(int(evaluation.x.max()), int(evaluation.prompts.max()))
        if top >= vocabulary:
            raise UsageError(f"eval.npz uses token id {top}; the model has {vocabulary}", where)
        settings = manifest.settings
        longest = int(evaluation.lengths.max())
        prompt = int(evaluation.prompt_lengths.max()) + evaluation.greedy.shape[1]
        if max(longest, prompt) > settings.context:
            raise UsageError(
                f"eval.npz needs {max(longest, prompt)} positions; generation.context is "
                f"{settings.context}",
                root / manifest.eval.file,
            )
        return {"tokenizer": tokens}

    def measure(self, outputs: LanguageOutputs, evaluation: LanguageEval) -> Parity:
        return measure_language(outputs, evaluation)

    def thresholds(self, mode: str, samples: int) -> Thresholds:
        """`samples`: the eval text's decided positions (export calls
        `language_thresholds` with its prompts too)."""
        return language_thresholds(mode, samples)

    def describe(self, num_classes: int, float_accuracy: float | None, max_length: int | None):
        return f"next-token logits over {num_classes:,} tokens"

    def figures(self, parity: Parity, float_accuracy: float | None) -> str:
        return (
            f"top-1 {parity.agreement:.4f} decided {parity.decided_agreement:.4f}  "
            f"perplexity x{parity.perplexity_ratio:.5f}  greedy {parity.greedy_prefix:.3f}"
        )


def _int_array(arrays, name, where, ndim):
    a = arrays[name]
    if a.ndim != ndim or a.dtype.kind not in "iu":
        raise UsageError(f"{name} must be an integer array of {ndim} axes, got "
                         f"{describe_array(a)}", where)  # fmt: skip
    return a.astype(np.int64)


def check_language_eval(arrays: dict[str, np.ndarray], where) -> LanguageEval:
    """A language model's eval.npz, every array against the others (UsageError naming `where`)."""
    x = _int_array(arrays, "x", where, 2)
    n, t = x.shape
    lengths = _int_array(arrays, "lengths", where, 1)
    top1 = _int_array(arrays, "top1", where, 2)
    prompts = _int_array(arrays, "prompts", where, 2)
    prompt_lengths = _int_array(arrays, "prompt_lengths", where, 1)
    greedy = _int_array(arrays, "greedy", where, 2)
    if lengths.shape != (n,) or not ((lengths >= 2) & (lengths <= t)).all():
        raise UsageError(f"lengths must be {n} values from 2 to {t}", where)
    for name in ("top1", "margin", "nll"):
        if arrays[name].shape != (n, t):
            raise UsageError(f"{name} must have x's shape {[n, t]}, got "
                             f"{describe_array(arrays[name])}", where)  # fmt: skip
    margin, nll = arrays["margin"], arrays["nll"]
    for name, a in (("margin", margin), ("nll", nll)):
        if a.dtype.kind != "f":
            raise UsageError(f"{name} must be float, got {describe_array(a)}", where)
        check_inputs(a, where, name)
    p = len(prompts)
    if not 1 <= p <= MAX_PROMPTS or prompt_lengths.shape != (p,) or greedy.shape[0] != p:
        raise UsageError(f"prompts, prompt_lengths and greedy must have the same 1 to "
                         f"{MAX_PROMPTS} rows", where)  # fmt: skip
    if not ((prompt_lengths >= 1) & (prompt_lengths <= prompts.shape[1])).all():
        raise UsageError(f"prompt_lengths must be from 1 to {prompts.shape[1]}", where)
    if not 1 <= greedy.shape[1] <= MAX_GREEDY:
        raise UsageError(f"greedy must hold 1 to {MAX_GREEDY} tokens a prompt", where)
    for name, a in (("x", x), ("prompts", prompts), ("greedy", greedy)):
        if int(a.min()) < 0:
            raise UsageError(f"{name} holds a negative token id", where)
    evaluation = LanguageEval(
        x.astype(np.int32), top1, nll.astype(np.float32), labelled=False,
        lengths=lengths, margin=margin.astype(np.float32), prompts=prompts.astype(np.int32),
        prompt_lengths=prompt_lengths, greedy=greedy,
    )  # fmt: skip
    scored = evaluation.scored
    if (top1[scored] < 0).any():
        raise UsageError("top1 has no token at a scored position", where)
    if not scored.any():
        raise UsageError("scores no position: every sentence needs two tokens", where)
    return evaluation


def next_token_figures(logits: np.ndarray, ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each position's top token, its lead over the runner-up (nats) and the NLL of
    the next id of `ids` (the last position's: 0), from logits `(T, V)`: what the
    float model's eval.npz holds (export) and what a mode gives (the device)."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    best2 = np.partition(logits, -2, axis=-1)[:, -2:]
    nll = np.zeros(len(logits))
    following = np.asarray(ids[1 : len(logits)], np.int64)
    nll[: len(following)] = log_z[: len(following)] - logits[np.arange(len(following)), following]
    return logits.argmax(-1), best2[:, 1] - best2[:, 0], nll


def prefix_length(ours, theirs) -> int:
    """How many tokens two greedy continuations share before they part."""
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if int(a) != int(b):
            return k
    return min(len(ours), len(theirs))


def measure_language(outputs: LanguageOutputs, evaluation: LanguageEval) -> Parity:
    """A mode's figures against the float model's (`LanguageEval`): next-token top-1
    agreement at every scored position (`agreement`) and at the decided ones; the
    perplexity ratio; the share of each prompt's greedy tokens repeated before the
    first change, averaged; |Δ| of each position's NLL."""
    scored, decided = evaluation.scored, evaluation.decided
    nll = np.asarray(outputs.nll, np.float64)
    if not np.isfinite(nll[scored]).all():
        return Parity(math.nan, math.nan, math.nan, math.nan)
    same = np.asarray(outputs.top1) == evaluation.y
    reference = np.asarray(evaluation.probs, np.float64)
    diff = np.abs(nll - reference)[scored]
    width = evaluation.greedy.shape[1]
    prefixes = [prefix_length(o, f) / width for o, f in zip(outputs.greedy, evaluation.greedy)]
    return Parity(
        accuracy=math.nan,
        agreement=float(same[scored].mean()),
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        decided_agreement=float(same[decided].mean()) if decided.any() else math.nan,
        perplexity_ratio=float(np.exp(nll[scored].mean() - reference[scored].mean())),
        greedy_prefix=float(np.mean(prefixes)),
    )


def language_thresholds(mode: str, decided: int, prompts: int = 8) -> Thresholds:
    """What export writes for a language model's `mode`, verified on an eval text with
    `decided` decided positions and `prompts` greedy prompts (docs/decoder.md):

    - decided next tokens: the classifiers' 1 % rule (`changes_allowed`) over the
      positions where the float model leads by `DECIDED_MARGIN` nats, every mode
      (a near-tie may go either way, and is reported in `agreement`, not bounded);
    - perplexity: at most `PERPLEXITY_RATIO[mode]` times the float model's;
    - greedy: float32, the same computation in another order, repeats every
      prompt's tokens but one prompt's (a tie within rounding); the other modes'
      continuations part for good at their first near-tie, so the figure is reported.
    """
    if mode not in PERPLEXITY_RATIO:
        raise ValueError(f"a language model has no {mode!r} mode")
    if decided < 1:
        raise ValueError("the eval text has no decided position")
    allowed = changes_allowed(decided)
    return Thresholds(
        min_decided_agreement=(decided - allowed) / decided,
        max_perplexity_ratio=PERPLEXITY_RATIO[mode],
        min_greedy_prefix=(prompts - 1) / prompts if mode == "float32" else None,
    )
