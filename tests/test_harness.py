"""The test harness itself: make test's table (tests/summary.py), the Keras-suite
checks of tests/keras_suite/run.py, the `slow` and `part` marks of
tests/conftest.py, and strict runs, where a backend venv that cannot be built
fails instead of skipping."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import types

import conftest
import environment
import pytest
import summary
from keras_suite import run

REPO = pathlib.Path(__file__).resolve().parents[1]
TAGS = {
    "failed": '<failure message="assert 1 == 2"/>',
    "error": '<error message="fixture broke"/>',
    "skipped": '<skipped type="pytest.skip" message="{why}"/>',
    "excluded": '<skipped type="pytest.xfail" message="listed"/>',
    "passed": "",
}


def write_junit(path: pathlib.Path, *cases, why: str = "no chromium") -> pathlib.Path:
    """A junit file as pytest writes it; cases: (name, outcome[, part])."""
    rows = []
    for name, kind, *part in cases:
        props = (
            f'<properties><property name="part" value="{part[0]}"/></properties>' if part else ""
        )
        body = TAGS[kind].format(why=why)
        rows.append(f'<testcase classname="tests.test_x" name="{name}">{props}{body}</testcase>')
    path.write_text(
        f'<testsuites><testsuite name="pytest">{"".join(rows)}</testsuite></testsuites>'
    )
    return path


def many(n: int, kind: str = "passed", prefix: str = "test_") -> list[tuple[str, str]]:
    return [(f"{prefix}{i}", kind) for i in range(n)]


# --- summary.py: counts, lines, table, exit status -----------------------------------


def test_counts_each_outcome_once(tmp_path):
    junit = write_junit(
        tmp_path / "j.xml",
        ("a", "passed"),
        ("b", "failed"),
        ("c", "error"),
        ("d", "skipped"),
        ("e", "excluded"),
    )
    found = summary.counts(summary.cases(junit))
    assert found == {"passed": 1, "failed": 2, "skipped": 1, "excluded": 1}


def test_a_part_counts_only_its_tagged_tests(tmp_path):
    write_junit(
        tmp_path / "pytest.xml",
        ("a", "passed", "browser"),
        ("b", "skipped", "browser"),
        ("c", "passed", "tflite-micro"),
        ("d", "passed"),
    )
    assert summary.line(tmp_path, "pytest.xml", "browser") == (
        {"passed": 1, "failed": 0, "skipped": 1, "excluded": 0, "seconds": 0.0},
        "",
    )
    assert summary.line(tmp_path, "pytest.xml", None)[0]["passed"] == 3


def test_a_line_fails_on_failures_on_no_test_ran_and_on_no_results(tmp_path):
    write_junit(tmp_path / "pytest.xml", ("a", "passed"), ("b", "failed", "tflite-runtime"))
    write_junit(tmp_path / "skipped.xml", ("a", "skipped"), ("b", "skipped"), why="no venv X")
    write_junit(tmp_path / "empty.xml")
    (tmp_path / "keras-suite-jax.txt").write_text(".venv-jax is not installed\n")
    assert summary.line(tmp_path, "pytest.xml", "tflite-runtime")[1] == "1 failed"
    assert summary.line(tmp_path, "skipped.xml", None)[1] == "no test ran (skipped: no venv X)"
    assert summary.line(tmp_path, "empty.xml", None)[1] == "no test ran"
    assert summary.line(tmp_path, "keras-suite-jax.xml", None) == (
        None,
        "did not run: .venv-jax is not installed",
    )
    assert summary.line(tmp_path, "layer-tests-jax.xml", None)[1].startswith("no results (")


def _all_green(results: pathlib.Path) -> None:
    parts = [part for _, _, part in summary.LINES if part]
    write_junit(results / summary.MAIN, *[(p, "passed", p) for p in parts], ("x", "skipped"))
    for _, file, _ in summary.LINES:
        if file != summary.MAIN:
            write_junit(results / file, *many(3))


def row_of(out: str, label: str) -> str:
    """The row of the table for `label`, after the label, spaces squeezed."""
    (row,) = [r for r in out.splitlines() if r.startswith(label + " ")]
    return " ".join(row[len(label) :].split())


def test_table_passes_when_every_line_ran_and_none_failed(tmp_path, capsys):
    _all_green(tmp_path)
    assert summary.main([str(tmp_path)]) == 0
    header, *rows, last = capsys.readouterr().out.strip().splitlines()
    assert header.split() == ["make", "test", "passed", "failed", "skipped", "seconds"]
    assert len(rows) == len(summary.LINES) and all(row.endswith("  ok") for row in rows)
    assert rows[0].split()[-5:] == ["4", "0", "1", "0", "ok"]  # one test per part, one skipped
    assert last == f"make test: all {len(summary.LINES)} lines ran tests and none failed"


def test_each_line_shows_its_time(tmp_path, capsys):
    """A junit file's wall time (its suite's `time`), a part's tests summed, arm64's own."""
    _all_green(tmp_path)
    main = tmp_path / summary.MAIN
    text = main.read_text().replace(
        '<testsuite name="pytest">', '<testsuite name="pytest" time="1234.5">'
    )
    text = text.replace(
        'classname="tests.test_x" name="browser"',
        'classname="tests.test_x" name="browser" time="61.4"',
    )
    main.write_text(text)
    arm64 = tmp_path / "arm64.json"
    arm64.write_text(json.dumps({"suite": "arm64", "passed": 3, "failed": 0, "seconds": 700.2}))
    assert summary.main([str(tmp_path), str(arm64)]) == 0
    out = capsys.readouterr().out
    assert row_of(out, "pytest on TensorFlow, all of tests/").split()[3] == "1234"
    assert row_of(out, "  of which browser (tests/test_view.py)").split()[3] == "61"
    assert row_of(out, "arm64") == "3 0 0 700 ok"


def test_the_figures_of_trained_models_come_before_the_table(tmp_path, capsys):
    _all_green(tmp_path)
    main = tmp_path / summary.MAIN
    prop = '<property name="figure" value="test_accuracy = 0.9611 (&gt;= 0.85)"/>'
    text = main.read_text().replace('name="x">', f'name="x"><properties>{prop}</properties>', 1)
    main.write_text(text)
    assert summary.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  x: test_accuracy = 0.9611 (>= 0.85)" in out.splitlines()
    assert out.index("test_accuracy") < out.index("make test: all")
    # the backend runs' figures too, named by their file
    jax = tmp_path / "layer-tests-jax.xml"
    jax.write_text(
        jax.read_text().replace(
            'name="test_0">', f'name="test_0"><properties>{prop}</properties>', 1
        )
    )
    summary.main([str(tmp_path)])
    assert "  [layer-tests-jax] test_0: test_accuracy = 0.9611 (>= 0.85)" in capsys.readouterr().out


def test_cpu_seconds_are_added_up_per_file_most_first(tmp_path, capsys):
    def case(classname, cpu):
        prop = f'<properties><property name="cpu" value="{cpu}"/></properties>'
        return f'<testcase classname="{classname}" name="t">{prop}</testcase>'

    main = [case("tests.test_a", 2.5), case("tests.test_b", 7.0), case("tests.test_a", 5.0)]
    jax = [case("tests.keras_suite.keras_suite.MultiHeadAttentionTest", 9.0)]
    for name, cases in ((summary.MAIN, main), ("keras-suite-jax.xml", jax)):
        body = "".join(cases)
        (tmp_path / name).write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    assert summary.cpu_by_file(tmp_path, top=2) == [
        "        9 s  [keras-suite-jax] MultiHeadAttentionTest",
        "        8 s  test_a",
        "       24 s  in all (3 files)",
    ]
    (tmp_path / summary.MAIN).write_text("<testsuites><testsuite/></testsuites>")
    (tmp_path / "keras-suite-jax.xml").unlink()
    assert summary.cpu_by_file(tmp_path) == []  # no property: no lines


def test_table_fails_and_names_the_line_that_ran_nothing(tmp_path, capsys):
    _all_green(tmp_path)
    write_junit(tmp_path / "layer-tests-torch.xml", *many(5, "skipped"), why="no torch")
    assert summary.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert row_of(out, "layer tests, torch") == "0 0 5 0 FAIL: no test ran (skipped: no torch)"
    assert out.strip().endswith(f"FAILED, 1 of {len(summary.LINES)} lines: layer tests, torch")


def test_a_missing_results_file_fails_the_table(tmp_path, capsys):
    _all_green(tmp_path)
    (tmp_path / "keras-suite-tensorflow.xml").unlink()
    assert summary.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert row_of(out, "keras suite, tensorflow").startswith("- - - - FAIL: no results (")
    assert out.strip().endswith("lines: keras suite, tensorflow")


def test_counts_json_lines_arm64(tmp_path, capsys):
    _all_green(tmp_path)
    arm64 = tmp_path / "summary.json"
    arm64.write_text(json.dumps({"suite": "arm64", "passed": 4, "failed": 0, "skipped": 0}))
    assert summary.main([str(tmp_path), str(arm64)]) == 0
    assert row_of(capsys.readouterr().out, "arm64") == "4 0 0 - ok"
    arm64.write_text(json.dumps({"suite": "arm64", "passed": 3, "failed": 1, "skipped": 0}))
    assert summary.main([str(tmp_path), str(arm64)]) == 1
    assert capsys.readouterr().out.strip().endswith("lines: arm64")
    assert summary.main([str(tmp_path), str(tmp_path / "absent.json")]) == 1


# --- tests/conftest.py: which tests are slow, which part they count in ---------------


def _item(name, path="test_x.py", fixtures=(), params=None):
    marks = []
    return types.SimpleNamespace(
        name=name,
        originalname=name.split("[")[0],
        path=REPO / "tests" / path,
        fixturenames=list(fixtures),
        callspec=None if params is None else types.SimpleNamespace(params=params),
        user_properties=[],
        marks=marks,
        add_marker=marks.append,
    )


def test_the_longest_files_exist_and_come_first():
    missing = [name for name in conftest.LONGEST_FILES if not (REPO / "tests" / name).is_file()]
    assert not missing, f"conftest.LONGEST_FILES names files that are gone: {missing}"
    names = ["test_b.py", "test_readme.py", "test_a.py", "test_finetune.py", "test_readme.py"]
    items = [types.SimpleNamespace(path=pathlib.Path("tests", n), n=i) for i, n in enumerate(names)]
    conftest.longest_first(items)
    assert [(i.path.name, i.n) for i in items] == [
        ("test_finetune.py", 3), ("test_readme.py", 1), ("test_readme.py", 4),
        ("test_b.py", 0), ("test_a.py", 2),
    ]  # fmt: skip


def test_tests_that_train_or_export_through_any_fixture_are_slow():
    trains = _item("test_a", fixtures=["micro_run", "digits_bundle", "digits_export", "digits_run"])
    through_text = _item("test_b", fixtures=["text_copy", "text_bundle", "text_run"])
    by_name = _item("test_d[digits_bundle]", fixtures=["request"], params={"f": "digits_bundle"})
    quick = _item("test_c", fixtures=["tmp_path", "text_run", "app_dir"], params={"m": "int8"})
    conftest.pytest_collection_modifyitems(None, [trains, through_text, by_name, quick])
    for item in (trains, through_text, by_name):
        assert [m.name for m in item.marks] == ["slow"], item.name
    assert quick.marks == []


def test_parts_of_the_main_run():
    cases = {
        "browser": _item("test_page", "test_view.py", fixtures=["browser", "tmp_path"]),
        "tflite-runtime": _item("test_tflite_runtime_214_x", "test_export_view_signature.py"),
        "tflite-micro": _item("test_arena", "test_micro.py"),
        "layer tests": _item("test_call", "test_attention_keras.py"),
        None: _item("test_view_html", "test_view.py", fixtures=["tmp_path"]),
    }
    for part, item in cases.items():
        assert summary.part_of(item) == part, item.name
    tflite = _item(
        "test_sample[tflite-runtime]", "test_edge_cli.py", params={"runtime": "tflite-runtime"}
    )
    litert = _item("test_sample[litert]", "test_edge_cli.py", params={"runtime": "litert"})
    assert summary.part_of(tflite) == "tflite-runtime"
    assert summary.part_of(litert) is None
    conftest.pytest_collection_modifyitems(None, [tflite])
    assert tflite.user_properties == [("part", "tflite-runtime")]


# --- tests/keras_suite/run.py: the swap and the minimum number of passes --------------


def test_keras_suite_needs_the_swap_test_passed_and_enough_passes(tmp_path):
    least = run.MIN_PASSED["keras suite"]["jax"]
    enough = many(least)
    with_swap = write_junit(tmp_path / "a.xml", *enough, (run.SWAP_TEST, "passed"))
    swap_skipped = write_junit(tmp_path / "b.xml", *enough, (run.SWAP_TEST, "skipped"))
    too_few = write_junit(tmp_path / "c.xml", *many(least - 2), (run.SWAP_TEST, "passed"))
    assert run.judge("keras suite", "jax", summary.cases(with_swap)) == ""
    assert run.SWAP_TEST in run.judge("keras suite", "jax", summary.cases(swap_skipped))
    assert run.judge("keras suite", "jax", summary.cases(too_few)).startswith(
        f"only {least - 1} passed, at least {least} expected"
    )
    assert run.judge("layer tests", "torch", summary.cases(with_swap)).startswith("only ")


def test_keras_hub_suite_needs_its_swap_test(tmp_path):
    least = run.MIN_PASSED["keras-hub suite"]["tensorflow"]
    enough = many(least)
    with_swap = write_junit(tmp_path / "a.xml", *enough, (run.HUB_SWAP_TEST, "passed"))
    swap_failed = write_junit(tmp_path / "b.xml", *enough, (run.HUB_SWAP_TEST, "skipped"))
    assert run.judge("keras-hub suite", "tensorflow", summary.cases(with_swap)) == ""
    assert run.HUB_SWAP_TEST in run.judge(
        "keras-hub suite", "tensorflow", summary.cases(swap_failed)
    )
    # every vendored file is in the suite, the swap check among them
    assert "tests/keras_hub_suite/swap_check.py" in run.KERAS_HUB_SUITE
    assert len(run.KERAS_HUB_SUITE) == 10


def test_the_minimums_are_far_above_nothing():
    for suite, backends in run.MIN_PASSED.items():
        assert set(backends) == set(run.VENVS), suite  # every suite on every backend
        assert min(backends.values()) >= 25, suite  # Keras's GQA file has 29 to 31


# --- strict runs: a missing environment fails ----------------------------------------


def _env(strict: str) -> dict[str, str]:
    """This environment, with strictness set explicitly and no make of ours around it."""
    drop = ("CI", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "KERAS_MHA_STRICT")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "KERAS_MHA_STRICT": strict}


def test_missing_skips_and_strict_fails(monkeypatch):
    monkeypatch.setenv("KERAS_MHA_STRICT", "1")
    with pytest.raises(pytest.fail.Exception, match="strict run: a chromium is missing"):
        environment.missing("a chromium")
    monkeypatch.setenv("KERAS_MHA_STRICT", "0")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.skip.Exception, match="a chromium is missing"):
        environment.missing("a chromium")


@pytest.mark.parametrize("strict", ["1", "0"])
def test_run_py_fails_a_strict_run_when_a_backend_venv_failed_to_build(tmp_path, strict):
    venv = tmp_path / ".venv-jax"
    venv.mkdir()
    (venv / ".failed").write_text("building .venv-jax failed (pip install jax jaxlib)\n")
    results = tmp_path / "results"
    argv = ["--backends", "jax", "--venv", f"jax={venv}", "--junit-dir", str(results)]
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "keras_suite" / "run.py"), *argv],
        env=_env(strict),
        capture_output=True,
        text=True,
        timeout=120,
    )
    first = proc.stdout.splitlines()[0]
    assert first.split()[0] == "jax" and "building .venv-jax failed (pip" in first
    assert proc.returncode == (1 if strict == "1" else 0), proc.stdout + proc.stderr
    assert (" FAILED: " if strict == "1" else " SKIPPED: ") in first
    # make test's table then says each suite did not run, and why.
    for file in ("keras-suite-jax.xml", "layer-tests-jax.xml"):
        assert summary.line(results, file, None)[1].startswith("did not run: ")


@pytest.mark.parametrize("strict", ["1", "0"])
def test_make_backend_venvs_stops_a_strict_run_when_a_venv_cannot_be_built(tmp_path, strict):
    jax, torch = tmp_path / "jax", tmp_path / "torch"
    make = ["make", "-s", "-C", str(REPO), "backend-venvs", "PYTHON=false"]
    make += [f"JAX_VENV={jax}", f"TORCH_VENV={torch}"]  # `false -m venv` fails
    proc = subprocess.run(make, env=_env(strict), capture_output=True, text=True, timeout=120)
    assert (proc.returncode != 0) == (strict == "1"), proc.stderr
    named = [line for line in proc.stderr.splitlines() if line.startswith("make backend-venvs: ")]
    assert len(named) == 2, proc.stderr  # -k: both were tried
    assert f"building {jax} failed" in named[0] and f"building {torch} failed" in named[1]
    then = "a strict run stops here" if strict == "1" else "reported as SKIPPED"
    assert all(then in line for line in named), named
    assert (jax / ".failed").exists() and (torch / ".failed").exists()


@pytest.mark.parametrize("strict", ["1", "0"])
def test_make_browser_stops_a_strict_run_when_chromium_cannot_be_installed(tmp_path, strict):
    (tmp_path / "id").symlink_to(shutil.which("id"))  # a PATH with no chromium, no apt-get
    env = {**_env(strict), "PATH": str(tmp_path)}
    make = [shutil.which("make"), "-s", "-C", str(REPO), "browser"]
    proc = subprocess.run(make, env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode != 0) == (strict == "1"), proc.stderr
    assert proc.stderr.startswith(
        "make browser: Debian's chromium and chromium-driver are missing ("
    ), proc.stderr
    then = "a strict run stops here" if strict == "1" else "browser tests will skip"
    assert then in proc.stderr.splitlines()[0]


def test_keras_hub_beside_tensorflow_only_where_the_shared_packages_match(monkeypatch):
    """keras-hub's suite on JAX and PyTorch imports TensorFlow from its venv:
    only where Python and the packages both load (`run.SHARED`) are the same."""
    same = {"python": "3.11", "site": "/tf/site-packages"}
    same.update({name: "1.0" for name in run.SHARED})
    described = {"jax": same, "tf": same}
    monkeypatch.setattr(run, "_python", lambda backend, venvs: (pathlib.Path("tf"), ""))
    monkeypatch.setattr(run, "_describe_venv", lambda python: described[python.name])
    start, why = run._beside_tensorflow(pathlib.Path("jax"), run.VENVS)
    assert why == "" and start[0] == "-c" and "site.addsitedir('/tf/site-packages')" in start[1]
    # a package only TensorFlow's venv has (protobuf in a fresh JAX venv) loads from there
    described["jax"] = {**same, "protobuf": None}
    assert run._beside_tensorflow(pathlib.Path("jax"), run.VENVS)[1] == ""
    described["jax"] = {**same, "numpy": "2.5.0", "python": "3.12"}
    start, why = run._beside_tensorflow(pathlib.Path("jax"), run.VENVS)
    assert start == [] and why == (
        "TensorFlow's venv differs: python 3.12 here, 3.11 beside TensorFlow; "
        "numpy 2.5.0 here, 1.0 beside TensorFlow"
    )
    monkeypatch.setattr(run, "_python", lambda backend, venvs: (None, ".venv is missing"))
    assert run._beside_tensorflow(pathlib.Path("jax"), run.VENVS) == (
        [],
        "keras-hub's test helpers need TensorFlow: .venv is missing",
    )


def test_a_runtime_without_a_wheel_for_this_python_is_skipped_in_one_line(tmp_path, monkeypatch):
    """tflite-runtime 2.14 (CPython <= 3.11) and TFLite Micro (3.11, x86-64): on another
    Python make says so in one line and goes on, and the tests read why from .skipped."""
    fake = tmp_path / "python"  # answers the Makefile's question as a CPython 3.12 would
    fake.write_text("#!/bin/sh\necho cpython-3.12-x86_64\n")
    fake.chmod(0o755)
    tflite, micro = tmp_path / "tflite", tmp_path / "micro"
    make = ["make", "-s", "-C", str(REPO), f"PYTHON={fake}", f"TFLITE_VENV={tflite}"]
    make += [f"MICRO_VENV={micro}", f"{tflite}/.installed", f"{micro}/.installed"]
    proc = subprocess.run(make, env=_env("1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines == [
        "tflite-runtime 2.14: no wheel for cpython-3.12-x86_64 (CPython 3.8-3.11 on x86_64 "
        "or aarch64 only); skipped, and so are its tests",
        "TensorFlow Lite Micro: no wheel for cpython-3.12-x86_64 (CPython 3.11 on x86_64 "
        "only); skipped, and so are its tests",
    ]
    assert (tflite / ".skipped").read_text().strip() == lines[0]
    assert not (tflite / ".installed").exists() and not (tflite / "bin").exists()
    monkeypatch.setenv("KERAS_MHA_STRICT", "1")  # CI: a test that needs it fails, saying why
    with pytest.raises(pytest.fail.Exception, match="no wheel for cpython-3.12-x86_64"):
        environment.venv_python(tflite / "bin" / "python", "make edge-venvs")


def test_make_demo_needs_only_litert(tmp_path):
    """make demo (and every target but make test's) builds the LiteRT venv alone."""
    venvs = {name: tmp_path / name for name in ("EDGE_VENV", "TFLITE_VENV", "MICRO_VENV")}
    for target in ("demo", "finetune", "heads", "npu", "encoder", "bench", "fuzz"):
        make = ["make", "-n", "-C", str(REPO), target, f"RUN={tmp_path / 'run'}"]
        make += [f"{name}={path}" for name, path in venvs.items()]  # none exists: -n shows each
        proc = subprocess.run(make, env=_env("0"), capture_output=True, text=True, timeout=60)
        assert (
            f"{venvs['EDGE_VENV']} -m venv" in proc.stdout
            or f"{venvs['EDGE_VENV']}/bin" in proc.stdout
        ), (target, proc.stdout[-2000:])
        assert str(venvs["TFLITE_VENV"]) not in proc.stdout, target
        assert str(venvs["MICRO_VENV"]) not in proc.stdout, target
    proc = subprocess.run(  # while make test builds all three
        ["make", "-n", "-C", str(REPO), "test-prereqs", *[f"{k}={v}" for k, v in venvs.items()]],
        env=_env("0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert all(f"-m venv {path}" in proc.stdout for path in venvs.values()), proc.stdout[-2000:]


def test_the_pre_commit_hooks_run_what_make_lint_runs():
    """.pre-commit-config.yaml runs each command of the Makefile's lint recipe."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    commands = [
        line.strip().replace("$(VENV)", ".venv").removesuffix(" .")
        for line in recipe.splitlines()[1:]
        if line.startswith("\t")
    ]
    assert len(commands) >= 2 and all("ruff" in c for c in commands), commands
    config = (REPO / ".pre-commit-config.yaml").read_text()
    entries = [
        line.split("entry:", 1)[1].strip() for line in config.splitlines() if "entry:" in line
    ]
    assert sorted(entries) == sorted(commands)
