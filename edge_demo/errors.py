"""The one exception the command line turns into a one-line message and exit 2."""

from __future__ import annotations

import os


class BadInput(Exception):
    """Input the app refuses: a bundle file, a flag, or the environment.

    Args:
        where: what is wrong, as the user would name it: a file path, a
            flag (`--quant`), or a package.
        problem: what is wrong with it, in one line.
    """

    def __init__(self, where: str | os.PathLike, problem: str):
        self.where = str(where)
        self.problem = " ".join(str(problem).split())  # always one line
        super().__init__(f"{self.where}: {self.problem}")
