"""make arm64-prepare: a run cut to its first eval rows (keras_mha.rundir.subset).

usage: python first_rows.py RUN OUT EVAL_ROWS

The emulated run verifies every eval row in every mode on each CPU; a few
hundred rows compare the kernels as thousands do (mk/arm64.mk says how many).
"""

from __future__ import annotations

import sys

from bundle_contract.errors import UsageError
from keras_mha.rundir.subset import first_rows


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[2].isdigit():
        print("usage: first_rows.py RUN OUT EVAL_ROWS", file=sys.stderr)
        return 2
    try:
        first_rows(argv[0], argv[1], int(argv[2]))
    except UsageError as error:
        print(f"first_rows.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
