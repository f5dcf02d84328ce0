"""The PyTorch oracle for the decoder: what transformers' LlamaForCausalLM computes.

Runs in the torch venv (.venv-torch: torch, transformers, tokenizers); a test
oracle, never imported by the library.

    python tests/oracle/llama_oracle.py tiny OUT_DIR --layers L --heads H --kv-heads G
        --hidden D --intermediate F [--seed 0] [--rope-theta 10000] [--std 0.2]
    python tests/oracle/llama_oracle.py reference MODEL PROMPTS.txt OUT.npz
        [--new-tokens 16]
    python tests/oracle/llama_oracle.py serve   (commands as JSON lines on stdin)

`tiny` writes a random LlamaForCausalLM (grouped-query attention, RoPE, RMSNorm,
SwiGLU, tied embeddings) with `save_pretrained` (config.json,
model.safetensors) and a byte-level BPE tokenizer trained on the project's
corpus (tokenizer.json, bert_oracle.py's; <s> 0, <pad> 1, </s> 2). Its weights are drawn with
std --std (transformers' default 0.02 gives a random model near-uniform
logits, whose greedy choices would be near ties).

`reference` (MODEL: a saved folder, or a .gguf file, which transformers
dequantizes and reads its tokenizer from) writes OUT.npz, for prompt n (one a
line, no special tokens; a line starting "chat: " is a user's message in the
model's chat template, rendered by transformers' tokenizer):
`ids_n` the prompt's ids, `logits_n` (T, V) the logits of every position,
`attention_n_l` (h, T, T) layer l's attention weights (eager attention), and
`generated_n` the --new-tokens ids of `generate(do_sample=False)` with its
KV cache (fewer with --stop-at-eos, which ends at the end token), `gaps_n`
each step's top-two logit gap (of the model's logits).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402


def setup_torch():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch


def write_tokenizer(out: pathlib.Path) -> int:
    """The RoBERTa oracle's byte-level BPE on the corpus (<s> 0, <pad> 1, </s> 2),
    without its sentence template: a prompt is its own tokens."""
    from bert_oracle import CORPUS, byte_level_bpe, read_sentences  # beside this file

    tokenizer = byte_level_bpe(read_sentences(CORPUS))
    tokenizer.post_processor = None
    tokenizer.save(str(out / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def tiny(args) -> int:
    torch = setup_torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=args.rope_theta,
        tie_word_embeddings=True,
        initializer_range=args.std,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # RMSNorm scales away from 1, so a wrong one shows
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
    model.save_pretrained(out, safe_serialization=True)
    print(f"tiny llama: {args.layers} layers, {args.heads}/{args.kv_heads} heads, vocab {vocab}")
    return 0


CHAT = "chat: "  # a prompts line so marked is a user's message in the chat template


def reference(args) -> int:
    torch = setup_torch()
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    source = pathlib.Path(args.model)
    if source.suffix == ".gguf":  # transformers dequantizes it and undoes llama.cpp's rows
        from transformers import AutoTokenizer

        where = dict(pretrained_model_name_or_path=source.parent, gguf_file=source.name)
        model = LlamaForCausalLM.from_pretrained(
            **where, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        hf_tokenizer = AutoTokenizer.from_pretrained(**where)

        def encode(text):
            if text.startswith(CHAT):
                text = hf_tokenizer.apply_chat_template(
                    [{"role": "user", "content": text[len(CHAT) :]}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            return hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        model = LlamaForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
        tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))

        def encode(text):
            return tokenizer.encode(text, add_special_tokens=False).ids

    prompts = [p for p in pathlib.Path(args.prompts).read_text(encoding="utf-8").splitlines() if p]
    arrays = {}
    with torch.no_grad():
        for n, prompt in enumerate(prompts):
            ids = encode(prompt)
            x = torch.tensor([ids])
            out = model(x, output_attentions=True)
            arrays[f"ids_{n}"] = np.asarray(ids, np.int64)
            arrays[f"logits_{n}"] = out.logits[0].float().numpy()
            for layer, weights in enumerate(out.attentions):
                arrays[f"attention_{n}_{layer}"] = weights[0].float().numpy()
            generated = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=args.new_tokens,
                min_new_tokens=None if args.stop_at_eos else args.new_tokens,
                do_sample=False,
                use_cache=True,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=1,
            )
            arrays[f"generated_{n}"] = generated.sequences[0, len(ids) :].numpy()
            gaps = []
            for scores in generated.logits:  # the model's, before any processor
                top = torch.topk(scores[0].float(), 2).values
                gaps.append(float(top[0] - top[1]))
            arrays[f"gaps_{n}"] = np.asarray(gaps)
    np.savez(args.out, prompts=np.asarray(prompts), **arrays)
    print(f"reference: {len(prompts)} prompts, {args.new_tokens} new tokens each")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="llama_oracle.py")
    commands = top.add_subparsers(dest="command", required=True)
    t = commands.add_parser("tiny")
    t.add_argument("out")
    for name in ("layers", "heads", "kv-heads", "hidden", "intermediate"):
        t.add_argument(f"--{name}", type=int, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--rope-theta", type=float, default=10000.0)
    t.add_argument("--std", type=float, default=0.2)
    r = commands.add_parser("reference")
    r.add_argument("model")
    r.add_argument("prompts")
    r.add_argument("out")
    r.add_argument("--new-tokens", type=int, default=16)
    r.add_argument("--stop-at-eos", action="store_true", help="else min_new_tokens=new_tokens")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return tiny(args) if args.command == "tiny" else reference(args)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        import serving  # beside this file: the script's folder is on sys.path

        sys.exit(serving.serve(main))
    sys.exit(main())
