"""The table that ends `make test`: every sub-suite it ran, with counts, and a verdict.

    python tests/summary.py RESULTS_DIR [COUNTS.json ...]
    python tests/summary.py --figures RESULTS_DIR     (the figures alone: make llm)

RESULTS_DIR (make test's .cache/test-results) holds pytest.xml, the main
run's junit, where tests/conftest.py tags the tests of some parts with a
`part` property (`part_of` below), and tests/keras_suite/run.py's files: one
junit per suite and backend, or a .txt saying why that suite did not run.
COUNTS.json files are counts from elsewhere, as make test-arm64 writes them:
{"suite": "arm64", "passed": N, "failed": N, "skipped": N, "seconds": S}.
Each line shows its time: a junit file's wall time (its testsuite's `time`),
or for a part of the main run the sum of its tests' times. Before the table,
the figures trained models gave in the main run, each beside its bound, and
the test files that took the most CPU (tests/conftest.py's `cpu` property:
the process and the children it waited for), the budget's measure.

A line fails when it has failures, ran no test (none passed) or has no
results; then the table ends with one line naming each, and the exit is 1.
"""

from __future__ import annotations

import json
import pathlib
import sys
import xml.etree.ElementTree as ET

MAIN = "pytest.xml"
# (label, file in RESULTS_DIR, the `part` of it counted, None: all of it)
LINES = [
    ("pytest on TensorFlow, all of tests/", MAIN, None),
    ("  of which layer tests (tensorflow)", MAIN, "layer tests"),
    ("  of which browser (tests/test_view.py)", MAIN, "browser"),
    ("  of which tflite-runtime 2.14", MAIN, "tflite-runtime"),
    ("  of which TFLite Micro", MAIN, "tflite-micro"),
    *((f"keras suite, {b}", f"keras-suite-{b}.xml", None) for b in ("tensorflow", "jax", "torch")),
    *(
        (f"keras GQA suite, {b}", f"keras-GQA-suite-{b}.xml", None)
        for b in ("tensorflow", "jax", "torch")
    ),
    *((f"layer tests, {b}", f"layer-tests-{b}.xml", None) for b in ("jax", "torch")),
    *(
        (f"keras-hub suite, {b}", f"keras-hub-suite-{b}.xml", None)
        for b in ("tensorflow", "jax", "torch")
    ),
]


def part_of(item) -> str | None:
    """The part of the main run a pytest item also counts in (tests/conftest.py tags it)."""
    callspec = getattr(item, "callspec", None)
    if "browser" in item.fixturenames:
        return "browser"
    if "tflite_runtime" in getattr(item, "originalname", item.name) or (
        callspec is not None and callspec.params.get("runtime") == "tflite-runtime"
    ):
        return "tflite-runtime"
    if item.path.name in ("test_micro.py", "test_edge_micro.py"):
        return "tflite-micro"
    if item.path.name.startswith("test_attention"):
        return "layer tests"
    return None


def outcome(case: ET.Element) -> str:
    """passed, failed, skipped or excluded (a strict xfail) for one junit <testcase>."""
    tags = {child.tag for child in case}
    if tags & {"failure", "error"}:
        return "failed"
    skipped = case.find("skipped")
    if skipped is not None:
        return "excluded" if skipped.get("type") == "pytest.xfail" else "skipped"
    return "passed"


def counts(cases: list[ET.Element]) -> dict[str, int]:
    result = dict.fromkeys(("passed", "failed", "skipped", "excluded"), 0)
    for case in cases:
        result[outcome(case)] += 1
    return result


def seconds(junit: pathlib.Path, part: str | None) -> float:
    """A whole junit file's wall time (its suites' `time`); a part's: its tests' times summed."""
    root = ET.parse(junit).getroot()
    if part is None:
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        if suites and all(s.get("time") for s in suites):
            return sum(float(s.get("time")) for s in suites)
    return sum(float(c.get("time") or 0) for c in cases(junit, part))


def cases(junit: pathlib.Path, part: str | None = None) -> list[ET.Element]:
    found = ET.parse(junit).iter("testcase")
    return [c for c in found if part is None or _part(c) == part]


def _part(case: ET.Element) -> str | None:
    prop = case.find("properties/property[@name='part']")
    return None if prop is None else prop.get("value")


def verdict(found: dict[str, int], why_skipped: str = "") -> str:
    """What is wrong with a line's counts; "" when nothing is."""
    if found["failed"]:
        return f"{found['failed']} failed"
    if not found["passed"]:
        return "no test ran" + (f" (skipped: {why_skipped})" if why_skipped else "")
    return ""


def line(results: pathlib.Path, file: str, part: str | None) -> tuple[dict | None, str]:
    """(counts, problem) of one line of LINES."""
    path = results / file
    if not path.exists():
        reason = path.with_suffix(".txt")
        if reason.exists():
            return None, f"did not run: {reason.read_text().strip()}"
        return None, f"no results ({path} is missing)"
    found = cases(path, part)
    skip = next((c.find("skipped") for c in found if outcome(c) == "skipped"), None)
    result = counts(found) | {"seconds": seconds(path, part)}
    return result, verdict(result, "" if skip is None else skip.get("message", ""))


def extra(path: pathlib.Path) -> tuple[str, dict | None, str]:
    """(label, counts, problem) of a COUNTS.json file."""
    if not path.exists():
        return str(path), None, "no results (the file is missing)"
    data = json.loads(path.read_text())
    found = {k: int(data.get(k, 0)) for k in ("passed", "failed", "skipped")}
    if isinstance(data.get("seconds"), (int, float)):
        found["seconds"] = float(data["seconds"])
    return str(data.get("suite", path.stem)), found, verdict(found)


def table(rows: list[tuple[str, dict | None, str]]) -> str:
    out = [f"{'make test':<42} {'passed':>7} {'failed':>7} {'skipped':>7} {'seconds':>7}"]
    for label, found, problem in rows:
        if found is None:
            numbers = f"{'-':>7} {'-':>7} {'-':>7} {'-':>7}"
        else:
            skipped = found["skipped"] + found.get("excluded", 0)
            took = f"{found['seconds']:>7.0f}" if "seconds" in found else f"{'-':>7}"
            numbers = f"{found['passed']:>7} {found['failed']:>7} {skipped:>7} {took}"
        out.append(f"{label:<42} {numbers}  {'FAIL: ' + problem if problem else 'ok'}")
    failing = [label.strip().removeprefix("of which ") for label, _, problem in rows if problem]
    if failing:
        out.append(f"make test FAILED, {len(failing)} of {len(rows)} lines: " + "; ".join(failing))
    else:
        out.append(f"make test: all {len(rows)} lines ran tests and none failed")
    return "\n".join(out)


def figures(results: pathlib.Path) -> list[str]:
    """The trained models' figures the tests kept (tests/conftest.py `figure`), a line
    each: the main run's, then the backend runs' (their junit file named before)."""
    found = []
    for junit in sorted(results.glob("*.xml"), key=lambda p: (p.name != MAIN, p.name)):
        where = "" if junit.name == MAIN else f"[{junit.stem}] "
        for case in ET.parse(junit).iter("testcase"):
            for prop in case.findall("properties/property[@name='figure']"):
                found.append(f"  {where}{case.get('name')}: {prop.get('value')}")
    return found


def cpu_by_file(results: pathlib.Path, top: int = 15) -> list[str]:
    """The `top` test files by CPU seconds over every junit file in `results`
    (a suite's other than the main run's named before), and the total."""
    spent: dict[str, float] = {}
    for junit in sorted(results.glob("*.xml")):
        where = "" if junit.name == MAIN else f"[{junit.stem}] "
        for case in ET.parse(junit).iter("testcase"):
            for prop in case.findall("properties/property[@name='cpu']"):
                classname = case.get("classname") or "?"
                name = where + (classname.split(".")[-1] if where else classname[len("tests.") :])
                spent[name] = spent.get(name, 0.0) + float(prop.get("value"))
    if not spent:
        return []
    ranked = sorted(spent.items(), key=lambda item: -item[1])
    lines = [f"  {seconds:7.0f} s  {name}" for name, seconds in ranked[:top]]
    return lines + [f"  {sum(spent.values()):7.0f} s  in all ({len(spent)} files)"]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0] == "--figures":  # make llm: a folder's figures only, no table
        print("\n".join(figures(pathlib.Path(argv[1]))))
        return 0
    results = pathlib.Path(argv[0])
    rows = [(label, *line(results, file, part)) for label, file, part in LINES]
    rows += [extra(pathlib.Path(p)) for p in argv[1:]]
    kept = figures(results)
    if kept:  # before the table, whose last line is the verdict
        print("\nFigures of trained models against their bounds (docs/trained_figures.md):")
        print("\n".join(kept))
    spent = cpu_by_file(results)
    if spent:
        print("\nCPU seconds by test file, most first (tests/conftest.py, `cpu`):")
        print("\n".join(spent))
    print("\n" + table(rows))
    return 1 if any(problem for *_, problem in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
