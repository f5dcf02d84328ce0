"""Every input that ever crashed the app, replayed (tests/fuzz/regressions/*.json), and a
bounded end-to-end campaign (tests/fuzz/campaign.py) on the text bundle (LiteRT) and the
digits bundle (LiteRT and tflite-runtime).

A regression is a recipe (tests/fuzz/mutations.py) applied to a copy of the
fixture and an argument list, with the answer the fixed app gives
(`expect`): `usage-2` (one error line, naming `names`: the file or flag, and
saying `says` when given: the reason the recipe is about),
`fail-1`, or `ok-0` (only for a lenient manifest field; a corrupted model is
never ok-0). A finding saved by the campaign has no `expect` until it is
fixed and labelled. `make fuzz` runs the campaign with thousands of cases.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

import pytest

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
import campaign  # noqa: E402
from mutations import apply  # noqa: E402

pytest_plugins = ["edge_fixtures"]
REGRESSIONS = sorted((HERE / "regressions").glob("*.json"))
CAMPAIGN_CASES = int(os.environ.get("EDGE_FUZZ_CASES", "30"))


def _python(runtime: str = "litert") -> pathlib.Path:
    from edge_bundle import edge_python

    return edge_python(runtime)


@pytest.mark.parametrize("case", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression(case, text_bundle, tmp_path):
    saved = json.loads(case.read_text())
    bundle = pathlib.Path(shutil.copytree(text_bundle, tmp_path / "bundle"))
    if saved["recipe"]["kind"] != "none":
        apply(bundle, saved["recipe"])
    args = [a.format(tmp=tmp_path, bundle=bundle) for a in saved["args"]]
    expect = saved.get("expect")
    assert expect in ("ok-0", "fail-1", "usage-2"), f"{case.name}: label it with 'expect'"
    assert not (expect == "ok-0" and saved["recipe"]["kind"] == "tflite"), "a corrupted model"
    outcome = campaign.run_case(_python(), bundle, args, timeout=120, memory_mb=512)
    label = campaign.classify(outcome, saved["recipe"], 512, 0.0)
    assert label == expect, (label, outcome["stdout"][-400:], outcome["stderr"][-800:])
    if expect == "usage-2":
        assert saved["names"] in outcome["stderr"], (saved["names"], outcome["stderr"])
        # refused for the reason the recipe is about, not an earlier check's
        assert saved.get("says", "") in outcome["stderr"], (saved["says"], outcome["stderr"])


@pytest.mark.parametrize(
    "fixture, runtime",
    [("text_bundle", "litert"), ("digits_bundle", "litert"), ("digits_bundle", "tflite-runtime")],
)
def test_bounded_campaign(fixture, runtime, request, tmp_path):
    """The text bundle on LiteRT, the digits bundle (every mode, images, no vocab) on
    LiteRT and on tflite-runtime 2.14 (which skips the dynamic mode it cannot load)."""
    bundle = request.getfixturevalue(fixture)
    report = tmp_path / "report.json"
    code = campaign.main(
        [
            "--bundle",
            str(bundle),
            "-n",
            str(CAMPAIGN_CASES),
            "--seed",
            "21",
            "--python",
            str(_python(runtime)),
            "--report",
            str(report),
        ]  # fmt: skip
    )
    counts = json.loads(report.read_text())
    assert code == 0 and counts["findings"] == 0, counts
    ran = counts["cases"] - counts["counts"].get("recipe-not-applicable", 0)
    assert ran >= CAMPAIGN_CASES * 2 // 3, counts  # not passed by recipes that did not apply


def test_a_mode_the_manifest_rules_out_is_no_corrupted_model_passing():
    """tflite-runtime skips, unread, the modes the manifest says it cannot run: exit 0
    is right there. A mode skipped because the runtime refused the mutated model is
    the finding (a corrupted model hidden behind exit 0)."""
    recipe = {"kind": "tflite", "file": "model_int8.tflite", "site": 0, "value": 1}
    declared = "int8: skipped: manifest.json says tflite-runtime cannot run model_int8.tflite\n"
    refused = "int8: skipped: tflite-runtime cannot load it (unsupported op)\n"
    for stdout, label in ((declared, "ok-0"), (refused, "corrupt-passed")):
        outcome = {"code": 0, "stdout": "PASS\n" + stdout, "stderr": "", "timeout": False}
        outcome["maxrss_mb"] = 10.0
        assert campaign.classify(outcome, recipe, 512, 0.0) == label
    assert campaign.probe_skips(declared + refused) == ["int8"]
