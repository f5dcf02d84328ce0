"""`BertConfig`: the part of a Hugging Face config.json the encoder needs, checked.

Keras-free, so a command refuses a configuration it cannot honour before
TensorFlow is imported.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from bundle_contract.errors import UsageError, safe

# Each family: Hugging Face's config.json keys for ours, the architectures
# whose encoder the import keeps (a bare encoder, or one with a pretraining head
# (masked LM) that a sentence encoder never used), and its sequence classifier,
# imported with its head (`classifier`: the architecture and the activation
# between its two Linears). Any other task head (a span or token head) would
# be dropped, so it is refused.
FAMILIES = {
    "bert": {
        "keys": {
            "vocab_size": "vocab_size",
            "hidden_size": "hidden_size",
            "num_layers": "num_hidden_layers",
            "num_heads": "num_attention_heads",
            "intermediate_size": "intermediate_size",
            "max_positions": "max_position_embeddings",
        },
        "activation": "hidden_act",
        "type_vocab_size": 2,  # when config.json does not say
        "architectures": ("BertModel", "BertForMaskedLM", "BertForPreTraining"),
        # the pooler's Linear + tanh on [CLS], then the classifier
        "classifier": ("BertForSequenceClassification", "tanh"),
    },
    "distilbert": {
        "keys": {
            "vocab_size": "vocab_size",
            "hidden_size": "dim",
            "num_layers": "n_layers",
            "num_heads": "n_heads",
            "intermediate_size": "hidden_dim",
            "max_positions": "max_position_embeddings",
        },
        "activation": "activation",
        "type_vocab_size": 1,  # no token types: one type whose embedding is zero
        "architectures": ("DistilBertModel", "DistilBertForMaskedLM"),
        # pre_classifier + ReLU on the first token, then the classifier
        "classifier": ("DistilBertForSequenceClassification", "relu"),
    },
}
# RoBERTa and XLM-RoBERTa keep BERT's keys and tensor names; they differ in the
# pad id (config.json's pad_token_id, 1), positions numbered from pad_id + 1,
# one token type and their tokenizers (byte-level BPE, Unigram).
for _kind, _name in (("roberta", "Roberta"), ("xlm-roberta", "XLMRoberta")):
    FAMILIES[_kind] = {
        **FAMILIES["bert"],
        "type_vocab_size": 1,
        "pad_token_id": 1,  # when config.json does not say (transformers' default)
        "architectures": (f"{_name}Model", f"{_name}ForMaskedLM"),
        # RobertaClassificationHead: dense + tanh on <s>, then out_proj
        "classifier": (f"{_name}ForSequenceClassification", "tanh"),
        "positions_after_pad": True,  # position t is pad_id + 1 + t (transformers' padding_idx)
    }
MODEL_TYPES = tuple(FAMILIES)
POOLINGS = ("mean", "cls", "max")  # sentence-transformers' pooling modes we build
# Hugging Face's activation names and ours (TransformerEncoderBlock).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
ACTIVATIONS["relu"] = "relu"


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The part of a Hugging Face `config.json` the encoder needs (JSON-friendly)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    activation: str = "gelu"  # ours: "gelu" (erf), "gelu_tanh", "relu"
    pad_token_id: int = 0
    family: str = "bert"  # config.json's model_type: which checkpoint names the weights have
    pooling: str = "mean"  # the sentence vector: mean of the tokens, the first ([CLS]), or max
    # A pruned encoder (keras-mha-heads prune): the heads left in each layer,
    # each of size `key_dim` (d_model / num_heads, the unpruned model's). None:
    # `num_heads` in every layer, and the key is not written.
    heads_per_layer: tuple[int, ...] | None = None
    # A sequence classifier (config.json's architectures: the family's
    # *ForSequenceClassification): its class names in id order (id2label). ()
    # for a sentence encoder, and the key is not written.
    labels: tuple[str, ...] = ()
    # A cross-encoder (a sequence classifier with one label): the activation of
    # its one logit, sentence-transformers' CrossEncoder's ("sigmoid" unless the
    # checkpoint declares Identity: "identity"). None otherwise, not written.
    score_activation: str | None = None
    # The token that ends a pair's first text ([SEP]): the model gives the
    # tokens after it token type 1, as the tokenizer does. Set by the import
    # for a cross-encoder with two token types (BERT's); None: every token is type 0.
    pair_sep_id: int | None = None

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def output_width(self) -> int:
        """What the model gives per input: a score, class probabilities or a vector."""
        return 1 if self.score_activation else self.num_labels or self.hidden_size

    @property
    def classifier_activation(self) -> str:
        """Between the classifier head's two Linears: tanh (BERT's pooler, RoBERTa's
        head) or relu (DistilBERT's pre_classifier)."""
        return FAMILIES[self.family]["classifier"][1]

    @property
    def key_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def position_offset(self) -> int:
        """The position row of the first token: 0, or pad_id + 1 for RoBERTa and XLM-R."""
        return self.pad_token_id + 1 if FAMILIES[self.family].get("positions_after_pad") else 0

    @property
    def max_length(self) -> int:
        """The longest input the position table holds (RoBERTa's 514 rows give 512)."""
        return self.max_positions - self.position_offset

    @property
    def heads(self) -> list[int]:
        """The heads of each layer: `heads_per_layer`, or `num_heads` in every layer."""
        if self.heads_per_layer is None:
            return [self.num_heads] * self.num_layers
        return list(self.heads_per_layer)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for name, default in (("family", "bert"), ("pooling", "mean")):
            if data[name] == default:
                del data[name]  # a MiniLM run's config as it always was
        if self.heads_per_layer is None:
            del data["heads_per_layer"]  # an unpruned config as it always was
        else:
            data["heads_per_layer"] = list(self.heads_per_layer)
        if self.labels:
            data["labels"] = list(self.labels)
        else:
            del data["labels"]  # a sentence encoder's config as it always was
        for name in ("score_activation", "pair_sep_id"):
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict, where: Any = "config") -> BertConfig:
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(data, dict) or set(data) - set(names):
            raise UsageError(f"expected an encoder config with keys {', '.join(names)}", where)
        for name in ("heads_per_layer", "labels"):
            if isinstance(data.get(name), list):
                data = {**data, name: tuple(data[name])}
        try:
            config = cls(**data)
        except TypeError as error:
            raise UsageError(f"incomplete encoder config ({error})", where) from None
        config.validate(where)
        return config

    @classmethod
    def from_hf(cls, data: dict, where: Any = "config.json") -> BertConfig:
        """From a Hugging Face `config.json`; what the encoder cannot honour is refused."""
        if not isinstance(data, dict):
            raise UsageError("expected a JSON object", where)
        kind = data.get("model_type")
        if kind not in FAMILIES:
            raise UsageError(
                f"model_type {safe(repr(kind), 40)} is not supported; expected one of "
                f"{', '.join(MODEL_TYPES)} (BERT-family encoders with absolute positions)",
                where,
            )
        family = FAMILIES[kind]
        classifier = _check_architectures(data.get("architectures"), family, where)
        scorer = classifier and _one_label(data)  # a cross-encoder's one score
        position = data.get("position_embedding_type", "absolute")
        if position != "absolute":
            raise UsageError(
                f"position_embedding_type {position!r} is not supported; expected 'absolute'",
                where,
            )
        act = data.get(family["activation"], "gelu")
        if act not in ACTIVATIONS:
            raise UsageError(
                f"{family['activation']} {act!r} is not supported; expected one of "
                f"{sorted(ACTIVATIONS)}",
                where,
            )
        if data.get("is_decoder") or data.get("add_cross_attention"):
            raise UsageError("a decoder is not supported; expected an encoder", where)
        keys = family["keys"]
        missing = [hf for hf in keys.values() if hf not in data]
        if missing:
            raise UsageError(f"missing {', '.join(missing)}", where)
        config = cls(
            **{ours: data[hf] for ours, hf in keys.items()},
            type_vocab_size=data.get("type_vocab_size", family["type_vocab_size"]),
            # DistilBERT's LayerNorms are nn.LayerNorm(dim, eps=1e-12), not in its config
            layer_norm_eps=data.get("layer_norm_eps", 1e-12),
            activation=ACTIVATIONS[act],
            pad_token_id=data.get("pad_token_id", family.get("pad_token_id", 0)),
            family=kind,
            pooling="cls" if classifier else "mean",  # a classifier reads the first token
            labels=_labels(data, where) if classifier and not scorer else (),
            score_activation=_score_activation(data, where) if scorer else None,
        )
        config.validate(where)
        return config

    def validate(self, where: Any = "config") -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_positions",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive integer, got {value!r}", where)
        if self.hidden_size % self.num_heads:
            raise UsageError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_heads} (d_k = d_model / h)",
                where,
            )
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise UsageError(f"layer_norm_eps must be in (0, 1), got {eps!r}", where)
        if self.family not in FAMILIES:
            raise UsageError(f"family {self.family!r} is not one of {MODEL_TYPES}", where)
        if self.pooling not in POOLINGS:
            raise UsageError(f"pooling {self.pooling!r} is not one of {POOLINGS}", where)
        if self.activation not in ACTIVATIONS.values():
            raise UsageError(f"activation {self.activation!r} is not supported", where)
        pad = self.pad_token_id
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < self.vocab_size:
            raise UsageError(
                f"pad_token_id must be a token id in 0..{self.vocab_size - 1}, got {pad!r}", where
            )
        if self.max_length < 2:
            raise UsageError(
                f"max_position_embeddings {self.max_positions} leaves {self.max_length} "
                "positions after the pad offset; expected at least 2",
                where,
            )
        labels = self.labels
        if not isinstance(labels, (list, tuple)) or not all(
            isinstance(name, str) and name.strip() and len(name) <= MAX_LABEL_CHARS
            for name in labels
        ):
            raise UsageError(
                f"labels must be class names of 1 to {MAX_LABEL_CHARS} characters, got "
                f"{safe(repr(labels), 80)}",
                where,
            )
        if labels and len(labels) < 2:  # an imported one pools [CLS]; a fine-tuned
            # sentence encoder (keras-mha-train --from) pools as it was trained to
            raise UsageError(
                f"a classifier needs at least 2 labels; got {len(labels)} label(s)", where
            )
        if self.score_activation is not None and (
            self.score_activation not in SCORE_ACTIVATIONS.values()
            or labels
            or self.pooling != "cls"
        ):
            raise UsageError(
                f"a cross-encoder's score_activation must be one of "
                f"{sorted(SCORE_ACTIVATIONS.values())}, with no labels and the first token "
                f"pooled; got {safe(repr(self.score_activation), 40)}",
                where,
            )
        sep = self.pair_sep_id
        if sep is not None and (
            isinstance(sep, bool)
            or not isinstance(sep, int)
            or not 0 <= sep < self.vocab_size
            or self.type_vocab_size < 2
            or self.score_activation is None
        ):
            raise UsageError(
                f"pair_sep_id must be a token id of a cross-encoder with two token types, "
                f"got {safe(repr(sep), 40)}",
                where,
            )
        heads = self.heads_per_layer
        if heads is not None and (
            not isinstance(heads, (list, tuple))
            or len(heads) != self.num_layers
            or not all(
                isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= self.num_heads
                for h in heads
            )
        ):
            raise UsageError(
                f"heads_per_layer must be {self.num_layers} integers from 1 to num_heads "
                f"{self.num_heads} (one per layer), got {safe(repr(heads), 80)}",
                where,
            )


def _check_architectures(names: object, family: dict, where: Any) -> bool:
    """config.json's `architectures` must be ones the import keeps: an encoder's
    (False) or the family's sequence classifier (True)."""
    if names is None:
        return False
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UsageError("architectures must be a list of class names", where)
    kept, classifier = family["architectures"], family["classifier"][0]
    dropped = [n for n in names if n not in kept and n != classifier]
    if dropped:
        raise UsageError(
            f"architecture {safe(dropped[0], 60)} is not imported: keras-mha-import takes a "
            f"sentence encoder (from {', '.join(kept)}) or a sequence classifier "
            f"({classifier}), and would drop this one's task head",
            where,
        )
    return classifier in names


MAX_LABEL_CHARS = 200
MAX_LABELS = 10_000


def _labels(data: dict, where: Any) -> tuple[str, ...]:
    """A sequence classifier's class names in id order: config.json's id2label."""
    if data.get("problem_type") not in (None, "single_label_classification"):
        raise UsageError(
            f"problem_type {safe(repr(data.get('problem_type')), 40)} is not supported; "
            "expected a single-label classifier (softmax over its labels)",
            where,
        )
    id2label = data.get("id2label")
    count = data.get("num_labels", 2 if id2label is None else None)
    if id2label is None:  # transformers' default names
        if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= MAX_LABELS:
            raise UsageError(f"num_labels must be 2 to {MAX_LABELS}, got {count!r}", where)
        return tuple(f"LABEL_{i}" for i in range(count))
    if not isinstance(id2label, dict) or not 2 <= len(id2label) <= MAX_LABELS:
        raise UsageError(
            f"id2label must map 2 to {MAX_LABELS} ids to class names (a single-label "
            "classifier; one label is a cross-encoder's score)",
            where,
        )
    wanted = [str(i) for i in range(len(id2label))]
    if sorted(id2label, key=lambda k: (len(str(k)), str(k))) != wanted:
        raise UsageError(f"id2label's ids must be 0..{len(id2label) - 1}", where)
    if count is not None and count != len(id2label):
        raise UsageError(f"num_labels {count!r} but id2label names {len(id2label)}", where)
    labels = tuple(id2label[key] for key in wanted)
    if len(set(labels)) != len(labels):
        raise UsageError("id2label names a class twice", where)
    return labels


# sentence-transformers' CrossEncoder: config.json's sentence_transformers.activation_fn
# (or the older sbert_ce_default_activation_function), and ours; none declared: sigmoid.
SCORE_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
}


def _one_label(data: dict) -> bool:
    """A sequence classifier of one label (a cross-encoder): num_labels or id2label says so."""
    id2label, count = data.get("id2label"), data.get("num_labels")
    if isinstance(id2label, dict) and "num_labels" not in data:
        return len(id2label) == 1
    return isinstance(count, int) and not isinstance(count, bool) and count == 1


def _score_activation(data: dict, where: Any) -> str:
    """What sentence-transformers' CrossEncoder applies to the one logit."""
    settings = data.get("sentence_transformers")
    declared = settings.get("activation_fn") if isinstance(settings, dict) else None
    declared = declared or data.get("sbert_ce_default_activation_function")
    if declared is None:
        return "sigmoid"  # CrossEncoder's default for one label
    if not isinstance(declared, str) or declared not in SCORE_ACTIVATIONS:
        raise UsageError(
            f"activation_fn {safe(repr(declared), 60)} is not supported; expected one of "
            f"{', '.join(SCORE_ACTIVATIONS)}",
            where,
        )
    return SCORE_ACTIVATIONS[declared]


def read_hf_config(path: pathlib.Path) -> BertConfig:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read it as JSON ({error})", path) from None
    return BertConfig.from_hf(data, path)
