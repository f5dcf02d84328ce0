"""`keras-mha-edge BUNDLE --sample N --view FILE.html` (or `--text "..."`): the head view page.

The page (`view/page.write_html`) shows the device model's own attention weights
(`EdgeModel.run_signature`, the entry's attention signature) for one input,
and its prediction. For an eval sample that `attention.npz` holds, the float
Keras model's weights and probabilities sit beside them; typed text has no
Keras reference on the device, so its page shows the device mode alone.

The mode shown: `--quant MODE`; with `all` or several modes, the first
verified of int8, int16x8, float32, then any other, in that order, whose
view is faithful, then one whose view is not (`view_mode`): an integer mode
is what a device runs, float32 the fallback. A mode whose view export marked
not faithful (its predictions hold, its attention weights do not:
docs/artifacts.md) is shown with a note saying so, with the figures.

An encoder's word pieces are shown as typed (`Subwords.typed`: the text
each covers, case kept; [CLS] and [SEP] by name), a piece typed right after
the one before it joined to it; the page opens on the first pronoun
(`view.page.initial_query`). When the manifest names the best coreference
head (`coref_head`), the page names it and opens on it.
"""

from __future__ import annotations

import pathlib

import numpy as np

from bundle_contract.attention import output_name
from bundle_contract.bundle import Bundle
from bundle_contract.errors import UsageError
from bundle_contract.files import check_output

from ..runtimes.model import EdgeModel, InferenceError
from ..runtimes.runtime import Runtime
from ..view.page import ViewData, initial_query, write_html

PREFERENCE = ("int8", "int16x8", "float32")


def check_view_path(path: pathlib.Path, bundle_root: pathlib.Path | None = None) -> None:
    """`--view FILE`: a new or regular file outside the bundle, writable (`check_output`)."""
    check_output(path, "--view", protected=bundle_root)


def view_mode(bundle: Bundle, runnable: list[str]) -> str:
    """The mode the page shows, from the runnable selected modes (module docstring)."""
    models = bundle.manifest.models
    with_view = [m for m in runnable if models[m].attention is not None]
    if not with_view:
        raise UsageError(
            f"no selected mode of {bundle.path('manifest.json')} has an attention signature "
            "(exported before attention weights were added?): re-export the bundle",
            "--view",
        )
    verified = [m for m in with_view if models[m].verified is not False]
    faithful = [m for m in verified if models[m].attention.faithful is not False]
    for candidates in (faithful, verified):
        for mode in (*PREFERENCE, *candidates):
            if mode in candidates:
                return mode
    return with_view[0]


def unfaithful_note(bundle: Bundle, mode: str) -> str | None:
    """What the page and the command say of a view export marked not faithful, or None."""
    entry = bundle.manifest.models[mode]
    check = entry.attention
    if check is None or check.faithful is not False:
        return None
    misses = "; ".join(check.misses()) or "its figures are not recorded"
    rows = f" over {check.parity.rows:,} rows" if check.parity is not None else ""
    held = "its predictions are verified; " if entry.verified else ""
    return (
        f"{mode}'s attention view is not faithful to the float model: export measured{rows} "
        f"{misses}; {held}read these weights as approximate"
    )


def write_view(
    bundle: Bundle,
    runtime: Runtime,
    mode: str,
    x: np.ndarray,
    path: pathlib.Path,
    *,
    threads: int = 1,
    sample: int | None = None,
    text: str | tuple[str, str] | None = None,
    dropped: tuple[str, ...] = (),
) -> list[str]:
    """Run input `x` (one sample) through `mode` and write the page; returns notes printed."""
    entry = bundle.manifest.models[mode]
    check = entry.attention
    if entry.dynamic_length:  # the sentence at its own length, as the device runs it
        x = x[: int(EdgeModel.own_lengths(x[None], bundle.pad_id)[0])]
    model = EdgeModel(
        runtime, bundle.model_bytes[mode], threads, str(bundle.path(entry.file)), bundle.pad_id
    )
    try:
        model.check_manifest(entry)
        probs = model.predict(x[None])[0]
        outputs = model.run_signature(check.signature, x[None])
    except InferenceError as exc:
        raise UsageError(f"{exc}; try --runtime litert or another --quant mode", "--view") from None
    finally:
        model.close()
    # the contract's names (entries.py checks the signature has exactly these)
    names = [output_name(i) for i in range(len(outputs))]
    missing = [name for name in names if name not in outputs]
    if missing:
        raise UsageError(
            f"{bundle.path(entry.file)}'s {check.signature} signature has no output "
            f"{missing[0]} (outputs must be {output_name(0)} ...); re-export the bundle",
            "--view",
        )
    device = [outputs[name][0] for name in names]
    notes = [f"attention from {mode} on {runtime.name} {runtime.version}"]
    unfaithful = unfaithful_note(bundle, mode)
    if unfaithful is not None:
        notes.insert(0, unfaithful)
    reference = reference_probs = None
    if sample is not None and bundle.attention is not None:
        if sample < bundle.attention[0].shape[0]:
            # the reference is at eval.npz's width; the page crops to the tokens
            reference = [layer[sample] for layer in bundle.attention]
            reference_probs = bundle.eval.probs[sample] if bundle.task.classes else None
        else:
            notes.append(
                f"no float Keras reference: attention.npz holds eval samples "
                f"0..{bundle.attention[0].shape[0] - 1}"
            )
    elif text is not None:
        notes.append(
            "typed text: no float Keras reference on the device (use --sample N for an "
            "eval sample with its reference, or keras-mha-heads view RUN_DIR)"
        )
    labels = list(bundle.labels)
    if not bundle.task.classes:
        probs = None  # no classes (a sentence vector): the page shows no prediction
    coref = bundle.manifest.coref_head
    common = {
        "device": device,
        "labels": labels,
        "probs": probs,
        "reference": reference,
        "reference_probs": reference_probs,
        "mode": mode,
        "notes": notes,
        "true_label": labels[int(bundle.eval.y[sample])]
        if sample is not None and bundle.eval.labelled
        else None,
        "named_head": None if coref is None else (coref.layer, coref.head),
        "named_head_caption": None if coref is None else coref.caption(),
    }
    if bundle.tokenizer is not None:  # the checkpoint's word pieces (texts.json's sentences)
        if bundle.pairs or isinstance(text, tuple):  # a cross-encoder's (query, passage)
            query, passage = text if text is not None else bundle.pairs[sample]
            sentence = f"{query} | {passage}"
            typed = bundle.tokenizer.typed(query, x, passage)
        else:
            sentence = text if text is not None else bundle.texts[sample]
            typed = bundle.tokenizer.typed(sentence, x)
        if typed is None:  # not the sentence's own pieces: show the raw ones
            vocabulary = bundle.tokenizer.tokenizer
            typed = [vocabulary.id_to_token(int(i)) or "?" for i in x], None
            notes.append("word pieces as the tokenizer wrote them (the text gives other ids)")
        tokens, joined = typed
        data = ViewData(
            tokens=tokens,
            joined=joined,
            input_kind="text",
            text=sentence,
            title=f'{mode}: "{sentence}"',
            initial_query=initial_query(tokens, joined),
            **common,
        )
    elif bundle.vocab is not None:
        tokens = bundle.vocab.decode(x)
        sentence = text if text is not None else " ".join(tokens)
        data = ViewData(
            tokens=tokens,
            input_kind="text",
            text=sentence,
            title=f'{mode}: "{sentence}"',
            dropped=dropped,
            initial_query=initial_query(tokens),
            **common,
        )
    elif x.ndim == 1 and x.dtype.kind in "iu":  # a user's token-id model, no vocabulary
        tokens = [f"#{int(i)}" for i in x]
        notes.append("token ids without a vocabulary (export with --vocab to see the words)")
        data = ViewData(
            tokens=tokens,
            input_kind="text",
            text=" ".join(tokens),
            title=f"{mode}: eval sample {sample}" if sample is not None else mode,
            **common,
        )
    else:
        pixels = np.asarray(x, np.float64)
        tokens = [f"row {i}" for i in range(pixels.shape[0])]
        data = ViewData(
            tokens=tokens,
            input_kind="pixels",
            pixels=pixels,
            title=f"{mode}: eval sample {sample}",
            **common,
        )
    write_html(path, data, flag="--view", protected=bundle.root)
    return notes
