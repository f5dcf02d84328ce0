"""The datasets the classifier trains on; nothing is downloaded.

- `digits`: scikit-learn's bundled 8x8 handwritten digits (1,797 images),
  each image a sequence of 8 row tokens of 8 pixels scaled to [0, 1].
- `pronouns`: generated sentences in which a pronoun refers to one of the
  nouns, after the lesson's "The model didn't work because it was too
  complex". The label is the position of the noun the pronoun means
  (first, second or third noun). Two cues decide it:

  - number agreement: `it ... was` needs a singular noun, `they ... were` a
    plural one;
  - meaning: every adjective fits one kind of noun only (software is
    "buggy", hardware is "dusty").

  Every sentence records the cue that decides it (`CUES`): `number` (number
  agreement alone: the adjective fits two nouns), `semantic` (the adjective
  alone: the pronoun fits two nouns) or `both` (each cue alone leaves two
  nouns; only together do they leave one). With two candidate nouns a cue
  that rules one out already decides, so `both` needs a third noun: "the
  laptop sent the models to the servers because they were too hot" (`they`
  fits models and servers, `hot` fits the laptop and the servers).

  Sentences come in five equal shares (`STRUCTURES`): two nouns decided by
  number or by meaning, and three nouns decided by number, by meaning or by
  both. The three nouns are always of the same three types (a pivot, a noun
  sharing its kind, a noun sharing its number), and each of them is the
  referent for one of the three cues, so the nouns alone never give the
  answer away.

Splits are stratified and seeded: the test split is held out first, the
validation split (for early stopping) is carved from what remains.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from bundle_contract.vocab import TOKEN_PATTERN, Vocab

DATASETS = ("digits", "pronouns")
CUES = ("number", "semantic", "both")

TEST_FRACTION = 0.2
VALIDATION_FRACTION = 0.1

PAD, UNK = "<pad>", "<unk>"
PRONOUNS_MAX_LENGTH = 16
PRONOUNS_SAMPLES = 7500
# (cue, number of nouns), generated in equal shares.
STRUCTURES = (("number", 2), ("semantic", 2), ("number", 3), ("semantic", 3), ("both", 3))
PRONOUNS_LABELS = ["first noun", "second noun", "third noun"]

# Two kinds of noun, each as (singular, plural), and the adjectives that fit
# only that kind.
NOUNS = {
    "software": [
        ("model", "models"),
        ("network", "networks"),
        ("program", "programs"),
        ("algorithm", "algorithms"),
        ("classifier", "classifiers"),
    ],
    "hardware": [
        ("laptop", "laptops"),
        ("server", "servers"),
        ("phone", "phones"),
        ("printer", "printers"),
        ("router", "routers"),
    ],
}
ADJECTIVES = {
    "software": ["complex", "buggy", "overfitted", "untrained", "inaccurate"],
    "hardware": ["hot", "heavy", "dusty", "loud", "unplugged"],
}
TWO_NOUN_VERBS = [
    "didn't work with",
    "didn't run on",
    "replaced",
    "slowed down",
    "crashed",
    "confused",
]
THREE_NOUN_VERBS = ["sent", "moved", "copied", "handed", "passed"]  # "the A sent the B to the C"
CONJUNCTIONS = ["because", "since"]
INTENSIFIERS = ["too", "so"]
PRONOUN = {"singular": ("it", "was"), "plural": ("they", "were")}
KINDS = tuple(NOUNS)
NUMBERS = ("singular", "plural")


@dataclasses.dataclass(frozen=True)
class Grammar:
    """The words a pronoun sentence is made of (the adjectives are the cue
    of meaning, so they are shared by every grammar)."""

    nouns: dict
    two_noun_verbs: list
    three_noun_verbs: list
    conjunctions: list
    intensifiers: list
    adjectives: dict = dataclasses.field(default_factory=lambda: ADJECTIVES)


GRAMMAR = Grammar(NOUNS, TWO_NOUN_VERBS, THREE_NOUN_VERBS, CONJUNCTIONS, INTENSIFIERS)
# Sentences no training split of ours has seen: other nouns of the same two
# kinds and other frames (verbs, conjunction, intensifier), the same cues.
# The from-scratch classifier reads every one of these words as <unk>; a
# pretrained encoder has read them before (README, "fine-tuned vs from scratch").
UNSEEN_GRAMMAR = Grammar(
    nouns={
        "software": [
            ("compiler", "compilers"),
            ("database", "databases"),
            ("script", "scripts"),
            ("app", "apps"),
            ("library", "libraries"),
        ],
        "hardware": [
            ("monitor", "monitors"),
            ("keyboard", "keyboards"),
            ("camera", "cameras"),
            ("speaker", "speakers"),
            ("battery", "batteries"),
        ],
    },
    two_noun_verbs=["couldn't talk to", "froze", "overloaded", "broke", "ignored", "blocked"],
    three_noun_verbs=["shipped", "gave", "lent", "mailed", "uploaded"],
    conjunctions=["as"],
    intensifiers=["really", "very"],
)


# --------------------------------------------------------------------- data
@dataclasses.dataclass
class Dataset:
    """A dataset split three ways, with what the model and the plots need.

    `x_*` are exactly what the model takes: float32 `(N, 8, 8)` for digits,
    int32 `(N, T)` token ids (0 = padding) for pronouns. `cue_*` (the cue
    that decides each sentence), `nouns_test` (its number of nouns) and
    `text_test` are set for pronouns only.
    """

    name: str
    input_kind: str  # "features" or "tokens" (see ModelConfig)
    labels: list[str]
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    vocab: Vocab | None = None
    text_test: np.ndarray | None = None
    cue_train: np.ndarray | None = None
    cue_test: np.ndarray | None = None
    nouns_test: np.ndarray | None = None

    @property
    def sequence_length(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def feature_dim(self) -> int:
        """Features per token, or the vocabulary size for token inputs."""
        if self.vocab is not None:
            return len(self.vocab.tokens)
        return int(self.x_train.shape[2])

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def token_labels(self, x: np.ndarray) -> list[str]:
        """Readable names of one input's tokens (for attention plots)."""
        if self.vocab is not None:
            return self.vocab.decode(x)
        return [f"row {i}" for i in range(len(x))]


def load_dataset(name: str, seed: int = 0) -> Dataset:
    """Load `digits` or `pronouns`, split stratified and seeded by `seed`."""
    if name == "digits":
        return load_digits(seed)
    if name == "pronouns":
        return load_pronouns(seed)
    raise ValueError(f"Unknown dataset {name!r}; expected one of {', '.join(DATASETS)}.")


def split_indices(
    strata: np.ndarray, seed: int, test_fraction: float = TEST_FRACTION
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stratified, seeded (train, validation, test) index arrays.

    The test split is drawn first; validation is carved from the rest, so
    the test split never feeds training, early stopping or calibration.
    """
    from sklearn.model_selection import train_test_split

    index = np.arange(len(strata))
    rest, test = train_test_split(
        index, test_size=test_fraction, stratify=strata, random_state=seed
    )
    train, val = train_test_split(
        rest, test_size=VALIDATION_FRACTION, stratify=strata[rest], random_state=seed
    )
    return train, val, test


def load_digits(seed: int = 0) -> Dataset:
    """8x8 digits as 8 row tokens x 8 pixels in [0, 1]; labels "0".."9"."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    x = (digits.images / 16.0).astype("float32")  # (1797, 8, 8)
    y = digits.target.astype("int32")
    train, val, test = split_indices(y, seed)
    return Dataset(
        name="digits",
        input_kind="features",
        labels=[str(i) for i in range(10)],
        x_train=x[train],
        y_train=y[train],
        x_val=x[val],
        y_val=y[val],
        x_test=x[test],
        y_test=y[test],
    )


# ------------------------------------------------------------------- vocab
# The vocabulary class is the device's (bundle_contract.vocab): training
# writes vocab.json through the same class that export and the edge demo read
# it with, so a vocabulary the device would refuse cannot be written.


def pronouns_vocab() -> Vocab:
    """`<pad>`, `<unk>`, then every word the grammar can produce, sorted.

    Words are found with the vocabulary's TOKEN_PATTERN: letters, digits and
    apostrophes ("didn't" is one token); punctuation is dropped.
    """
    phrases = [
        "the to",
        *TWO_NOUN_VERBS,
        *THREE_NOUN_VERBS,
        *CONJUNCTIONS,
        *INTENSIFIERS,
        *(" ".join(p) for p in PRONOUN.values()),
        *(w for pairs in NOUNS.values() for pair in pairs for w in pair),
        *(a for adjectives in ADJECTIVES.values() for a in adjectives),
    ]
    words = sorted({w for phrase in phrases for w in re.findall(TOKEN_PATTERN, phrase)})
    return Vocab(tokens=[PAD, UNK, *words], max_length=PRONOUNS_MAX_LENGTH)


# ----------------------------------------------------------------- grammar
@dataclasses.dataclass(frozen=True)
class Noun:
    word: str
    kind: str  # "software" or "hardware"
    number: str  # "singular" or "plural"


def _noun(
    rng: np.random.Generator, kind: str, number: str, exclude=(), nouns: dict = NOUNS
) -> Noun:
    stems = [pair for pair in nouns[kind] if pair[0] not in exclude]
    singular, plural = stems[rng.integers(len(stems))]
    return Noun(singular if number == "singular" else plural, kind, number)


def _other(values: tuple[str, str], value: str) -> str:
    return values[1] if values[0] == value else values[0]


# The other nouns, as (same kind?, same number?) relative to the referent.
_OTHERS = {
    ("number", 2): [(True, False)],
    ("semantic", 2): [(False, True)],
    ("number", 3): [(True, False), (False, False)],
    ("semantic", 3): [(False, True), (False, False)],
    ("both", 3): [(True, False), (False, True)],
}


def generate_sentence(
    rng: np.random.Generator, cue: str, num_nouns: int = 2, grammar: Grammar = GRAMMAR
) -> tuple[str, int, list[Noun]]:
    """One sentence decided by `cue`: (text, referent position, nouns in order)."""
    if (cue, num_nouns) not in _OTHERS:
        raise ValueError(
            f"No sentence with {num_nouns} nouns is decided by cue {cue!r}; "
            f"expected one of {STRUCTURES}."
        )
    kind = KINDS[rng.integers(2)]
    number = NUMBERS[rng.integers(2)]
    g = grammar
    nouns = [_noun(rng, kind, number, nouns=g.nouns)]
    for same_kind, same_number in _OTHERS[cue, num_nouns]:
        other_kind = kind if same_kind else _other(KINDS, kind)
        used = {_stem(n, g.nouns) for n in nouns if n.kind == other_kind}
        other_number = number if same_number else _other(NUMBERS, number)
        nouns.append(_noun(rng, other_kind, other_number, used, g.nouns))
    order = rng.permutation(len(nouns))
    nouns = [nouns[i] for i in order]
    label = int(np.flatnonzero(order == 0)[0])
    pronoun, be = PRONOUN[number]
    adjective = g.adjectives[kind][rng.integers(len(g.adjectives[kind]))]
    conjunction = g.conjunctions[rng.integers(len(g.conjunctions))]
    intensifier = g.intensifiers[rng.integers(len(g.intensifiers))]
    if len(nouns) == 2:
        verb = g.two_noun_verbs[rng.integers(len(g.two_noun_verbs))]
        head = f"the {nouns[0].word} {verb} the {nouns[1].word}"
    else:
        verb = g.three_noun_verbs[rng.integers(len(g.three_noun_verbs))]
        head = f"the {nouns[0].word} {verb} the {nouns[1].word} to the {nouns[2].word}"
    text = f"{head} {conjunction} {pronoun} {be} {intensifier} {adjective}"
    return text, label, nouns


def _stem(noun: Noun, nouns: dict = NOUNS) -> str:
    for pairs in nouns.values():
        for singular, plural in pairs:
            if noun.word in (singular, plural):
                return singular
    raise ValueError(f"Not a noun of the grammar: {noun.word!r}")


def generate_pronouns(
    n: int = PRONOUNS_SAMPLES, seed: int = 0, grammar: Grammar = GRAMMAR
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """`n` distinct sentences, an equal share per structure, in a seeded order
    (`grammar=UNSEEN_GRAMMAR`: of nouns and frames training never saw).

    Returns (texts, labels int32, cues as strings, nouns per sentence int32).
    """
    rng = np.random.default_rng(seed)
    texts, labels, cues, counts, seen = [], [], [], [], set()
    for i in range(n):
        cue, num_nouns = STRUCTURES[i % len(STRUCTURES)]
        while True:
            text, label, _ = generate_sentence(rng, cue, num_nouns, grammar)
            if text not in seen:
                break
        seen.add(text)
        texts.append(text)
        labels.append(label)
        cues.append(cue)
        counts.append(num_nouns)
    order = rng.permutation(n)
    return (
        [texts[i] for i in order],
        np.asarray(labels, dtype="int32")[order],
        np.asarray(cues)[order],
        np.asarray(counts, dtype="int32")[order],
    )


def load_pronouns(seed: int = 0, n: int = PRONOUNS_SAMPLES) -> Dataset:
    """The generated pronoun task, split stratified by (cue, nouns, label)."""
    texts, y, cues, counts = generate_pronouns(n, seed)
    vocab = pronouns_vocab()
    x = vocab.encode(texts)
    strata = np.asarray([f"{c}:{k}:{label}" for c, k, label in zip(cues, counts, y)])
    train, val, test = split_indices(strata, seed)
    texts = np.asarray(texts)
    return Dataset(
        name="pronouns",
        input_kind="tokens",
        labels=list(PRONOUNS_LABELS),
        x_train=x[train],
        y_train=y[train],
        x_val=x[val],
        y_val=y[val],
        x_test=x[test],
        y_test=y[test],
        vocab=vocab,
        text_test=texts[test],
        cue_train=cues[train],
        cue_test=cues[test],
        nouns_test=counts[test],
    )
