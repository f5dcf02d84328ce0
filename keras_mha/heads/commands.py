"""The six commands of keras-mha-heads, each `cmd_NAME(args) -> exit status`.

Each reads its run through `keras_mha.rundir`, computes with the library
rooms of this package and writes JSON, PNGs and pages into `RUN_DIR/heads/`
(or a new run directory for `prune`; `coref` writes RUN_DIR/heads/coref.json,
or its `--json` instead), always atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import numpy as np

from bundle_contract.errors import UsageError
from bundle_contract.files import check_writable, sha256_file, write_json_atomic
from keras_mha.heads import plotting
from keras_mha.heads.importance import head_importance, scoring_data
from keras_mha.heads.masks import accuracy, all_heads_on, as_removal, heads_per_layer, predict
from keras_mha.heads.reconstruction import reconstruct, reconstruction_record
from keras_mha.heads.retrain import finetune
from keras_mha.heads.selection import pruning_curve, select_heads_to_prune
from keras_mha.heads.statistics import cue_accuracy, paired_drop
from keras_mha.heads.surgery import prune_model
from keras_mha.rundir import RunWriter, check_out, read_run

HEADS_DIR = "heads"


def _heads_dir(run_dir: str) -> pathlib.Path:
    """RUN_DIR/heads/, checked writable before any work."""
    out = pathlib.Path(run_dir) / HEADS_DIR
    check_writable(out / "importance.json", "RUN_DIR")
    return out


def cmd_importance(args: argparse.Namespace) -> int:
    from keras_mha.decoder import is_language_model
    from keras_mha.rundir.tasks import task_of

    if is_language_model(args.run_dir):  # query heads and key/value groups, by perplexity
        from keras_mha.heads.decoder_commands import cmd_importance_language_model

        return cmd_importance_language_model(args)
    if not task_of(args.run_dir).labelled:  # no labels (an imported encoder): label-free
        from keras_mha.heads.encoder_commands import cmd_importance_embedding

        return cmd_importance_embedding(args)
    run = read_run(args.run_dir)
    out = _heads_dir(args.run_dir)
    model = run.load_model()
    x_score, y_score = scoring_data(run.load_dataset(), args.split)
    scores = head_importance(model, x_score, y_score)
    ev = run.eval
    base_probs = predict(model, ev.x)
    base = float((base_probs.argmax(-1) == ev.y).mean())
    cues = ev.extras.get("cue")
    rows = []
    for layer, score in enumerate(scores):
        for head, value in enumerate(score):
            head_masks = all_heads_on(model)
            head_masks[layer][head] = 0.0
            probs = predict(model, ev.x, head_masks)
            row = {
                "layer": layer,
                "head": head,
                "importance": float(value),
                "accuracy_without": float((probs.argmax(-1) == ev.y).mean()),
            }
            if cues is not None:
                row["cue_accuracy_without"] = cue_accuracy(probs, ev.y, cues)
            rows.append(row)
    result = {
        "run": str(args.run_dir),
        "split": args.split,
        "split_size": len(y_score),
        "test_accuracy": base,
        "heads": rows,
    }
    if cues is not None:
        result["cue_accuracy"] = cue_accuracy(base_probs, ev.y, cues)
    print(f"test accuracy with every head: {base:.4f}")
    print(f"{'layer':>5} {'head':>4} {'importance':>10} {'acc without':>11}")
    for r in rows:
        print(
            f"{r['layer']:5d} {r['head']:4d} {r['importance']:10.4f} {r['accuracy_without']:11.4f}"
        )
    write_json_atomic(out / "importance.json", result)
    plotting.plot_importance(rows, args.split, out / "importance.png")
    print(f"wrote {out / 'importance.json'} and {out / 'importance.png'}")
    return 0


def cmd_curve(args: argparse.Namespace) -> int:
    if not 0.0 < args.step < 1.0:
        raise UsageError(f"--step must be in (0, 1); got {args.step}")
    run = read_run(args.run_dir)
    out = _heads_dir(args.run_dir)
    model = run.load_model()
    data = run.load_dataset()
    x_score, y_score = scoring_data(data, args.split)
    x_reconstruct = data.x_train if args.reconstruct else None
    points = pruning_curve(
        model, run.config, x_score, y_score, run.eval.x, run.eval.y, args.step, x_reconstruct
    )
    print(f"test accuracy, importance on the {args.split} split")
    print(
        f"{'pruned':>7} {'accuracy':>8}" + (f" {'reconstructed':>13}" if args.reconstruct else "")
    )
    for p in points:
        line = f"{p['fraction']:7.0%} {p['accuracy']:8.4f}"
        if args.reconstruct:
            line += f" {p['accuracy_reconstructed']:13.4f}"
        print(line)
    record = reconstruction_record(len(data.x_train)) if args.reconstruct else None
    write_json_atomic(
        out / "curve.json",
        {
            "run": str(args.run_dir),
            "step": args.step,
            "split": args.split,
            "reconstruction": record,
            "points": points,
        },
    )
    plotting.plot_curve(points, args.split, args.reconstruct, out / "curve.png")
    print(f"wrote {out / 'curve.json'} and {out / 'curve.png'}")
    return 0


def _check_prune_args(args: argparse.Namespace) -> None:
    if not 0.0 <= args.fraction < 1.0:
        raise UsageError(f"--fraction must be in [0, 1); got {args.fraction}")
    if not args.finetune_lr > 0:
        raise UsageError(f"--finetune-lr must be > 0; got {args.finetune_lr}")
    if pathlib.Path(args.out).resolve() == pathlib.Path(args.run_dir).resolve():
        raise UsageError("the output must differ from the source run", f"--out {args.out}")
    check_out(args.out, args.overwrite)
    check_writable(args.out, "--out")


def cmd_prune(args: argparse.Namespace) -> int:
    from keras_mha.rundir.tasks import task_of

    if not task_of(args.run_dir).labelled:  # no labels to fine-tune on: refit only
        from keras_mha.heads.encoder_commands import cmd_prune_embedding

        return cmd_prune_embedding(args)
    _check_prune_args(args)
    run = read_run(args.run_dir)
    model = run.load_model()
    ev = run.eval
    with RunWriter(args.out, args.overwrite) as writer:  # nothing replaces --out on failure
        data = run.load_dataset()
        correct_before = predict(model, ev.x).argmax(-1) == ev.y
        before = float(correct_before.mean())
        x_score, y_score = scoring_data(data, args.split)
        removed = select_heads_to_prune(model, x_score, y_score, args.fraction)
        pruned, config = prune_model(model, as_removal(removed), run.config)
        after = accuracy(pruned, ev.x, ev.y)
        reconstructed = None
        if args.reconstruct:
            reconstruct(model, pruned, data.x_train)
            reconstructed = accuracy(pruned, ev.x, ev.y)
        finetuned = finetuned_with = None
        if args.finetune_epochs:
            finetuned_with = finetune(
                pruned, data, run.metrics, args.finetune_epochs, args.finetune_lr
            )
            finetuned = accuracy(pruned, ev.x, ev.y)
        probs = predict(pruned, ev.x).astype("float32")
        drop = paired_drop(correct_before, probs.argmax(-1) == ev.y)
        from keras_mha.model import count_params

        pruning = {
            "source_run": str(args.run_dir),
            "fraction_requested": args.fraction,
            "importance_split": args.split,
            "heads_before": heads_per_layer(model),
            "heads_after": heads_per_layer(pruned),
            "removed": [list(p) for p in removed],
            "fraction_removed": len(removed) / sum(heads_per_layer(model)),
            "params_before": count_params(model),
            "params_after": count_params(pruned),
            "test_accuracy_before": before,
            "test_accuracy_pruned": after,
            "reconstruction": reconstruction_record(len(data.x_train))
            if args.reconstruct
            else None,
            "test_accuracy_reconstructed": reconstructed,
            "test_accuracy_finetuned": finetuned,
            "finetune_epochs": args.finetune_epochs,
            "finetune_learning_rate": args.finetune_lr if args.finetune_epochs else None,
            "finetune": finetuned_with,
            "test_drop": drop,
        }
        metrics = {
            **run.metrics,
            "test_accuracy": float((probs.argmax(-1) == ev.y).mean()),
            "num_params": count_params(pruned),
            "pruning": pruning,
        }
        writer.write(
            pruned, metrics, config, ev.with_probs(probs), run.calibration, run.labels, run.vocab
        )
    _print_pruning(pruning, args, drop)
    _plot_removed(args.run_dir, args.out, removed)
    return 0


def _plot_removed(run_dir: str, out: str, removed) -> None:
    """The source run's importance bars with the removed heads marked, into OUT/heads/."""
    source = pathlib.Path(run_dir) / HEADS_DIR / "importance.json"
    if not source.is_file():
        return
    result = json.loads(source.read_text())
    path = pathlib.Path(out) / HEADS_DIR / "importance_removed.png"
    plotting.plot_importance(result["heads"], result["split"], path, {tuple(p) for p in removed})
    print(f"wrote {path}")


def _print_pruning(p: dict, args: argparse.Namespace, drop: dict) -> None:
    total = sum(p["heads_before"])
    print(
        f"removed {len(p['removed'])}/{total} heads {p['removed']}: heads per layer "
        f"{p['heads_before']} -> {p['heads_after']}, "
        f"params {p['params_before']} -> {p['params_after']}"
    )
    line = (
        f"test accuracy {p['test_accuracy_before']:.4f} -> {p['test_accuracy_pruned']:.4f} pruned"
    )
    if p["test_accuracy_reconstructed"] is not None:
        line += f" -> {p['test_accuracy_reconstructed']:.4f} reconstructed"
    if p["test_accuracy_finetuned"] is not None:
        line += (
            f" -> {p['test_accuracy_finetuned']:.4f} after {args.finetune_epochs} fine-tune epochs"
        )
        if not p["finetune"]["improved"]:
            line += " (no epoch beat the start's validation loss; start kept)"
    print(line)
    low, high = drop["ci95_points"]
    print(
        f"drop {drop['points']:.2f} points (test examples lost/gained: {drop['lost']}/"
        f"{drop['gained']} of {drop['examples']}); 95 % paired bootstrap interval "
        f"{low:.2f} to {high:.2f} points"
    )
    print(f"wrote {args.out}")


@dataclasses.dataclass
class _Sample:
    """One eval input of a run, with the float Keras model's attention and prediction."""

    x: np.ndarray  # (1, T, ...) as the model takes it
    label: int
    probs: np.ndarray  # (C,)
    scores: list[np.ndarray]  # per layer (h, T, S)
    tokens: list[str]  # the unpadded tokens ("row i" for digits)
    pronoun_index: int | None  # text: the (last) pronoun's position


def _sample(run, sample: int) -> _Sample:
    n = len(run.eval.x)
    if not 0 <= sample < n:
        raise UsageError(f"--sample must be in [0, {n}); got {sample}")
    from keras import ops

    from keras_mha.model import forward

    model = run.load_model()
    x = run.eval.x[sample : sample + 1]
    probs, scores = forward(model, x, return_attention_scores=True)
    pronoun_index = None
    if run.vocab is not None:
        length = max(1, int((x[0] != run.vocab.pad_id).sum()))
        tokens = [run.vocab.tokens[i] for i in x[0][:length]]
        for i, t in enumerate(tokens):
            if t in ("it", "they"):
                pronoun_index = i
    else:
        tokens = [f"row {i}" for i in range(x.shape[1])]
    return _Sample(
        x=x,
        label=int(run.eval.y[sample]),
        probs=ops.convert_to_numpy(probs)[0],
        scores=[ops.convert_to_numpy(s)[0] for s in scores],
        tokens=tokens,
        pronoun_index=pronoun_index,
    )


def cmd_plot(args: argparse.Namespace) -> int:
    default = pathlib.Path(args.run_dir) / HEADS_DIR / f"heads_sample{args.sample}.png"
    out = check_writable(args.out or default, "--out" if args.out else "RUN_DIR")
    run = read_run(args.run_dir)
    s = _sample(run, args.sample)
    pred = int(s.probs.argmax())
    title = f"label {run.labels[s.label]}, predicted {run.labels[pred]}"
    image = None
    if run.vocab is None:
        image, title = s.x[0], f"input: {title}"
    rows = plotting.plot_sample(image, s.tokens, s.scores, title, out, s.pronoun_index)
    if s.pronoun_index is not None:
        tokens = s.tokens
        print(f"attention of '{tokens[s.pronoun_index]}' (row {s.pronoun_index}) per head:")
        for (layer, head), row in rows.items():
            top = np.argsort(row)[::-1][:3]
            print(
                f"  layer {layer} head {head}: "
                + ", ".join(f"{tokens[j]} {row[j]:.2f}" for j in top)
            )
    print(f"wrote {out}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    """The head view page (edge_demo.view.page) from the float Keras model.

    `--sample N` (default 0): eval input N; `--text "..."`: a sentence of
    your own, for a model that reads words (an embedding run's word pieces
    or a classifier's vocab.json). The page names the best coreference head
    when RUN_DIR/heads/coref.json (keras-mha-heads coref) is for this model.
    """
    from keras_mha.rundir.tasks import read_any

    text = getattr(args, "text", None)
    if text is not None and args.sample is not None:
        raise UsageError("give --sample N or --text, not both", "--text")
    sample = 0 if text is None and args.sample is None else args.sample
    name = "view_text.html" if text is not None else f"view_sample{sample}.html"
    default = pathlib.Path(args.run_dir) / HEADS_DIR / name
    out = check_writable(args.out or default, "--out" if args.out else "RUN_DIR")
    run = read_any(args.run_dir)  # read once, by its task's reader
    if getattr(run, "tokenizer", None) is not None:  # word pieces
        data = _encoder_view(run, sample, text)
    else:
        data = _classifier_view(run, sample, text)
    from edge_demo.view.page import write_html

    write_html(out, data)
    print(f"wrote {out}")
    return 0


def _named_head(run_dir: str, heads_per_layer, model_file) -> dict:
    """ViewData's named head from RUN_DIR/heads/coref.json (printing why not, if stale)."""
    from keras_mha.heads.coref import read_best_head

    head, note = read_best_head(run_dir, heads_per_layer, model_file)
    if note is not None:
        print(f"note: {note}")
    if head is None:
        return {}
    return {"named_head": (head.layer, head.head), "named_head_caption": head.caption()}


def _encoder_view(run, sample: int | None, text: str | None):
    """An embedding run's page: word pieces as typed, the float encoder's attention."""
    from keras import ops

    from bundle_contract.arrays import own_lengths
    from edge_demo.view.page import ViewData, initial_query
    from keras_mha.pretrained.bert import encoder_forward

    notes = []
    if text is None:
        n = len(run.texts)
        if not 0 <= sample < n:
            raise UsageError(f"--sample must be in [0, {n}); got {sample}")
        sentence, ids = run.texts[sample], run.eval.x[sample]
        ids = ids[: int(own_lengths(ids[None], run.pad_id)[0])]  # without the padding
        title = f"{run.dataset} sentence {sample}"
        if isinstance(sentence, tuple):  # a cross-encoder's (query, passage)
            title = f"{run.dataset} pair {sample}"
    elif run.config.score_activation:
        raise UsageError("a cross-encoder's view shows an eval pair: use --sample N", "--text")
    else:
        sentence = text
        ids = run.tokenizer.encode([text])[0][0]
        title = "your sentence"
        if len(run.tokenizer.tokenizer.encode(text).overflowing):
            notes.append(f"truncated to max_length {run.max_length} word pieces")
    model = run.load_model()
    _, weights = encoder_forward(model, ids[None], return_attention=True)
    if isinstance(sentence, tuple):
        typed = run.tokenizer.typed(sentence[0], ids, sentence[1])
        sentence = f"{sentence[0]} | {sentence[1]}"
    else:
        typed = run.tokenizer.typed(sentence, ids)
    if typed is None:  # eval ids that are not the sentence's own pieces: show the raw ones
        vocabulary = run.tokenizer.tokenizer
        typed = [vocabulary.id_to_token(int(i)) or "?" for i in ids], None
        notes.append("word pieces as the tokenizer wrote them (the text gives other ids)")
    tokens, joined = typed
    return ViewData(
        tokens=tokens,
        joined=joined,
        device=[ops.convert_to_numpy(w)[0] for w in weights],
        labels=[],
        probs=None,
        input_kind="text",
        text=sentence,
        mode="keras",
        title=f'{title}: "{sentence}", the float Keras encoder\'s heads',
        notes=notes,
        initial_query=initial_query(tokens, joined),
        **_named_head(run.path, run.heads_per_layer, run.model_file),
    )


def _classifier_view(run, sample: int | None, text: str | None):
    """A trained run's page: eval input `sample`, or `text` through its vocab.json."""
    from edge_demo.view.page import ViewData, initial_query

    if text is not None and run.vocab is None:
        raise UsageError(
            f"needs a model that reads words (a run with vocab.json); {run.dataset} takes "
            "--sample N",
            "--text",
        )
    if text is None:
        s = _sample(run, sample)
        probs, scores, tokens, query = s.probs, s.scores, s.tokens, s.pronoun_index
        true_label, dropped = run.labels[s.label], ()
        title = f"{run.dataset} sample {sample}: the float Keras model's heads"
    else:
        from keras import ops

        from keras_mha.model import forward

        encoded = run.vocab.analyze(text)
        if not encoded.words:
            raise UsageError(
                f"no words found (token_pattern {run.vocab.token_pattern!r})", "--text"
            )
        probs, weights = forward(run.load_model(), encoded.ids[None], return_attention_scores=True)
        probs, scores = (
            ops.convert_to_numpy(probs)[0],
            [ops.convert_to_numpy(w)[0] for w in weights],
        )
        tokens = run.vocab.decode(encoded.ids)
        query, true_label = initial_query(tokens), None
        dropped = encoded.words[run.vocab.max_length :]
        title = f'"{text}": the float Keras model\'s heads'
    common = dict(
        tokens=tokens,
        device=scores,
        labels=list(run.labels),
        probs=probs,
        mode="keras",
        title=title,
        true_label=true_label,
    )
    if run.vocab is None:  # digits: the pixels, one row per token
        return ViewData(input_kind="pixels", pixels=s.x[0], **common)
    return ViewData(
        input_kind="text",
        text=" ".join(tokens) if text is None else text,
        dropped=dropped,
        **common,
        initial_query=query,
        **_named_head(run.path, [int(a.shape[0]) for a in scores], run.model_file),
    )


# ------------------------------------------------------------------- coref
MAX_SENTENCES = 20_000
_BATCH = 64
_LESSON_HEADS = 5  # the lesson sentence's line shows the best heads


def cmd_coref(args: argparse.Namespace) -> int:
    """Which heads look from the pronoun at its referent (keras_mha.heads.coref)."""
    from keras_mha.data import generate_pronouns
    from keras_mha.heads import coref

    if not 1 <= args.sentences <= MAX_SENTENCES:
        raise UsageError(f"--sentences must be in [1, {MAX_SENTENCES}]; got {args.sentences}")
    from keras_mha.decoder import is_language_model

    if is_language_model(args.run_dir):  # a run, not the GGUF or name it came from
        from keras_mha.decoder.run import require_run

        require_run(args.run_dir)
    if args.json is not None:
        out = check_writable(args.json, "--json")
    else:
        out = check_writable(pathlib.Path(args.run_dir) / coref.COREF_FILE, "RUN_DIR")
    tm = coref.token_model(args.run_dir)
    texts, labels, cues, counts = generate_pronouns(args.sentences, args.seed)
    sentences = [coref.parse_sentence(*row) for row in zip(texts, labels.tolist(), cues.tolist())]
    assert [len(s.candidates) for s in sentences] == counts.tolist()  # the grammar's nouns
    lesson = coref.parse_sentence(coref.LESSON, coref.LESSON_LABEL)
    pronouns, candidates, weights, correct = [], [], [], []
    heads_per_layer = None
    everything = [*sentences, lesson]
    for start in range(0, len(everything), _BATCH):
        batch = everything[start : start + _BATCH]
        attention, predicted = tm.attention([s.text for s in batch])
        for i, (s, a) in enumerate(zip(batch, attention)):
            try:
                pronoun, nouns = coref.token_spans(s, tm.offsets(s.text))
            except ValueError as error:
                raise UsageError(str(error), args.run_dir) from None
            heads_per_layer = heads_per_layer or [int(layer.shape[0]) for layer in a]
            pronouns.append(pronoun)
            candidates.append(nouns)
            weights.append(coref.candidate_weights(a, pronoun, nouns))
            if predicted is not None and s is not lesson:
                correct.append(int(predicted[i]) == s.label)
    lesson_weights = weights.pop()
    pronouns.pop()
    candidates.pop()
    result = coref.score_weights(
        weights, pronouns, candidates, labels, cues, heads_per_layer, args.bootstrap, args.seed
    )
    record = _lesson_record(
        lesson, lesson_weights, heads_per_layer, result, tm.unknown(lesson.text)
    )
    model_accuracy = float(np.mean(correct)) if correct else None
    _print_coref(result, record, tm.kind, model_accuracy, args.seed)
    write_json_atomic(
        out,
        {
            "run": str(args.run_dir),
            "model": tm.kind,
            "model_sha256": sha256_file(tm.model_file),
            "heads_per_layer": heads_per_layer,
            "seed": args.seed,
            "model_accuracy": model_accuracy,
            **result.to_json(),
            "lesson": record,
        },
    )
    print(f"wrote {out}")
    return 0


def _lesson_record(lesson, weights: np.ndarray, heads_per_layer, result, unknown) -> dict:
    """The lesson sentence's weights from "it" onto its two nouns, every head, best first."""
    from keras_mha.heads.coref import head_names

    pronoun, nouns = lesson.words()
    flat = {name: j for j, name in enumerate(head_names(heads_per_layer))}
    rows = []
    for h in result.heads:
        w = weights[flat[h.layer, h.head]]
        rows.append({"name": h.name, **{n: float(v) for n, v in zip(nouns, w)}})
    return {
        "text": lesson.text,
        "pronoun": pronoun,
        "candidates": nouns,
        "referent": nouns[lesson.label],
        "unknown_words": list(unknown),
        "heads_picking_referent": int((weights.argmax(-1) == lesson.label).sum()),
        "heads": rows,
    }


def _print_coref(result, lesson: dict, kind: str, model_accuracy, seed: int) -> None:
    cues = ", ".join(f"{c} {n}" for c, n in result.cues.items())
    total = len(result.heads)
    print(
        f"coreference probe ({kind} model): {result.sentences} pronoun sentences "
        f"(seed {seed}; {cues}), {total} heads, 95 % intervals from "
        f"{result.resamples} bootstrap resamples"
    )
    if model_accuracy is not None:
        print(f"the classifier's own accuracy on these sentences: {model_accuracy:.3f}")
    names = list(result.cues)
    header = f"{'head':<13} {'accuracy':>8} {'95 % interval':>13}" + "".join(
        f" {c:>8}" for c in names
    )
    print(header)

    def line(s) -> str:
        low, high = s.ci95
        return f"{s.name:<13} {s.accuracy:8.3f} {low:6.3f}-{high:<6.3f}" + "".join(
            f" {s.by_cue[c]:8.3f}" for c in names
        )

    for s in result.heads[:10]:
        print(line(s))
    if total > 10:
        print(f"... {total - 10} more heads")
    for s in result.baselines:
        print(line(s))
    above, surely = result.beating()
    print(
        f"{above} of {total} heads beat the nearest noun "
        f"({surely} with the whole interval above it)"
    )
    nouns = lesson["candidates"]
    shown = ", ".join(
        f"{h['name']} " + " / ".join(f"{h[n]:.2f}" for n in nouns)
        for h in lesson["heads"][:_LESSON_HEADS]
    )
    print(
        f'lesson: "{lesson["text"]}" weight of "{lesson["pronoun"]}" on '
        f"{' / '.join(nouns)}: {shown}; {lesson['heads_picking_referent']} of {total} heads "
        f"pick {lesson['referent']}"
        + (
            f" (unknown to the tokenizer: {', '.join(lesson['unknown_words'])})"
            if lesson["unknown_words"]
            else ""
        )
    )
