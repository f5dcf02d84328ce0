"""One-line usage errors with exit status 2, for keras-mha-train and keras-mha-heads.

(keras-mha-export and the edge demo keep their own: neither may import
keras_mha, and with it TensorFlow, before it is ready to.)
"""

from __future__ import annotations

import argparse


def one_line(error: BaseException | str) -> str:
    """`error`'s message with every run of whitespace (newlines too) as one space."""
    return " ".join(str(error).split())


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr, exit status 2.

    Subparsers made by `add_subparsers` inherit the class, so a bad option
    of a subcommand is one line too.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")
