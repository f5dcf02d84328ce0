"""keras-mha-qat RUN --out OUT: an encoder run distilled with int8's rounding in the loop.

The work is keras_mha.qat.train.distill_encoder (a classifier's is
`keras-mha-train --qat EPOCHS`); this module holds the command line only.
"""

from __future__ import annotations

import argparse
import pathlib

from bundle_contract.errors import Parser, UsageError, nonnegative_int, positive_int, run_main
from keras_mha.qat.train import DEFAULTS, distill_encoder  # numpy only: no TensorFlow
from keras_mha.quiet_tensorflow import import_tensorflow

PROG = "keras-mha-qat"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=pathlib.Path, help="an embedding run (keras-mha-import)")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the new run directory")
    parser.add_argument(
        "--rule",
        choices=("minmax", "percentile", "mse"),
        default=DEFAULTS["rule"],
        help=f"how each point's range is chosen (default {DEFAULTS['rule']})",
    )
    parser.add_argument(
        "--steps", type=positive_int, default=DEFAULTS["steps"], help="training steps"
    )
    parser.add_argument("--batch-size", type=positive_int, default=DEFAULTS["batch_size"])
    parser.add_argument("--learning-rate", type=float, default=DEFAULTS["learning_rate"])
    parser.add_argument("--seed", type=nonnegative_int, default=DEFAULTS["seed"])
    parser.add_argument("--overwrite", action="store_true", help="replace a run at --out")
    return parser


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        from keras_mha.rundir.embedding import TASK
        from keras_mha.rundir.tasks import require
        from keras_mha.rundir.writing import check_out

        require(args.run_dir, TASK, "its quantization-aware training is keras-mha-train --qat")
        if not 0 < args.learning_rate < 1:
            raise UsageError(f"must be in (0, 1); got {args.learning_rate}", "--learning-rate")
        check_out(args.out, args.overwrite)
        import_tensorflow()
        distill_encoder(
            args.run_dir,
            args.out,
            overwrite=args.overwrite,
            rule=args.rule,
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            seed=args.seed,
        )
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
