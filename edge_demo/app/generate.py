"""A language model's bundle on the device: `--generate "prompt"` and `--chat "message"`.

The first runnable mode (or `--quant MODE`) continues the prompt greedily,
streaming each token's text as it is chosen, and ends with the tokens a
second of the prompt (prefill calls) and of the answer (decode calls).
`--chat` wraps the message in the model's chat template (the manifest's
`generation.chat`, the text before and after one user message) and stops at
the end token; `--generate` continues the text as it is.
"""

from __future__ import annotations

import sys

from bundle_contract.bundle import Bundle
from bundle_contract.errors import UsageError

from ..runtimes.generate import CachedDecoder
from ..runtimes.runtime import Runtime
from .options import DemoOptions
from .search import first_runnable


class Stream:
    """Writes the text of the ids so far as each id arrives: only what is new, and
    only once it decodes to whole characters (a byte-level token can be half of one)."""

    def __init__(self, tokenizer, skip: int | None = None, out=None):
        self.tokenizer, self.skip, self.out = tokenizer, skip, out or sys.stdout
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, token: int) -> None:
        if token == self.skip:  # the end token that stops an answer is not part of it
            return
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a character still being spelled out
            return
        self.out.write(text[len(self.shown) :])
        self.out.flush()
        self.shown = text

    def finish(self) -> str:
        text = self.tokenizer.decode(self.ids)
        self.out.write(text[len(self.shown) :] + "\n")
        self.out.flush()
        return text


def prompt_ids(bundle: Bundle, options: DemoOptions) -> tuple[list[int], str, bool]:
    """(ids, the text they are, whether to stop at the end token) for the command given."""
    settings, tokens = bundle.manifest.settings, bundle.tokenizer
    chat = options.chat is not None
    flag, text = ("--chat", options.chat) if chat else ("--generate", options.generate)
    if not text.strip():
        raise UsageError("is empty; expected text", flag)
    if chat:
        if settings.chat_before is None:
            raise UsageError("this model has no chat template; use --generate", flag)
        text = settings.chat_before + text + settings.chat_after
    ids = tokens.encode(text)
    room = settings.context - options.max_new_tokens
    if len(ids) > room:
        raise UsageError(
            f"is {len(ids)} tokens; with {options.max_new_tokens} new ones the file's context "
            f"of {settings.context} holds {max(room, 0)} (export with a longer --context, or "
            "ask for fewer with --max-new-tokens)",
            flag,
        )
    return ids, text, chat


def run_generate(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """Stream the answer of one mode; 0, or 1 if the runtime failed running it."""
    ids, text, chat = prompt_ids(bundle, options)
    mode = first_runnable(plan)
    if mode is None:
        return 1
    entry = bundle.manifest.models[mode]
    decoder = CachedDecoder(
        runtime, bundle.model_bytes[mode], options.threads, str(bundle.path(entry.file))
    )
    decoder.check_entry(entry, bundle.path(entry.file))
    eos = bundle.manifest.settings.eos_id if chat else None
    print(f"\n{mode}, {len(ids)} prompt tokens:")
    stream = Stream(bundle.tokenizer, skip=eos)
    try:
        made = decoder.greedy(ids, options.max_new_tokens, eos, on_token=stream)
    except (RuntimeError, ValueError) as exc:
        print(f"\n{mode}: {runtime.name} failed running it: {exc}")
        return 1
    stream.finish()
    print(
        f"{len(made.new_ids)} new tokens; prefill {decoder.tokens_per_second('prefill'):.1f} "
        f"tokens/s ({decoder.tokens['prefill']} tokens), decode "
        f"{decoder.tokens_per_second('decode'):.1f} tokens/s ({decoder.tokens['decode']} calls), "
        f"{runtime.name}, {options.threads} thread(s)"
    )
    return 0
