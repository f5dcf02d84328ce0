"""A coreference probe: which heads look from a pronoun at the noun it means.

For every sentence of the pronoun task (`keras_mha.data.generate_pronouns`)
and every head, the pronoun's query row of the attention weights is summed
over each candidate noun's tokens (the word pieces of a noun count as one
word); the head *picks* the candidate with the most weight. A head's accuracy
is the share of sentences in which it picks the referent (the label), overall
and per cue, with a 95 % percentile bootstrap interval over sentences.

Three baselines score the same sentences: the nearest noun (the candidate
closest before the pronoun), the first noun, and chance (1 / candidates,
averaged). With two or three candidates and the referent at a random
position, all three are near 0.4.

The probe itself is NumPy on arrays and character offsets; `token_model`
loads the model a run directory holds (an imported encoder or a classifier
that reads words) as a `TokenModel`, its tokens' offsets and attention, and
the command (`keras_mha.heads.commands.cmd_coref`) runs it.

    sentence = parse_sentence(text, label, cue)     # character spans of the words
    pronoun, nouns = token_spans(sentence, offsets)  # token spans in one tokenization
    result = probe(attention, pronouns, candidates, labels, cues)

The command writes its table to RUN_DIR/heads/coref.json (`COREF_FILE`) with
the sha256 of the model.keras it probed; `read_best_head` gives its best head
to the head view pages and to export (the bundle manifest's `coref_head`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections.abc import Sequence

import numpy as np

from bundle_contract.errors import UsageError
from keras_mha.data import CUES, PRONOUN

LESSON = "The animal didn't cross the street because it was too tired."
LESSON_LABEL = 0  # "it" is the animal
WORD = re.compile(r"[a-z0-9']+")  # bundle_contract.vocab.TOKEN_PATTERN
PRONOUNS = tuple(p for p, _ in PRONOUN.values())  # ("it", "they")
BASELINES = ("nearest noun", "first noun", "chance")
COREF_FILE = pathlib.Path("heads") / "coref.json"  # in the run directory

Span = tuple[int, int]  # [start, end): characters of a text, or token positions


# ------------------------------------------------------------------ sentences
@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence's pronoun and candidate nouns, as character spans of `text`."""

    text: str
    pronoun: Span
    candidates: tuple[Span, ...]  # in the order of the sentence
    label: int  # index into candidates: the referent
    cue: str = ""

    def words(self) -> tuple[str, list[str]]:
        """(the pronoun, the candidate nouns) as written."""
        return self.text[slice(*self.pronoun)], [self.text[slice(*c)] for c in self.candidates]


def parse_sentence(text: str, label: int, cue: str = "") -> Sentence:
    """The pronoun and candidates of a sentence in the generator's style.

    The grammar (keras_mha.data.generate_sentence) writes every candidate
    noun right after "the" ("the A verb the B [to the C] because it/they
    ..."), so the candidates are the words after "the" before the pronoun,
    the first "it" or "they". The lesson's sentence has the same shape.
    """
    words = [(m.group(), m.span()) for m in WORD.finditer(text.lower())]
    at = next((i for i, (w, _) in enumerate(words) if w in PRONOUNS), None)
    if at is None:
        raise ValueError(f"no pronoun ({' or '.join(PRONOUNS)}) in {text!r}")
    candidates = tuple(words[i + 1][1] for i in range(at - 1) if words[i][0] == "the")
    if len(candidates) < 2:
        raise ValueError(f"fewer than two candidate nouns before the pronoun in {text!r}")
    if not 0 <= label < len(candidates):
        raise ValueError(f"label {label} for {len(candidates)} candidate nouns in {text!r}")
    return Sentence(text, words[at][1], candidates, int(label), str(cue))


def word_offsets(text: str, pattern: str = WORD.pattern, max_length: int | None = None):
    """Character spans of a word-level tokenizer's tokens (a `Vocab`: lower case, findall).

    With one group in `pattern` (a Vocab may have one), the token is the group.
    """
    regex = re.compile(pattern)
    spans = [m.span(1) if regex.groups else m.span() for m in regex.finditer(text.lower())]
    return spans if max_length is None else spans[:max_length]


def _covering(offsets: Sequence[Span], span: Span, text: str) -> Span:
    """Token positions whose characters fall in `span` (special tokens, (0, 0), never do)."""
    inside = [i for i, (s, e) in enumerate(offsets) if e > s and s >= span[0] and e <= span[1]]
    if not inside:
        raise ValueError(
            f"no token covers {text[slice(*span)]!r} (characters {span[0]}-{span[1]}) "
            f"of {text!r}: truncated?"
        )
    if inside != list(range(inside[0], inside[-1] + 1)):
        raise ValueError(f"the tokens of {text[slice(*span)]!r} are not contiguous in {text!r}")
    return inside[0], inside[-1] + 1


def token_spans(sentence: Sentence, offsets: Sequence[Span]) -> tuple[Span, tuple[Span, ...]]:
    """The pronoun's and each candidate's token positions in one tokenization.

    `offsets`: each token's (start, end) characters in `sentence.text`, in
    token order: `tokenizers`' `Encoding.offsets` for word pieces ([CLS] and
    [SEP] are (0, 0)), `word_offsets` for a word-level vocabulary. A word
    split into pieces spans all of them.
    """
    offsets = [(int(s), int(e)) for s, e in offsets]
    pronoun = _covering(offsets, sentence.pronoun, sentence.text)
    return pronoun, tuple(_covering(offsets, c, sentence.text) for c in sentence.candidates)


# ------------------------------------------------------------------ weights
def candidate_weights(
    attention: Sequence[np.ndarray], pronoun: Span, candidates: Sequence[Span]
) -> np.ndarray:
    """`(heads, K)`: each head's weight from the pronoun onto each candidate.

    `attention`: one `(h_l, T, T)` array per layer for this sentence (layers
    may differ in heads: pruned models). The pronoun's query row (the mean of
    its pieces' rows if it has several) is summed over each candidate's
    tokens. Heads are flattened layer by layer.
    """
    rows = []
    for layer in attention:
        a = np.asarray(layer, dtype="float64")
        row = a[:, pronoun[0] : pronoun[1], :].mean(axis=1)  # (h, T)
        rows.append(np.stack([row[:, s:e].sum(axis=-1) for s, e in candidates], axis=-1))
    return np.concatenate(rows, axis=0)


def nearest_candidate(pronoun: Span, candidates: Sequence[Span]) -> int:
    """The candidate ending closest before the pronoun (or, if none, the closest after)."""
    before = [i for i, (_, e) in enumerate(candidates) if e <= pronoun[0]]
    if before:
        return max(before, key=lambda i: candidates[i][1])
    return min(range(len(candidates)), key=lambda i: candidates[i][0] - pronoun[1])


# ---------------------------------------------------------------- bootstrap
def bootstrap_interval(
    scores: np.ndarray, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> np.ndarray:
    """Percentile bootstrap interval of the mean of each column: `(M, 2)`.

    `scores` is `(N, M)`: one row per sentence, one column per scorer (1.0
    right, 0.0 wrong, or an expected score). The sentences are resampled with
    replacement, the same draws for every column; the same seed gives the
    same interval.
    """
    scores = np.asarray(scores, dtype="float64")
    if scores.ndim == 1:
        scores = scores[:, None]
    n = len(scores)
    if n == 0 or resamples < 1:
        raise ValueError(f"needs sentences and resamples; got {n} and {resamples}")
    rng = np.random.default_rng(seed)
    chunk = max(1, 2**22 // n)
    means = []
    for start in range(0, resamples, chunk):
        draws = rng.integers(0, n, (min(chunk, resamples - start), n))
        counts = np.stack([np.bincount(row, minlength=n) for row in draws])
        means.append(counts @ scores / n)
    tail = 100.0 * (1.0 - level) / 2.0
    return np.percentile(np.concatenate(means), [tail, 100.0 - tail], axis=0).T


# ------------------------------------------------------------------- result
@dataclasses.dataclass(frozen=True)
class Score:
    """One head's (or baseline's) accuracy over the sentences."""

    name: str  # "L3-H1" (layers and heads from 0), or a baseline's name
    accuracy: float
    ci95: tuple[float, float]
    by_cue: dict[str, float]
    layer: int | None = None
    head: int | None = None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "layer": self.layer,
            "head": self.head,
            "accuracy": self.accuracy,
            "ci95": list(self.ci95),
            "by_cue": dict(self.by_cue),
        }


@dataclasses.dataclass(frozen=True)
class CorefResult:
    """Every head, best first, and the baselines."""

    heads: tuple[Score, ...]
    baselines: tuple[Score, ...]  # BASELINES, in that order
    sentences: int
    cues: dict[str, int]  # sentences per cue
    resamples: int
    seed: int

    def baseline(self, name: str) -> Score:
        return next(b for b in self.baselines if b.name == name)

    def beating(self, name: str = "nearest noun") -> tuple[int, int]:
        """(heads above the baseline's accuracy, heads whose whole interval is above it)."""
        value = self.baseline(name).accuracy
        return (
            sum(h.accuracy > value for h in self.heads),
            sum(h.ci95[0] > value for h in self.heads),
        )

    def to_json(self) -> dict:
        above, surely = self.beating()
        return {
            "sentences": self.sentences,
            "cues": dict(self.cues),
            "bootstrap": {"resamples": self.resamples, "seed": self.seed, "method": "percentile"},
            "heads": [h.to_json() for h in self.heads],
            "baselines": [b.to_json() for b in self.baselines],
            "heads_above_nearest_noun": above,
            "heads_above_nearest_noun_interval": surely,
        }


def head_names(heads_per_layer: Sequence[int]) -> list[tuple[int, int]]:
    return [(layer, head) for layer, h in enumerate(heads_per_layer) for head in range(h)]


def score_weights(
    weights: Sequence[np.ndarray],
    pronouns: Sequence[Span],
    candidates: Sequence[Sequence[Span]],
    labels: Sequence[int],
    cues: Sequence[str],
    heads_per_layer: Sequence[int],
    resamples: int = 1000,
    seed: int = 0,
) -> CorefResult:
    """The probe's table from `candidate_weights` of every sentence (see `probe`)."""
    n = len(weights)
    if not n or not len(pronouns) == len(candidates) == len(labels) == len(cues) == n:
        raise ValueError(
            f"needs as many pronouns, candidate lists, labels and cues as sentences (> 0); got "
            f"{n}, {len(pronouns)}, {len(candidates)}, {len(labels)}, {len(cues)}"
        )
    names = head_names(heads_per_layer)
    labels = np.asarray(labels, dtype="int64")
    cues = np.asarray(cues).astype(str)
    heads = np.empty((n, len(names)))
    base = np.empty((n, len(BASELINES)))
    for i, (w, p, c) in enumerate(zip(weights, pronouns, candidates)):
        if w.shape != (len(names), len(c)) or not 0 <= labels[i] < len(c):
            raise ValueError(
                f"sentence {i}: weights {w.shape} for {len(names)} heads and {len(c)} "
                f"candidates, label {labels[i]}"
            )
        heads[i] = w.argmax(axis=-1) == labels[i]
        base[i] = (nearest_candidate(p, c) == labels[i], labels[i] == 0, 1.0 / len(c))
    scores = np.concatenate([heads, base], axis=1)
    intervals = bootstrap_interval(scores, resamples, seed)
    order = [c for c in CUES if c in set(cues)] + sorted(set(cues) - set(CUES))

    def make(column: int, name: str, where=(None, None)) -> Score:
        return Score(
            name=name,
            accuracy=float(scores[:, column].mean()),
            ci95=(float(intervals[column, 0]), float(intervals[column, 1])),
            by_cue={c: float(scores[cues == c, column].mean()) for c in order},
            layer=where[0],
            head=where[1],
        )

    table = [make(j, f"L{layer}-H{head}", (layer, head)) for j, (layer, head) in enumerate(names)]
    table.sort(key=lambda s: (-s.accuracy, s.layer, s.head))
    return CorefResult(
        heads=tuple(table),
        baselines=tuple(make(len(names) + j, b) for j, b in enumerate(BASELINES)),
        sentences=n,
        cues={c: int((cues == c).sum()) for c in order},
        resamples=resamples,
        seed=seed,
    )


def probe(
    attention: Sequence[Sequence[np.ndarray]],
    pronouns: Sequence[Span],
    candidates: Sequence[Sequence[Span]],
    labels: Sequence[int],
    cues: Sequence[str],
    resamples: int = 1000,
    seed: int = 0,
) -> CorefResult:
    """The coreference probe on given attention weights.

    `attention[i]` holds sentence i's weights, one `(h_l, T, T)` array per
    layer; `pronouns[i]` and `candidates[i]` are token spans (`token_spans`),
    `labels[i]` the referent's index in `candidates[i]`, `cues[i]` its cue.
    """
    if not len(attention):
        raise ValueError("needs at least one sentence")
    heads_per_layer = [int(np.shape(a)[0]) for a in attention[0]]
    weights = [candidate_weights(a, p, c) for a, p, c in zip(attention, pronouns, candidates)]
    return score_weights(
        weights, pronouns, candidates, labels, cues, heads_per_layer, resamples, seed
    )


# ------------------------------------------------------------ the model probed
@dataclasses.dataclass
class TokenModel:
    """A model that reads text: the pieces of a sentence and its attention per layer."""

    kind: str  # the run's task: "embedding" (an imported encoder) or "classification"
    offsets: object  # text -> each token's (start, end) characters
    attention: object  # texts -> (per sentence, per layer (h, T, T); predictions or None)
    unknown: object  # text -> the words the tokenizer does not know
    model_file: pathlib.Path  # the model.keras probed (its sha256 goes into the table)


def token_model(run_dir: str | os.PathLike) -> TokenModel:
    """The model RUN_DIR holds, if it reads words: an imported encoder (its word pieces,
    tokenizer.json) or a trained token classifier (its vocab.json)."""
    from keras import ops

    from keras_mha.rundir.tasks import read_any

    def per_sentence(weights) -> list[list[np.ndarray]]:
        weights = [ops.convert_to_numpy(w) for w in weights]
        return [[w[b] for w in weights] for b in range(len(weights[0]))]

    from keras_mha.decoder import is_language_model

    if is_language_model(run_dir):
        return _language_model(run_dir)
    run = read_any(run_dir)
    tokenizer = getattr(run, "tokenizer", None)
    if tokenizer is not None:  # word pieces: an encoder from keras-mha-import
        from keras_mha.pretrained.bert import encoder_forward

        model = run.load_model()
        pieces = tokenizer.tokenizer

        def attention(texts):
            ids, _ = tokenizer.encode(texts)
            _, weights = encoder_forward(model, ids, return_attention=True)
            return per_sentence(weights), None

        def unknown(text):
            encoding = pieces.encode(text)
            return tuple(
                text[s:e] for t, (s, e) in zip(encoding.tokens, encoding.offsets) if t == "[UNK]"
            )

        return TokenModel(
            run.task.name,
            lambda text: pieces.encode(text).offsets,
            attention,
            unknown,
            run.model_file,
        )
    if run.vocab is None:
        raise UsageError(
            "has no vocab.json: the coreference probe needs a model that reads words "
            "(a pronouns run, or an encoder from keras-mha-import)",
            run_dir,
        )
    from keras_mha.model import forward

    vocab = run.vocab
    model = run.load_model()

    def attention(texts):
        probs, weights = forward(model, vocab.encode(texts), return_attention_scores=True)
        return per_sentence(weights), ops.convert_to_numpy(probs).argmax(-1)

    return TokenModel(
        run.task.name,
        lambda text: word_offsets(text, vocab.token_pattern, vocab.max_length),
        attention,
        lambda text: vocab.analyze(text).unknown,
        run.model_file,
    )


def _language_model(run_dir: str | os.PathLike) -> TokenModel:
    """A language model's run (keras-mha-import of SmolLM2, a GGUF or a Llama folder):
    its byte-level tokens and every layer's attention. It is causal: the
    pronoun's row sees only the tokens before it, and in the task's sentences
    (and the lesson's) every candidate noun comes before the pronoun."""
    from keras_mha import decoder
    from keras_mha.decoder.run import TASK, require_run

    folder = require_run(run_dir)
    lm = decoder.load(folder)

    def offsets(text):
        # byte-level tokens carry the space before a word ("Ġit"): the word's characters only
        spans = lm.tokenizer.encode(text, add_special_tokens=False).offsets
        return [(s + len(text[s:e]) - len(text[s:e].lstrip()), e) for s, e in spans]

    def attention(texts):
        batch, _ = lm.encode_batch(texts)  # right-padded: causal, the pads change nothing
        _, weights = lm.logits(batch, return_attention_scores=True)
        return [[w[b] for w in weights] for b in range(len(texts))], None

    return TokenModel(TASK, offsets, attention, lambda text: (),
                      folder / "model.safetensors")  # fmt: skip


# --------------------------------------------------------------- the best head
def read_best_head(
    run_dir: str | os.PathLike, heads_per_layer: Sequence[int], model_file: str | os.PathLike
):
    """RUN_DIR/heads/coref.json's best head for the model in `model_file`: `(head, note)`.

    `head` is a `bundle_contract.attention.CorefHead` (what a bundle
    manifest's `coref_head` holds), or None: without the file (note None),
    or when the file is for another model.keras (its `model_sha256` differs)
    or for other heads per layer (then `note` says so). A file that cannot be
    read as the command writes it is a UsageError naming it.
    """
    from bundle_contract.attention import CorefHead
    from bundle_contract.fields import Fields, parse_json
    from bundle_contract.files import sha256_file

    path = pathlib.Path(run_dir) / COREF_FILE
    if not path.is_file():
        return None, None
    try:
        record = parse_json(path.read_bytes(), path)
    except OSError as error:
        raise UsageError(f"cannot read it ({error.strerror or error})", path) from None
    again = f"rerun keras-mha-heads coref {run_dir}"
    if not isinstance(record, dict) or not isinstance(record.get("heads"), list):
        raise UsageError(f"not a keras-mha-heads coref table; {again}", path)
    if record.get("model_sha256") != sha256_file(model_file):
        return None, f"{path} is for another model.keras (sha256 differs): no head named; {again}"
    if record.get("heads_per_layer") != list(heads_per_layer):
        return None, (
            f"{path} is for {record.get('heads_per_layer')} heads per layer, the model has "
            f"{list(heads_per_layer)}: no head named; {again}"
        )
    best = record["heads"][0] if record["heads"] else None
    if not isinstance(best, dict):
        raise UsageError(f"has no heads; {again}", path)
    entry = {k: best.get(k) for k in ("layer", "head", "accuracy", "ci95")}
    head = CorefHead.from_json(
        Fields(path), {"coref_head": {**entry, "sentences": record.get("sentences")}}
    )
    problem = head.problem(list(heads_per_layer))
    if problem is not None:
        raise UsageError(f"its best head's {problem[0]} {problem[1]}; {again}", path)
    return head, None
