"""Issue 21: a bundle the device did not make, tried as an attacker would.

One test (or a few) per class of the issue, each failing on the code before
the fix: 1 native crashes (every signature probed in a child, the debugger's
models too), 2 a corrupted model passing as "skipped", 3 exit 3 for bad
input, 4 a bundle's regex that backtracks for ever, 5 memory (bounds before
allocation, bounded inflation, size before reading), 6 outputs renamed over
special files or into the bundle, 7 terminal safety, duplicate keys, numpy
warnings, Ctrl-C while importing. The fuzz harness is tests/fuzz/.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from edge_bundle import REPO, edit_manifest, one_error_line, run_main

from keras_mha_edge.app.cli import RUNTIME_CHOICES, main
from keras_mha_edge.contract.arrays import read_npz
from keras_mha_edge.contract.bundle import parse_labels
from keras_mha_edge.contract.fields import parse_json
from keras_mha_edge.contract.files import check_output, read_inside
from keras_mha_edge.contract.manifest import Manifest
from keras_mha_edge.contract.vocab import Vocab
from keras_mha_edge.errors import UsageError, safe
from keras_mha_edge.runtimes.runtime import RUNTIMES

sys.path.insert(0, str(pathlib.Path(__file__).parent / "fuzz"))
from mutations import apply  # noqa: E402

pytest_plugins = ["edge_fixtures"]
PROG = "keras-mha-edge"


def edge(*argv) -> tuple[int, str, str]:
    return run_main(main, [*argv, "--runtime", "litert"] if "--runtime" not in argv else list(argv))


def edge_process(*argv, python=None) -> subprocess.CompletedProcess:
    """The app in a child process (a crash there must not be this test's crash)."""
    python = python or sys.executable
    return subprocess.run(
        [str(python), "-m", "edge_demo", *map(str, argv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=300,
        check=False,
    )


def assert_bad(result, *fragments: str) -> str:
    status, stdout, stderr = result
    assert status == 2, (status, stdout, stderr)
    return one_error_line(stderr, PROG, *fragments)


# --- 1. native crashes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "value", "argv"),
    [
        pytest.param("signature1.subgraph_index", 99, ["--quant", "int8"], id="subgraph-index"),
        pytest.param(
            "subgraph1.outputs[0]", -1, ["--sample", "0", "--view", "{tmp}/v.html"], id="output-1"
        ),
    ],
)
def test_a_corrupt_signature_crashes_the_probe_not_the_app(text_copy, tmp_path, what, value, argv):
    apply(text_copy, {"kind": "tflite", "file": "model_int8.tflite", "what": what, "site": 0,
                      "value": value})  # fmt: skip
    done = edge_process(text_copy, *[a.format(tmp=tmp_path) for a in argv], "--runtime", "litert")
    assert done.returncode in (0, 1, 2), (done.returncode, done.stdout, done.stderr)  # no signal
    if done.returncode == 2:
        one_error_line(done.stderr, PROG, "model_int8.tflite")


def test_the_debugger_probes_its_models_first(text_copy):
    apply(text_copy, {"kind": "tflite", "file": "model_float32.tflite", "site": 0,
                      "what": "subgraph0.op3.opcode_index", "value": 0})  # fmt: skip
    done = edge_process(text_copy, "--debug", "int8", "--sample", "0")
    assert done.returncode == 2, (done.stdout, done.stderr)
    one_error_line(done.stderr, PROG, "model_float32.tflite")


# --- 2. a corrupted model is not a missing kernel -------------------------------------


def test_a_load_failure_on_a_runtime_that_ran_the_mode_is_a_failure(text_bundle, monkeypatch):
    from keras_mha_edge.app import runs
    from keras_mha_edge.contract.bundle import open_bundle
    from keras_mha_edge.runtimes.probe import ProbeResult
    from keras_mha_edge.runtimes.runtime import select_runtime

    bundle = open_bundle(text_bundle, "int8,float32")
    runtime = select_runtime("litert")
    assert bundle.manifest.models["int8"].runtimes.get(runtime.name) is True
    unsupported = ProbeResult(False, "ai-edge-litert cannot run it (type not supported)")
    monkeypatch.setattr(runs, "probe_model", lambda *a, **k: unsupported)
    plan = runs.plan_modes(bundle, runtime)
    assert plan["int8"].status == "failed" and plan["int8"].passed is False
    assert "corrupted" in plan["int8"].failures[0]


# --- 3. bad input is exit 2, never exit 3 -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1" * 5000, "digits"),
        ("[" * 2000 + "]" * 2000, "nested"),
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        ('{"a": 1e400}', "out of range"),
        ('{"a": 1, "a": 2}', "appears twice"),
        (b'{"a": "\xff"}', "UTF-8"),
    ],
)
def test_json_the_parser_refuses(text, problem):
    with pytest.raises(UsageError, match=problem) as info:
        parse_json(text, "manifest.json")
    assert str(info.value).startswith("manifest.json: ")


@pytest.fixture
def manifest_json(text_bundle) -> dict:
    return json.loads((text_bundle / "manifest.json").read_text())


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda m: m["models"]["int8"]["input"].update(zero_point=10**19), "zero_point"),
        (lambda m: m["models"]["int8"]["input"].update(scale=1e-300), "scale"),
        (lambda m: m["labels"].update(file="l\ud800.json"), "labels.file"),
        (lambda m: m["labels"].update(file="x" * 300), "labels.file"),
        (lambda m: m["attention"].update(layers=10**7), "attention.layers"),
        (lambda m: m["eval"].update(samples=10**9), "eval.samples"),
        (lambda m: m["models"].update({"\x1b[31mred": m["models"]["int8"]}), "models"),
    ],
)
def test_manifest_fields_are_bounded_before_use(manifest_json, edit, field):
    edit(manifest_json)
    with pytest.raises(UsageError) as info:
        Manifest.from_json(manifest_json)
    message = str(info.value)
    assert field in message and len(message) < 400 and "\x1b" not in message


@pytest.mark.parametrize("value", [5, True, 1.5, {"a": 1}])
def test_lenient_fields_of_the_wrong_type_are_ignored(manifest_json, value):
    manifest_json["requested"] = value
    manifest_json["failed"] = value
    manifest_json["created_by"] = {"tool": "\x1b[2J", "x": value}
    manifest = Manifest.from_json(manifest_json)
    assert manifest.requested == () and "\x1b" not in manifest.created_by["tool"]


def _npz(members: dict[str, bytes], method=zipfile.ZIP_DEFLATED) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    buffer.seek(0)
    return buffer


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_npz_members_that_are_not_arrays_and_corrupt_streams_are_one_line():
    with pytest.raises(UsageError, match="not an .npy array"):
        read_npz(_npz({"x.npy": _npy(np.zeros(3)), "x.txt": b"hi"}), ("x",), where="e.npz")
    data = bytearray(_npz({"x.npy": _npy(np.arange(1000.0))}).getvalue())
    data[60:90] = b"\xff" * 30  # inside the deflate stream
    with pytest.raises(UsageError, match="not a readable .npz"):
        read_npz(io.BytesIO(bytes(data)), ("x",), where="e.npz")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)}
    )
    with pytest.raises(UsageError, match="header says"):
        read_npz(_npz({"x.npy": header.getvalue() + b"\0" * 8}), ("x",), where="e.npz")


def test_path_and_text_arguments_are_usage_errors(text_bundle, tmp_path):
    assert_bad(edge(text_bundle, "--json", tmp_path / ("n" * 300)), "--json", "255")
    assert_bad(edge(text_bundle / ("b" * 300)), "BUNDLE_DIR", "255")
    assert_bad(edge(text_bundle, "--text", "caf\udce9", "--view", tmp_path / "v.html"), "UTF-8")


def test_attention_that_does_not_match_the_model_is_a_usage_error(text_copy):
    from mutations import fix_checksum

    with np.load(text_copy / "attention.npz") as npz:
        arrays = {k: npz[k][:, :1] for k in npz.files}  # one head fewer
    np.savez_compressed(text_copy / "attention.npz", **arrays)
    fix_checksum(text_copy, "attention.npz")
    assert_bad(edge(text_copy, "--quant", "int8"), "attention.npz", "attention_0")


# --- 4. a bundle's regex -----------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["(a+)+b", "(a|a)*b", "[a-z]+[a-z]+x", "a{99999999999}"])
def test_a_backtracking_or_unknown_token_pattern_is_refused(pattern):
    with pytest.raises(UsageError, match="token_pattern"):
        Vocab(("<pad>", "<unk>", "a"), 4, token_pattern=pattern)


def test_the_patterns_training_writes_still_run():
    for pattern in ("[a-z0-9']+", "[a-z']+", "[A-Za-z]+", "#?([a-z]+)"):
        Vocab(("<pad>", "<unk>", "a"), 4, token_pattern=pattern).tokenize("a b")


# --- 5. memory -------------------------------------------------------------------------------


def test_a_zip_bomb_is_refused_before_it_inflates():
    bomb = _npz({"x.npy": _npy(np.zeros(16 * 1024 * 1024, np.uint8))})
    assert len(bomb.getvalue()) < 100_000
    with pytest.raises(UsageError, match="inflates to"):
        read_npz(bomb, ("x",), where="eval.npz", max_member_bytes=1 << 20)


def test_a_huge_file_is_refused_by_its_size_before_it_is_read(tmp_path):
    with open(tmp_path / "labels.json", "wb") as handle:
        handle.truncate(3 * 1024**3)  # sparse: costs nothing
    with pytest.raises(UsageError, match="at most"):
        read_inside(tmp_path, "labels.json", "0" * 64, max_bytes=1 << 20)


def test_a_huge_layer_count_gives_a_short_line(manifest_json):
    manifest_json["attention"]["layers"] = 10**9
    with pytest.raises(UsageError) as info:
        Manifest.from_json(manifest_json)
    assert len(str(info.value)) < 300


def _is_device(path: str) -> bool:
    import stat

    return stat.S_ISCHR(os.lstat(path).st_mode)


# --- 6. writes ---------------------------------------------------------------------------------


def test_outputs_refuse_special_files_and_the_bundle(text_bundle, tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "target.json")
    (tmp_path / "target.json").write_text("keep")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, problem in (
        (link, "symbolic link"),
        (fifo, "FIFO"),
        *([(pathlib.Path("/dev/null"), "character device")] if _is_device("/dev/null") else []),
        (text_bundle / "manifest.json", "inside the bundle"),
    ):
        with pytest.raises(UsageError, match=problem):
            check_output(path, "--json", protected=text_bundle)
    assert (tmp_path / "target.json").read_text() == "keep" and link.is_symlink()
    before = (text_bundle / "manifest.json").read_bytes()
    assert_bad(edge(text_bundle, "--json", text_bundle / "manifest.json"), "inside the bundle")
    assert_bad(edge(text_bundle, "--json", link), "symbolic link")
    assert (text_bundle / "manifest.json").read_bytes() == before


# --- 7. smaller ---------------------------------------------------------------------------------


def test_untrusted_strings_are_escaped_and_errors_stay_one_line(text_copy):
    assert safe("a\x1b[31mb\nc\ud800") == "a\\x1b[31mb\\x0ac\\ud800"
    error = UsageError("bad\nthing \x1b[2J", "dir/na\nme")
    assert "\n" not in str(error) and "\x1b" not in str(error)
    edit_manifest(text_copy, lambda m: m["labels"].update(file="la\nbels.json"))
    line = assert_bad(edge(text_copy), "labels.file")
    assert "\x1b" not in line
    with pytest.raises(UsageError, match="printable"):
        parse_labels(json.dumps(["ok", "\x1b[31mred"]).encode(), 2, "labels.json")


def test_the_command_line_imports_nothing_heavy_before_run_main():
    """Ctrl-C while numpy imports would be a traceback: cli imports it inside run_main."""
    code = "import sys, edge_demo.app.cli; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
    assert RUNTIME_CHOICES == tuple(RUNTIMES)


def test_a_hostile_scale_prints_no_numpy_warning(text_copy):
    def edit(manifest):
        manifest["models"]["int8"]["input"]["scale"] = 1e300

    edit_manifest(text_copy, edit)
    status, _, stderr = edge(text_copy, "--quant", "int8")
    assert status == 2 and len(stderr.strip().splitlines()) == 1, stderr
