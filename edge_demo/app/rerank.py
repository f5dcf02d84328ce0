"""A cross-encoder bundle on the device: `--pair` (one score) and `--rerank` (an ordering).

`--pair "query" "passage"` (or `--sample N`, eval pair N) tokenizes the pair
as the checkpoint does (`[CLS] query [SEP] passage [SEP]`) and prints each
runnable mode's score. `--rerank QUERY FILE.txt` scores the query against
every line of the file with the first runnable mode (or `--quant MODE`) and
prints the lines best first with their scores: what a search pipeline asks
of a reranker.
"""

from __future__ import annotations

import numpy as np

from bundle_contract.arrays import own_lengths
from bundle_contract.bundle import Bundle
from bundle_contract.errors import UsageError, shown

from ..runtimes.model import InferenceError
from ..runtimes.runtime import Runtime
from ..tables import format_table
from .options import DemoOptions
from .search import embed, first_runnable, numbered_lines


def _encode(bundle: Bundle, pairs: list[tuple[str, str]], flag: str) -> np.ndarray:
    for query, passage in pairs:
        for what, text in (("query", query), ("passage", passage)):
            if not text.strip():
                raise UsageError(f"the {what} is empty; expected text", flag)
    try:
        ids, _ = bundle.tokenizer.encode_pairs(pairs)
    except UsageError as exc:
        raise UsageError(exc.problem, flag) from None
    return ids


def run_pair(
    bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict
) -> tuple[int, np.ndarray]:
    """`--pair Q P` or `--sample N`: each runnable mode's score (and the float model's for
    an eval pair). Returns (exit code, the pair's token ids)."""
    if options.pair is not None:
        (query, passage), what = options.pair, "pair"
        ids = _encode(bundle, [(query, passage)], "--pair")
    else:  # the eval input itself, the one the float reference scored
        (query, passage) = bundle.pairs[options.sample]
        what = f"eval pair {options.sample} of {bundle.manifest.eval.samples}"
        ids = bundle.eval.x[options.sample][None]
    length = int(own_lengths(ids, bundle.pad_id)[0])
    ids = ids[:, :length]
    pieces = bundle.tokenizer.tokenizer.id_to_token
    print(f'\n{what}:\n  query:   "{shown(query, 300)}"\n  passage: "{shown(passage, 500)}"')
    words = " ".join(shown(pieces(int(i)) or "?", 40) for i in ids[0][:length])
    print(f"word pieces ({length}): {words}")
    rows, errors = [], []
    if options.sample is not None:
        rows.append(["keras (float reference)", f"{bundle.eval.probs[options.sample, 0]:.6f}"])
    for mode, skipped in plan.items():
        if skipped is not None:
            rows.append([mode, skipped.status])
            continue
        try:
            score = embed(bundle, runtime, mode, ids, options.threads)[0, 0]
        except InferenceError as exc:
            rows.append([mode, "error"])
            errors.append(f"{mode}: error: {exc}")
            continue
        rows.append([mode, f"{score:.6f}"])
    print(format_table(["mode", "score"], rows, right={1}))
    for note in errors:
        print(note)
    return (1 if errors else 0), ids[0]


def run_rerank(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """`--rerank QUERY FILE.txt`: the file's lines, best first, with their scores."""
    query, path = options.rerank
    numbered = numbered_lines(path)
    lines = [text for _, text in numbered]
    ids = _encode(bundle, [(query, line) for line in lines], f"--rerank {path}")
    mode = first_runnable(plan)
    if mode is None:
        return 1
    try:
        scores = embed(bundle, runtime, mode, ids, options.threads)[:, 0]
    except InferenceError as exc:
        print(f"{mode}: error: {exc}")
        return 1
    order = np.argsort(-scores, kind="stable")  # ties keep the file's order
    print(f'\nquery: "{shown(query, 300)}"')
    print(f"{mode}: {len(lines)} lines of {shown(path)}, best first")
    rows = [[str(r + 1), f"{scores[i]:.4f}", str(numbered[i][0]), shown(lines[i], 90)]
            for r, i in enumerate(order)]  # fmt: skip
    print(format_table(["rank", "score", "line", "text"], rows, right={0, 1, 2}))
    return 0
