"""The README's Python examples run as written."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    # The first example's shapes are what its comments say.
    first = {}
    exec(compile(blocks[0], str(README), "exec"), first)  # noqa: S102
    assert tuple(first["scores"].shape) == (2, 12, 10, 10)
    assert first["mha"].d_k == 64
