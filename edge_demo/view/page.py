"""One self-contained HTML page showing where every attention head looks.

`write_html(path, ViewData(...))` writes a page with

- a head view: one layer, one colour per head; hover or click a token to see
  the lines from it (the query) to every key, thicker and darker where the
  head puts more weight; a named head (the best coreference head) is
  captioned, opened on and drawn over the others;
- a model view: a grid of layers x heads, each head's whole attention map
  (query rows down, key columns across, 0 white .. 1 dark), scaled to the
  window (at least 48 px a side; a narrower window scrolls the panel);
- the input beside them (a digit's pixels, one row per token, or the
  sentence's tokens, word pieces joined to the piece typed before them) and
  the prediction with its confidence;
- with a float reference, a toggle between the device mode, the reference
  and both side by side, and a table of the attention's own parity per layer
  (max |Δ| and how often each query's most-attended key agrees).

No network: no CDN, fonts or scripts from elsewhere; inline CSS, canvas/SVG
and a little plain JavaScript. The data is also embedded as JSON in
`<script type="application/json" id="attention-data">`. numpy and the
standard library only: the page can be made on the device.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from bundle_contract.files import write_bytes_atomic

from .assets import SCRIPT, STYLE

INPUT_KINDS = ("pixels", "text")
PRONOUNS = ("it", "they", "them", "he", "she", "him", "her")
_DIGITS = 4  # decimals kept in the page: 1e-4 is finer than an int8 quantum (1/256)


@dataclasses.dataclass
class ViewData:
    """What the page shows.

    Args:
        tokens: Names of the first `n` positions (`"row 0"`.. or words); a
            model input padded beyond them is cropped to `n`.
        device: One `(h, T, T)` float array per layer: the attention weights
            of the mode shown (dequantized), `T >= n`.
        labels: Class names, index = class id; empty for a sentence
            encoder (no prediction is shown).
        probs: `(C,)` class probabilities of the mode shown (None for an encoder).
        reference: Optional, like `device`: the float Keras model's weights.
        reference_probs: Optional `(C,)` probabilities of the reference.
        input_kind: `"pixels"` (then `pixels`, `(rows, cols)`, one row per
            token) or `"text"` (then `text`, the sentence as typed).
        mode: Name of what `device` comes from (`"int8"`, `"keras"`, ...).
        title: Page title.
        notes: Lines shown under the title (what the heads look at, ...).
        dropped: Words cut off because the input was longer than the model's
            `T`; the page says so in a banner.
        true_label: The label, when known (an eval sample).
        initial_query: Query row selected when the page opens (the pronoun's);
            default 0.
        initial_layer: Layer the head view opens on; default the named
            head's layer, else 0.
        joined: Optional, one flag per token: typed right after the token
            before it, no space between (a word in pieces, "didn" "'" "t");
            the page shows it attached to that token.
        named_head: Optional `(layer, head)` the page names and highlights
            (the best coreference head), with `named_head_caption`.
    """

    tokens: Sequence[str]
    device: Sequence[np.ndarray]
    labels: Sequence[str]
    probs: np.ndarray
    reference: Sequence[np.ndarray] | None = None
    reference_probs: np.ndarray | None = None
    input_kind: str = "text"
    pixels: np.ndarray | None = None
    text: str | None = None
    mode: str = "device"
    title: str = "Attention heads"
    notes: Sequence[str] = ()
    dropped: Sequence[str] = ()
    true_label: str | None = None
    initial_query: int | None = None
    initial_layer: int | None = None
    joined: Sequence[bool] | None = None
    named_head: tuple[int, int] | None = None
    named_head_caption: str | None = None


def initial_query(tokens: Sequence[str], joined: Sequence[bool] | None = None) -> int | None:
    """The first pronoun's position (the page opens on its row), or None.

    With `joined` (word pieces as typed, `Subwords.typed`), a pronoun is a
    whole word: not joined to the piece before it, nor followed by a joined
    letter or digit ("it" of "exit" or "itself" is none; "it" of "it's" is).
    """
    joined = joined or [False] * len(tokens)
    for i, token in enumerate(tokens):
        if token.lower() not in PRONOUNS or joined[i]:
            continue
        after = i + 1 < len(tokens) and joined[i + 1] and tokens[i + 1][:1].isalnum()
        if not after:
            return i
    return None


def _invalid(argument: str, expected: str, received) -> ValueError:
    return ValueError(
        f"Received an invalid value for argument `{argument}`, expected {expected}. "
        f"Received: {argument}={received}"
    )


def _layers(name: str, arrays: Sequence[np.ndarray], n: int) -> list[np.ndarray]:
    """Check `(h, T, T)` per layer with `T >= n`; crop to `(h, n, n)`."""
    if arrays is None or len(arrays) == 0:
        raise _invalid(name, "a non-empty list of (h, T, T) arrays, one per layer", arrays)
    out = []
    for i, a in enumerate(arrays):
        a = np.asarray(a, dtype=np.float64)
        if a.ndim != 3 or a.shape[1] != a.shape[2] or a.shape[1] < n or a.shape[0] < 1:
            raise _invalid(f"{name}[{i}]", f"shape (h, T, T) with T >= {n} tokens", a.shape)
        if not np.isfinite(a).all():
            raise _invalid(f"{name}[{i}]", "finite attention weights", "an array with NaN/inf")
        out.append(a[:, :n, :n])
    return out


def _probs(name: str, probs, classes: int) -> list[float]:
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if p.shape != (classes,) or not np.isfinite(p).all():
        raise _invalid(name, f"{classes} finite probabilities (one per label)", p.shape)
    return [round(float(v), 6) for v in p]


def parity(device: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> list[dict]:
    """Per layer: max |Δ| and the share of query rows whose most-attended key agrees."""
    rows = []
    for layer, (d, r) in enumerate(zip(device, reference, strict=True)):
        if d.shape != r.shape:
            raise _invalid(f"reference[{layer}]", f"the device's shape {d.shape}", r.shape)
        rows.append(
            {
                "layer": layer,
                "max_abs_diff": float(np.abs(d - r).max()),
                "argmax_agreement": float((d.argmax(-1) == r.argmax(-1)).mean()),
            }
        )
    return rows


def page_data(data: ViewData) -> dict:
    """The JSON the page embeds (and draws from); validates `data`."""
    tokens = [str(t) for t in data.tokens]
    n = len(tokens)
    if n == 0:
        raise _invalid("tokens", "at least one token", tokens)
    device = _layers("device", data.device, n)
    padding = int(np.asarray(data.device[0]).shape[-1]) - n
    reference = None if data.reference is None else _layers("reference", data.reference, n)
    labels = [str(label) for label in data.labels]
    if len(labels) == 1:
        raise _invalid("labels", "at least two class names, or none (an encoder)", labels)
    if data.input_kind not in INPUT_KINDS:
        raise _invalid("input_kind", f"one of {INPUT_KINDS}", repr(data.input_kind))
    source = {"kind": data.input_kind, "text": data.text}
    if data.input_kind == "pixels":
        pixels = None if data.pixels is None else np.asarray(data.pixels, dtype=np.float64)
        if pixels is None or pixels.ndim != 2 or pixels.shape[0] != n:
            shape = None if pixels is None else pixels.shape
            raise _invalid("pixels", f"a (rows, cols) image with one row per token ({n})", shape)
        scale = float(np.abs(pixels).max()) or 1.0
        source["pixels"] = np.round(pixels / scale, 3).tolist()
    query = 0 if data.initial_query is None else int(data.initial_query)
    if not 0 <= query < n:
        raise _invalid("initial_query", f"a token index in [0, {n})", data.initial_query)
    joined = [False] * n if data.joined is None else [bool(j) for j in data.joined]
    if len(joined) != n or joined[0]:
        raise _invalid("joined", f"{n} flags (one per token), the first false", data.joined)
    named = None
    if data.named_head is not None:
        heads = [int(a.shape[0]) for a in device]
        expected = f"(layer, head) of heads per layer {heads}"
        try:
            layer, head = (int(v) for v in data.named_head)
        except (TypeError, ValueError):
            raise _invalid("named_head", expected, data.named_head) from None
        if not (0 <= layer < len(device) and 0 <= head < heads[layer]):
            raise _invalid("named_head", expected, (layer, head))
        caption = data.named_head_caption or f"layer {layer} head {head}"
        named = {"layer": layer, "head": head, "caption": str(caption)}
    layer = data.initial_layer
    layer = (0 if named is None else named["layer"]) if layer is None else int(layer)
    if not 0 <= layer < len(device):
        raise _invalid("initial_layer", f"a layer index in [0, {len(device)})", data.initial_layer)
    probs = _probs("probs", data.probs, len(labels)) if labels else None

    def prediction(p: list[float] | None) -> dict | None:
        if p is None:
            return None
        best = int(np.argmax(p))
        return {"index": best, "label": labels[best], "confidence": p[best]}

    reference_probs = (
        None
        if data.reference_probs is None or not labels
        else _probs("reference_probs", data.reference_probs, len(labels))
    )
    return {
        "title": str(data.title),
        "mode": str(data.mode),
        "tokens": tokens,
        "padding": padding,
        "dropped": [str(w) for w in data.dropped],
        "heads": [int(a.shape[0]) for a in device],
        "device": [np.round(a, _DIGITS).tolist() for a in device],
        "reference": None
        if reference is None
        else [np.round(a, _DIGITS).tolist() for a in reference],
        "parity": None if reference is None else parity(device, reference),
        "labels": labels,
        "probs": probs,
        "prediction": prediction(probs),
        "reference_prediction": None if reference_probs is None else prediction(reference_probs),
        "true_label": None if data.true_label is None else str(data.true_label),
        "input": source,
        "notes": [str(note) for note in data.notes],
        "initial_query": query,
        "initial_layer": layer,
        "joined": joined,
        "named_head": named,
    }


def _json_for_script(value: dict) -> str:
    """JSON that cannot end the <script> element it sits in."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(data: ViewData) -> str:
    """The page as a string (UTF-8 HTML5, nothing loaded from elsewhere)."""
    values = page_data(data)
    title = html.escape(values["title"])
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n"
        f'<header><h1>{title}</h1><div id="summary"></div></header>\n'
        '<noscript><p class="warning">This page draws its views with JavaScript; '
        "the data is in the attention-data script element.</p></noscript>\n"
        '<div id="banners"></div>\n<div id="controls"></div>\n<main id="panels"></main>\n'
        f'<script type="application/json" id="attention-data">{_json_for_script(values)}</script>\n'
        f"<script>\n{SCRIPT}</script>\n</body>\n</html>\n"
    )


def write_html(
    path: str | os.PathLike,
    data: ViewData,
    flag: str | None = None,
    protected: str | os.PathLike | None = None,
) -> pathlib.Path:
    """Write the page to `path` atomically (a temporary file, then a rename).

    With `flag` (the user's option, e.g. "--view"), `path` must be a new or
    regular file outside `protected` (`files.check_output`).
    """
    text = render_html(data)  # validates before anything is written
    path = pathlib.Path(path)
    write_bytes_atomic(path, text.encode("utf-8", "backslashreplace"), flag, protected)
    return path
