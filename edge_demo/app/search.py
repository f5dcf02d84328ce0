"""An embedding bundle on the device: `--text` (semantic search) and `--embed` (vectors).

`--text "..."` tokenizes the sentence with the bundle's tokenizer.json,
embeds it in each runnable mode and prints the eval sentences nearest to it
by cosine (the vectors are unit length, so cosine is a dot product).
`--embed FILE.txt --out FILE.npy` writes one vector per line of a text file,
with the first runnable mode (or `--quant MODE`), for comparison with other
tools.
"""

from __future__ import annotations

import pathlib

import numpy as np

from bundle_contract.bundle import Bundle
from bundle_contract.errors import UsageError, shown
from bundle_contract.files import read_utf8, write_bytes_atomic

from ..runtimes.model import EdgeModel, InferenceError
from ..runtimes.policy import runtime_content, runtime_entry
from ..runtimes.runtime import Runtime
from ..tables import format_table
from .options import DemoOptions

TOP = 5
MAX_LINES = 100_000


def _runnable(plan: dict) -> list[str]:
    return [mode for mode, skipped in plan.items() if skipped is None]


def first_runnable(plan: dict) -> str | None:
    """The mode a one-mode command runs (the first runnable), or None after printing why
    every selected mode failed its probe."""
    runnable = _runnable(plan)
    if not runnable:
        for mode, result in plan.items():
            print(f"{mode}: {result.status}: {result.reason or '; '.join(result.failures)}")
        return None
    return runnable[0]


def embed(
    bundle: Bundle, runtime: Runtime, mode: str, ids: np.ndarray, threads: int = 1
) -> np.ndarray:
    """Token ids (N, T) -> (N, d) float32 vectors in `mode`, one sentence at a time."""
    entry = runtime_entry(bundle.manifest.models[mode], runtime)
    model = EdgeModel(
        runtime,
        runtime_content(bundle, mode, runtime),
        threads,
        str(bundle.path(entry.file)),
        bundle.pad_id,
    )
    try:
        model.check_manifest(entry)
        return model.predict(ids)
    finally:
        model.close()


def _tokenize(bundle: Bundle, texts: list[str], flag: str) -> np.ndarray:
    try:
        ids, lengths = bundle.tokenizer.encode(texts)
    except UsageError as exc:
        raise UsageError(exc.problem, flag) from None
    if (lengths <= 2).any():  # [CLS] [SEP] only
        row = int(np.argmax(lengths <= 2))
        raise UsageError(f"line {row + 1} has no words to embed", flag)
    return ids


def run_search(
    bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict
) -> tuple[int, np.ndarray]:
    """`--text` (or `--sample N`, eval sentence N): the eval sentences nearest to it, per
    runnable mode. Returns (exit code, the sentence's token ids)."""
    flag = "--text" if options.text is not None else "--sample"
    sentence = options.text if options.text is not None else bundle.texts[options.sample]
    ids = _tokenize(bundle, [sentence], flag)
    pieces, _ = bundle.tokenizer.pieces(sentence)
    what = "text" if options.text is not None else f"eval sentence {options.sample}"
    print(f'\n{what}: "{shown(sentence, 500)}"')
    print(f"word pieces ({len(pieces)}): {' '.join(shown(p, 40) for p in pieces)}")
    errors = []
    for mode in _runnable(plan):
        try:
            vector = embed(bundle, runtime, mode, ids, options.threads)[0]
        except InferenceError as exc:
            errors.append(f"{mode}: error: {exc}")
            continue
        scores = bundle.eval.probs @ vector
        best = np.argsort(-scores, kind="stable")[:TOP]
        rows = [[f"{scores[i]:.3f}", shown(bundle.texts[i], 90)] for i in best]
        print(f"\n{mode}: nearest of the {len(bundle.texts)} eval sentences")
        print(format_table(["cosine", "sentence"], rows, right={0}))
    for mode, skipped in plan.items():
        if skipped is not None:
            print(f"{mode}: {skipped.status}: {skipped.reason or '; '.join(skipped.failures)}")
    for note in errors:
        print(note)
    return (1 if errors else 0), ids[0]


def read_lines(path: pathlib.Path) -> list[str]:
    """The sentences of a UTF-8 text file, one per non-blank line."""
    return [text for _, text in numbered_lines(path)]


def numbered_lines(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line number in the file, text) of each non-blank line of a UTF-8 text file."""
    _, text = read_utf8(path)
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise UsageError("has no sentences (one per line)", path)
    if len(lines) > MAX_LINES:
        raise UsageError(f"has {len(lines)} lines; at most {MAX_LINES}", path)
    return lines


def run_embed(bundle: Bundle, runtime: Runtime, options: DemoOptions, plan: dict) -> int:
    """`--embed FILE.txt --out FILE.npy`: (N, d) float32, written atomically."""
    lines = read_lines(options.embed)
    ids = _tokenize(bundle, lines, f"--embed {options.embed}")
    mode = first_runnable(plan)
    if mode is None:
        return 1
    try:
        vectors = embed(bundle, runtime, mode, ids, options.threads)
    except InferenceError as exc:
        print(f"{mode}: error: {exc}")
        return 1
    import io

    buffer = io.BytesIO()
    np.save(buffer, vectors.astype(np.float32), allow_pickle=False)
    write_bytes_atomic(options.out, buffer.getvalue())
    print(f"wrote {shown(options.out)}: {vectors.shape[0]} x {vectors.shape[1]} float32 ({mode})")
    return 0
