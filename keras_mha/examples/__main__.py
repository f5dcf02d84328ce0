"""python -m keras_mha.examples pronouns|topics FILE: labelled text the project owns, as a CSV."""

from __future__ import annotations

import argparse
import pathlib

from keras_mha.examples import PRONOUN_SENTENCES, pronoun_rows, topic_rows, write_csv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split(": ", 1)[1])
    parser.add_argument("task", choices=("pronouns", "topics"))
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--sentences", type=int, default=PRONOUN_SENTENCES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = pronoun_rows(args.sentences, args.seed) if args.task == "pronouns" else topic_rows()
    write_csv(args.out, rows)
    print(f"{args.out}: {len(rows)} rows, {len({label for _, label in rows})} classes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
