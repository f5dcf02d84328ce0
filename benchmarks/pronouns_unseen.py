"""The pronoun task: a fine-tuned pretrained encoder against the classifier
trained from scratch, on sentences neither was trained on.

    python benchmarks/pronouns_unseen.py --scratch runs/pronouns --finetuned runs/pronouns_minilm
        [--sentences 600] [--seed 1] [--json FILE]

Both runs answer "which noun does the pronoun mean?" (first, second, third).
The from-scratch run scores 100 % on its own test split, which shares its
nouns and frames with training; so this measures what that split cannot:
`--sentences` generated with keras_mha.data.UNSEEN_GRAMMAR (other nouns,
verbs, conjunction and intensifiers, the same cues), and the lesson's own
sentence ("The animal didn't cross the street because it was too tired.":
the first noun). The from-scratch model reads every unseen word as <unk>;
the fine-tuned one reads them as word pieces it has seen in pre-training.
Prints one table (per cue too) and writes it as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from keras_mha.heads.coref import LESSON  # noqa: E402

LESSON_LABEL = "first noun"  # the animal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=pathlib.Path, required=True)
    parser.add_argument("--finetuned", type=pathlib.Path, required=True)
    parser.add_argument("--sentences", type=int, default=600)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)

    from keras_mha.quiet_tensorflow import import_tensorflow

    import_tensorflow()
    result = compare(args.scratch, args.finetuned, args.sentences, args.seed)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def compare(scratch: pathlib.Path, finetuned: pathlib.Path, n: int, seed: int) -> dict:
    """Accuracy of each run on the unseen sentences (all, per cue) and its
    answer on the lesson's sentence; the runs' own held-out accuracy."""
    from keras_mha import data as datasets

    texts, y, cues, _ = datasets.generate_pronouns(n, seed, datasets.UNSEEN_GRAMMAR)
    texts = list(texts) + [LESSON.lower().rstrip(".")]
    result = {"sentences": n, "seed": seed, "runs": {}}
    for name, run, predict in (
        ("from scratch", scratch, _scratch_predictor(scratch)),
        ("fine-tuned", finetuned, _finetuned_predictor(finetuned)),
    ):
        probs = predict(texts)
        predicted = probs.argmax(1)
        metrics = json.loads((run / "metrics.json").read_text())
        labels = _labels(run)
        row = {
            "run": str(run),
            "own_test_accuracy": metrics["test_accuracy"],
            "unseen_accuracy": float((predicted[:n] == y).mean()),
            "unseen_per_cue": {
                cue: float((predicted[:n][cues == cue] == y[cues == cue]).mean())
                for cue in datasets.CUES
            },
            "lesson": labels[int(predicted[-1])],
            "lesson_probability": float(probs[-1].max()),
        }
        result["runs"][name] = row
    return result


def _labels(run: pathlib.Path) -> list[str]:
    data = json.loads((run / "labels.json").read_text())
    return data["labels"] if isinstance(data, dict) else data


def _scratch_predictor(run: pathlib.Path):
    import keras

    from bundle_contract.vocab import Vocab
    from keras_mha.rundir.reading import read_run

    reader = read_run(run)
    model, vocab = reader.load_model(), reader.vocab
    assert isinstance(vocab, Vocab), "the from-scratch run is a token classifier"
    return lambda texts: keras.ops.convert_to_numpy(model(vocab.encode(texts), training=False))


def _finetuned_predictor(run: pathlib.Path):
    from keras_mha.rundir.embedding import read_embedding_run
    from keras_mha.train.finetune import encoder_probs

    reader = read_embedding_run(run)
    model, tokenizer = reader.load_model(), reader.tokenizer
    return lambda texts: encoder_probs(model, tokenizer.encode(list(texts))[0])


def table(result: dict) -> str:
    lines = [
        f"{'':14} {'own test':>9} {'unseen':>7} {'number':>7} {'meaning':>8} {'both':>6}  lesson",
    ]
    for name, row in result["runs"].items():
        cue = row["unseen_per_cue"]
        lines.append(
            f"{name:14} {row['own_test_accuracy']:9.3f} {row['unseen_accuracy']:7.3f} "
            f"{cue['number']:7.3f} {cue['semantic']:8.3f} {cue['both']:6.3f}  "
            f"{row['lesson']} ({row['lesson_probability']:.2f})"
        )
    lines.append(
        f"({result['sentences']} unseen sentences, seed {result['seed']}; the lesson's sentence "
        f"means the {LESSON_LABEL})"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
