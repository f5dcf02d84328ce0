"""Plain text tables, as the edge app's report and the quantization debugger print them.

Standard library only; imports nothing of this package.
"""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """A plain text table, columns padded; `right` = indices of right-aligned columns."""
    right = right or set()
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        padded = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
