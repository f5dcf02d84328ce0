"""Export a language model's run (keras-mha-import) as a verified decoder bundle.

`export_language_model(run, out, modes, context=, prefill=)` is what
`export_bundle` does for a run whose task generates (tasks/language_model.py):

1. the run loaded as our Decoder (keras_mha.decoder.load) and `out` checked;
2. the float model's reference, in eval.npz: the held-out corpus sentences
   (the head tools' eval text, keras_mha/decoder/heads.py) with its next token,
   top-two margin and NLL at every position, and the first `GREEDY` greedy
   tokens after each of `PROMPTS` prompts (each sentence's first half);
3. each mode converted with its prefill and decode signatures and its cache
   (export/decoder.py), the file's graph checked;
4. the staged bundle opened with the device's loader and each mode scored by
   the device's own code (edge_demo/runtimes/generate.py `score_mode`) against
   the task's thresholds; a mode that misses them is left out, with its figures;
5. the manifest written, read back, and the bundle renamed into place.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import pathlib
import time

import numpy as np

from bundle_contract.bundle import add_file, open_bundle
from bundle_contract.entries import EvalSpec, FileRef, ModelEntry, Signature
from bundle_contract.errors import UsageError
from bundle_contract.files import building, sha256_file
from bundle_contract.manifest import Manifest
from bundle_contract.tasks import get as get_task
from bundle_contract.tasks.language_model import (
    SIGNATURES,
    Generation,
    LanguageModel,
    check_language_eval,
    language_thresholds,
    next_token_figures,
)
from bundle_contract.tensors import TensorSpec

from .common import ExportFailed, check_target, tool_versions
from .decoder import DECODER_MODES, PREFILL, cache_shape, check_sizes

PROMPTS = 8  # greedy prompts: the first eval sentences' first halves
PROMPT_TOKENS = 24  # at most, a prompt
GREEDY = 16  # greedy tokens compared after each prompt
CONTEXT = 256  # the file's positions unless --context says otherwise
CHAT_SENTINEL = "\x00MESSAGE\x00"  # stands for the user's message while the template renders
TASK = get_task(LanguageModel.name)


def parse_decoder_modes(modes) -> tuple[str, ...]:
    """`"all"` or a comma list -> the decoder's modes in order (UsageError naming the rest)."""
    names = modes.split(",") if isinstance(modes, str) else list(modes)
    names = [str(n).strip() for n in names if str(n).strip()]
    if not names or "all" in names:
        return DECODER_MODES
    unknown = [n for n in names if n not in DECODER_MODES]
    if unknown:
        raise UsageError(
            f"a language model exports as {', '.join(DECODER_MODES)}, not {unknown[0]!r}",
            "--quant",
        )
    return tuple(m for m in DECODER_MODES if m in names)


def reference(lm, context: int) -> dict[str, np.ndarray]:
    """eval.npz's arrays: the float model on the eval text and its greedy tokens."""
    from keras_mha.decoder.heads import BATCH, eval_text

    text = eval_text(lm)
    lengths = text.valid.sum(1) + 1
    keep = lengths <= context  # a sentence the context cannot hold is left out
    if not keep.any():
        raise UsageError(f"holds none of the eval sentences (the shortest has "
                         f"{int(lengths.min())} tokens)", f"--context {context}")  # fmt: skip
    ids, lengths = text.ids[keep][:, : int(lengths[keep].max())], lengths[keep]
    count = min(PROMPTS, len(ids))
    width = min(PROMPT_TOKENS, max(1, int(lengths[:count].max()) // 2))
    if width + GREEDY > context:
        raise UsageError(f"is too short for a prompt of {width} and {GREEDY} new tokens",
                         f"--context {context}")  # fmt: skip
    n, t = ids.shape
    top1, margin, nll = np.full((n, t), -1, np.int32), np.zeros((n, t)), np.zeros((n, t))
    for start in range(0, n, BATCH):
        for row, logits in enumerate(lm.logits(ids[start : start + BATCH]), start):
            length = int(lengths[row])
            found = next_token_figures(logits[:length], ids[row, :length])
            top1[row, :length], margin[row, : length - 1], nll[row, :length] = (
                found[0], found[1][:-1], found[2])  # fmt: skip
    prompts = np.zeros((count, width), np.int32)
    prompt_lengths = np.zeros(count, np.int32)
    greedy = np.zeros((count, GREEDY), np.int32)
    for row in range(count):
        prompt = ids[row, : max(1, min(width, int(lengths[row]) // 2))]
        prompts[row, : len(prompt)], prompt_lengths[row] = prompt, len(prompt)
        greedy[row] = lm.generate_ids(prompt, GREEDY, stop_at_eos=False).new_ids[:GREEDY]
    return {"x": ids.astype(np.int32), "lengths": lengths.astype(np.int32), "top1": top1,
            "margin": margin.astype(np.float32), "nll": nll.astype(np.float32),
            "prompts": prompts, "prompt_lengths": prompt_lengths, "greedy": greedy}  # fmt: skip


def chat_parts(lm) -> tuple[str | None, str | None]:
    """The chat template around one user message (before, after), or (None, None)."""
    if not lm.chat_template:
        return None, None
    rendered = lm.chat_prompt(CHAT_SENTINEL)
    if rendered.count(CHAT_SENTINEL) != 1:
        return None, None
    before, after = rendered.split(CHAT_SENTINEL)
    return before, after


def _signature_specs(content: bytes, runtime) -> dict[str, Signature]:
    """The file's prefill and decode tensors, as the device's runtime reads them."""
    from edge_demo.runtimes.generate import CachedDecoder

    decoder = CachedDecoder(runtime, content, 1)
    found = {}
    for name in SIGNATURES:
        runner = getattr(decoder, name)
        found[name] = Signature(
            inputs={k: TensorSpec.from_detail({**d, "name": k})
                    for k, d in runner.get_input_details().items()},
            outputs={k: TensorSpec.from_detail({**d, "name": k})
                     for k, d in runner.get_output_details().items()},
        )  # fmt: skip
    return found


def _graph(content: bytes) -> tuple[dict, dict, dict, bool]:
    """(ops, weights by dtype, problems by check, tflite-runtime 2.14 can load it)
    over both subgraphs: builtin ops only and no dynamic dimension."""
    from .graph import op_histogram, read_graph, tflite_runtime_214_can_load, weight_dtypes

    ops, weights, problems, loads = {}, {}, {"builtin_only": [], "fixed_shapes": []}, True
    first = read_graph(content)
    for index in range(first.num_subgraphs):
        graph = first if index == 0 else read_graph(content, index)
        for name, count in op_histogram(graph).items():
            ops[name] = ops.get(name, 0) + count
        if index == 0:
            weights = weight_dtypes(graph)  # the subgraphs share the weight buffers
        problems["builtin_only"] += [f"custom op {op.name[7:]}" for op in graph.ops if op.custom]
        for i in (*graph.inputs, *graph.outputs):
            tensor = graph.tensor(i)
            if any(d < 0 for d in tensor.shape_signature or tensor.shape):
                problems["fixed_shapes"].append(f"{tensor.name} has a dynamic dimension")
        loads = loads and tflite_runtime_214_can_load(graph)
    return dict(sorted(ops.items())), weights, problems, loads


def export_language_model(
    run_dir,
    out=None,
    modes="all",
    *,
    context: int | None = None,
    prefill: int | None = None,
    overwrite: bool = False,
    allow_parity_failure: bool = False,
    log=None,
) -> Manifest:
    """Convert, verify and bundle a language model's run; the manifest written.

    Raises UsageError for bad input and `common.ExportFailed` when no mode
    verifies; nothing is written then."""
    import keras_mha.decoder as decoder_lib
    from keras_mha.decoder.run import require_run

    from .decoder import convert_decoder
    from .entry import judge
    from .verify import verification_runtime, verify_staged

    log = log or (lambda line: None)
    started = time.perf_counter()
    selected = parse_decoder_modes(modes)
    run = require_run(run_dir)
    out = pathlib.Path(out) if out is not None else run / "bundle"
    check_target(out, overwrite, {"model": run / "model.safetensors"})
    lm = decoder_lib.load(run)
    config = lm.config
    context = min(CONTEXT, config.max_position_embeddings) if context is None else context
    prefill = min(PREFILL, context) if prefill is None else prefill
    check_sizes(config, context, prefill)
    arrays = reference(lm, context)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    evaluation = check_language_eval(arrays, "eval.npz")
    decided = int(evaluation.decided.sum())
    log(
        f"{run}: {config.num_hidden_layers} blocks, {config.num_attention_heads} query heads in "
        f"{config.num_key_value_heads} key/value groups, vocabulary {config.vocab_size:,}; "
        f"context {context}, prefill {prefill}; eval {int(evaluation.scored.sum())} next tokens "
        f"({decided} decided), {len(evaluation.greedy)} prompts x {GREEDY} greedy tokens"
    )
    if decided < 1:
        raise UsageError("the float model is decided (1 nat ahead) at no eval position", run)
    before, after = chat_parts(lm)
    settings = Generation(
        context=context,
        prefill=prefill,
        cache_shape=cache_shape(config, context),
        query_heads=config.num_attention_heads,
        eos_id=config.eos_token_id,
        chat_before=before,
        chat_after=after,
    )
    runtime = verification_runtime()
    with building(out) as staging:
        eval_ref = add_file(staging, "eval.npz", buffer.getvalue())
        tokenizer = add_file(staging, "tokenizer.json", (run / "tokenizer.json").read_bytes())
        entries, problems = {}, {}
        for mode in selected:
            start = time.perf_counter()
            content = convert_decoder(lm.model, mode, context, prefill)
            seconds = time.perf_counter() - start
            ref = add_file(staging, f"model_{mode}.tflite", content)
            ops, weights, found, loads = _graph(content)
            signatures = _signature_specs(content, runtime)
            problems[mode] = [f"{c}: {'; '.join(f)}" for c, f in found.items() if f]
            entries[mode] = ModelEntry(
                mode=mode, file=ref.file, sha256=ref.sha256, bytes=len(content),
                input=signatures["decode"].inputs["ids"],
                output=signatures["decode"].outputs["logits"],
                thresholds=language_thresholds(mode, decided, len(evaluation.greedy)),
                runtimes={"tflite-runtime": loads, "tflite-micro": False},
                micro={"reason": "a language model's cache is bigger than a microcontroller's "
                       "memory; TensorFlow Lite Micro runs the classifiers"},
                ops=ops, signatures=signatures, weights=weights,
                checks={c: not f for c, f in found.items()},
                convert_seconds=round(seconds, 3),
            )  # fmt: skip
            log(f"  {mode}: {len(content) / 1e6:.1f} MB in {seconds:.1f} s")

        def manifest(models, failed=None) -> Manifest:
            return Manifest(
                eval=EvalSpec(
                    eval_ref.file,
                    eval_ref.sha256,
                    len(evaluation.x),
                    tuple(evaluation.x.shape),
                    "int32",
                    config.vocab_size,
                    None,
                    TASK.name,
                ),  # fmt: skip
                models=models,
                files={"tokenizer": tokenizer},
                settings=settings,
                created_by=tool_versions(),
                created_at=datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                source_model=FileRef("model.safetensors", sha256_file(run / "model.safetensors")),
                dataset="keras_mha/pretrained/corpus.txt (held out)",
                requested=selected,
                failed=failed or {},
                export_seconds=round(time.perf_counter() - started, 2),
            )

        manifest(entries).write(staging)
        results = verify_staged(staging, runtime)
        kept, failed = {}, {}
        float32_bytes = entries["float32"].bytes if "float32" in entries else None
        for mode, entry in entries.items():
            judged, failure = judge(entry, problems[mode], results[mode], runtime.name)
            judged = dataclasses.replace(
                judged, size_vs_float32=round(judged.bytes / float32_bytes, 4)
                if float32_bytes else None,
            )  # fmt: skip
            r = results[mode]
            log(f"  {mode}: {TASK.figures(judged.parity, None) if judged.parity else '-'}  "
                f"prefill {r.prefill_tokens_per_s:.0f} tok/s, decode "
                f"{r.decode_tokens_per_s:.0f} tok/s  "
                f"{'verified' if failure is None else 'FAILED: ' + '; '.join(failure.reasons)}")  # fmt: skip
            if failure is not None:
                failed[mode] = failure
            if failure is None or allow_parity_failure:
                kept[mode] = judged
            else:
                (staging / entry.file).unlink()
        final = manifest(kept, failed)
        if not kept:
            raise ExportFailed(
                "no mode passed verification ("
                + "; ".join(f"{mode}: {info.reasons[0]}" for mode, info in failed.items())
                + "); no bundle written",
                final,
            )
        final.write(staging)
        open_bundle(staging)  # the bundle as written reads back on the device
    return final
