"""The command line `keras-mha-edge` (`python -m edge_demo`): the top layer.

`cli` (the parser and `main`), `runs` (the parity run, `--sample`,
`--text`), `head_view` (`--view`), `report` (tables, the digit picture).
May import every other part of the package; nothing imports it but
`__main__`.
"""
