"""Every figure the README states appears in a doc it links to (issue 46).

The README repeats measurements that live in docs/ (accuracies, bytes,
latencies, cosines). When one is re-measured, the README and the doc must
change together. This test reads the README block by block (a paragraph or a
table; code blocks are skipped) and takes each figure: a decimal (0.893,
1e-5), a number with thousands separators (59,904) or a whole number with a
unit (1 %, 78 KB, 35 µs). Each must appear in one of the docs/*.md files the
same block links to, or, for a block without such a link (a table), one its
section links to. Inline code (commands and their flags) is not prose and is
left out. A figure that is legitimately the README's own is listed in
EXEMPT with the reason; an exemption the README no longer states fails too,
so the list cannot outlive its figure.

Fast: reads text files only, imports nothing of the project.
"""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# Units that make a whole number a figure ("70 %", "78 KB", "35 µs").
UNITS = r"%|bytes|KiB|KB|MB|GB|ms|µs|s|min|minutes"
NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?"
# A number not inside a word (U55-128, L6-v2), a version (5.2.0) or a longer
# number, the end of a range (0.925-0.975) included; with its unit.
FIGURE = re.compile(
    rf"(?<![\w.,/])(?<![A-Za-z]-)({NUMBER})(?![\w]|[.,]\d)(?:\s?({UNITS})(?![\w]))?"
)
LINK = re.compile(r"\]\((docs/[^)#\s]+\.md)(?:#[^)\s]*)?\)")

# figure (as the regex extracts it, unit included) -> why the README alone states it.
EXEMPT: dict[str, str] = {}


def _figures(text: str) -> list[str]:
    """The figures of a block of README text (no inline code, no link targets)."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    found = []
    for match in FIGURE.finditer(text):
        number, unit = match.group(1), match.group(2)
        if any(c in number for c in ".,e"):
            found.append(number)  # precise enough alone: the doc may write its unit otherwise
        elif unit:
            found.append(f"{number} {unit}")
    return found


def _pattern(figure: str) -> re.Pattern:
    """Where a doc states `figure`: its number not inside a longer number, and
    for a whole number its unit after it (any spacing, a line break included)."""
    number, _, unit = figure.partition(" ")
    head = rf"(?<![\d.,]){re.escape(number)}(?!\d|[.,]\d)"
    if unit:
        head += rf"\s*{re.escape(unit)}(?!\w)"
    return re.compile(head)


def _blocks(readme: str) -> list[tuple[str, list[str], list[str]]]:
    """(text, docs it links, docs its section links) for each paragraph or table."""
    readme = re.sub(r"```.*?```", "\n\n", readme, flags=re.S)
    blocks, section, sections = [], 0, {}
    for chunk in re.split(r"\n\s*\n", readme):
        if chunk.lstrip().startswith("## "):
            section += 1
        links = LINK.findall(chunk)
        sections.setdefault(section, []).extend(links)
        blocks.append((section, chunk, links))
    return [(chunk, links, sections[s]) for s, chunk, links in blocks]


def test_every_readme_figure_is_in_a_doc_it_links():
    readme = README.read_text(encoding="utf-8")
    docs: dict[str, str] = {}
    missing, stated = [], set()
    for text, links, section_links in _blocks(readme):
        for figure in _figures(text):
            stated.add(figure)
            if figure in EXEMPT:
                continue
            where = list(dict.fromkeys(links or section_links))
            for name in where:
                if name not in docs:
                    docs[name] = (REPO / name).read_text(encoding="utf-8")
            if not any(_pattern(figure).search(docs[name]) for name in where):
                first_line = " ".join(text.split())[:70]
                missing.append(f"{figure!r} (in {first_line!r}...) is not in {where or 'any doc'}")
    assert not missing, "README figures that no linked doc states:\n" + "\n".join(missing)
    stale = sorted(set(EXEMPT) - stated)
    assert not stale, f"EXEMPT lists figures the README no longer states: {stale}"


def test_the_figure_pattern_takes_figures_and_leaves_versions():
    text = (
        "0.893, 98.33 %, 59,904 bytes, 35 µs, 1e-5, 1 %, 0.925-0.975; "
        "Vela 5.2.0, Ethos-U55-128, 4 of 8 heads, `--alpha 0.5`"
    )
    assert _figures(text) == ["0.893", "98.33", "59,904", "35 µs", "1e-5", "1 %", "0.925", "0.975"]
    assert _pattern("0.44").search("max |Δ| 0.44, tail") and not _pattern("0.44").search("0.445")
    assert _pattern("78 KB").search("| 78\nKB |") and not _pattern("78 KB").search("178 KB")
