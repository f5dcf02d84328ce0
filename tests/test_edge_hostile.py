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
import resource
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from edge_bundle import REPO, edge_python, edit_manifest, one_error_line, run_main

from bundle_contract.arrays import read_npz
from bundle_contract.errors import UsageError, safe, shown
from bundle_contract.fields import parse_json
from bundle_contract.files import check_output, read_inside
from bundle_contract.lists import parse_labels
from bundle_contract.manifest import Manifest
from bundle_contract.vocab import Vocab
from edge_demo.app.cli import RUNTIME_CHOICES, main
from edge_demo.runtimes.runtime import RUNTIMES

sys.path.insert(0, str(pathlib.Path(__file__).parent / "fuzz"))
from mutations import apply, fix_checksum  # noqa: E402

pytest_plugins = ["edge_fixtures"]
PROG = "keras-mha-edge"


def edge(*argv) -> tuple[int, str, str]:
    return run_main(main, [*argv, "--runtime", "litert"] if "--runtime" not in argv else list(argv))


def edge_process(*argv, python=None, preexec_fn=None) -> subprocess.CompletedProcess:
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
        preexec_fn=preexec_fn,
    )


def assert_bad(result, *fragments: str) -> str:
    status, stdout, stderr = result
    assert status == 2, (status, stdout, stderr)
    return one_error_line(stderr, PROG, *fragments)


# --- 1. native crashes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "value", "argv", "problem"),
    [
        pytest.param(
            "signature1.subgraph_index", 99, ["--quant", "int8"], "names subgraph 99",
            id="subgraph-index",
        ),
        pytest.param(
            "subgraph1.outputs[0]", -1, ["--sample", "0", "--view", "{tmp}/v.html"],
            "output tensor -1", id="output-1",
        ),
    ],
)  # fmt: skip
def test_a_corrupt_signature_is_refused_before_a_runtime_sees_it(
    text_copy, tmp_path, what, value, argv, problem
):
    """index_problem (bundle_contract/flatbuffer.py) refuses both indices, whatever the runtime."""
    apply(text_copy, {"kind": "tflite", "file": "model_int8.tflite", "what": what, "site": 0,
                      "value": value})  # fmt: skip
    done = edge_process(text_copy, *[a.format(tmp=tmp_path) for a in argv], "--runtime", "litert")
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    one_error_line(done.stderr, PROG, "model_int8.tflite", problem)


def test_the_debugger_probes_its_models_first(text_copy):
    apply(text_copy, {"kind": "tflite", "file": "model_float32.tflite", "site": 0,
                      "what": "subgraph0.op3.opcode_index", "value": 0})  # fmt: skip
    done = edge_process(text_copy, "--debug", "int8", "--sample", "0")
    assert done.returncode == 2, (done.stdout, done.stderr)
    # the probe's words (runtimes/probe.py), not debug/cli.py's "the debugger cannot run it"
    line = one_error_line(done.stderr, PROG, "model_float32.tflite", "ai-edge-litert")
    assert "the debugger cannot run it" not in line and "bundle " not in done.stdout, line


# --- 2. a corrupted model is not a missing kernel -------------------------------------


def test_a_load_failure_on_a_runtime_that_ran_the_mode_is_a_failure(text_bundle, monkeypatch):
    from bundle_contract.bundle import open_bundle
    from edge_demo.app import runs
    from edge_demo.runtimes.probe import ProbeResult
    from edge_demo.runtimes.runtime import select_runtime

    bundle = open_bundle(text_bundle, "int8,float32")
    runtime = select_runtime("litert")
    assert bundle.manifest.models["int8"].runtimes.get(runtime.name) is True
    unsupported = ProbeResult(False, "ai-edge-litert cannot run it (type not supported)")
    monkeypatch.setattr(
        runs, "probe_models", lambda runtime, items: iter([unsupported] * len(items))
    )
    plan = runs.plan_modes(bundle, runtime)
    assert plan["int8"].status == "failed" and plan["int8"].passed is False
    assert "corrupted" in plan["int8"].failures[0]


def _count_children(monkeypatch) -> list:
    from edge_demo.runtimes import probe

    calls = []
    real = probe.subprocess.run

    def counted(argv, **kwargs):
        calls.append(json.loads(argv[5]))  # the layout: one [size, sample, dtype] a model
        return real(argv, **kwargs)

    monkeypatch.setattr(probe.subprocess, "run", counted)
    return calls


def test_one_child_probes_every_mode_of_a_sound_bundle(text_bundle, monkeypatch):
    """Starting Python, numpy and the runtime costs seconds on an emulated or
    small CPU: a sound bundle's modes share one child, and what it finds for
    each is what a child of its own finds."""
    from bundle_contract.bundle import open_bundle
    from edge_demo.app import runs
    from edge_demo.runtimes.probe import probe_model
    from edge_demo.runtimes.runtime import select_runtime

    bundle = open_bundle(text_bundle, "float32,float16,int8")
    runtime = select_runtime("litert")
    calls = _count_children(monkeypatch)
    assert runs.plan_modes(bundle, runtime) == dict.fromkeys(["float32", "float16", "int8"])
    assert [len(layout) for layout in calls] == [3]
    items = [
        (bundle.model_bytes[m], m, bundle.manifest.models[m].input.quantize(bundle.eval.x[:1]))
        for m in bundle.modes
    ]
    together = list(runs.probe_models(runtime, items))
    alone = [probe_model(runtime, *item) for item in items]
    assert together == alone and all(result.ok for result in alone)
    assert {result.outputs[0].dtype for result in alone} == {"float32", "int8"}


def test_a_model_that_fails_in_the_shared_child_is_probed_alone(text_bundle, monkeypatch):
    """A model the runtime rejects (not for a missing kernel) may leave the
    shared child unfit for the ones after it: every model is then probed in
    a child of its own, and the error is the one that child gives, raised in
    its turn, after the models before it."""
    from bundle_contract.bundle import open_bundle
    from edge_demo.runtimes.probe import probe_model, probe_models
    from edge_demo.runtimes.runtime import select_runtime

    bundle = open_bundle(text_bundle, "float32")
    runtime = select_runtime("litert")
    good = bundle.model_bytes["float32"]
    sample = bundle.manifest.models["float32"].input.quantize(bundle.eval.x[:1])
    with pytest.raises(UsageError) as alone:
        probe_model(runtime, b"TFL3" * 64, "bad.tflite")
    calls = _count_children(monkeypatch)
    results = probe_models(
        runtime,
        [(good, "a.tflite", sample), (b"TFL3" * 64, "bad.tflite", None), (good, "c", sample)],
    )
    assert next(results).ok
    assert [len(layout) for layout in calls] == [3, 1]  # all three together, then the first alone
    with pytest.raises(UsageError) as together:
        next(results)
    assert str(together.value) == str(alone.value) and "bad.tflite" in str(alone.value)
    assert [len(layout) for layout in calls] == [3, 1, 1]


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


COREF = {"layer": 0, "head": 0, "accuracy": 0.5, "ci95": [0.4, 0.6], "sentences": 50}


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
        (lambda m: m.update(coref_head={**COREF, "layer": 10**9}), "coref_head.layer"),
        (lambda m: m.update(coref_head={**COREF, "head": 10**12}), "coref_head.head"),
        (lambda m: m.update(coref_head={**COREF, "ci95": ["\x1b[2J", 1.0]}), "coref_head.ci95"),
        (lambda m: m.update(coref_head={**COREF, "sentences": 10**15}), "coref_head.sentences"),
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
    # shown to a person, a name holding the four characters \x1b is not the escape code's
    assert shown("a\\x1bb") == "a\\\\x1bb" != shown("a\x1bb") == "a\\x1bb"
    assert shown("C:\\dir") == "C:\\\\dir" and shown("plain") == "plain"
    assert str(UsageError("bad", "dir/a\\x1bb")) == "dir/a\\\\x1bb: bad"
    # safe() cleans fields and checks printability: idempotent, backslashes kept
    for text in ("a\\x1bb", "a\x1bb\n", "C:\\dir"):
        assert safe(safe(text)) == safe(text)
    assert parse_labels(json.dumps(["cat\\dog", "b"]).encode(), 2, "labels.json")[0] == "cat\\dog"
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


def test_a_hostile_scale_prints_no_numpy_warning(bundle_copy):
    """A scale the manifest accepts (1e-30, its least) on a value eval.npz
    accepts (3e38, finite) overflows float32 when the device quantizes the
    input: numpy's arithmetic runs on it (before the runtime is even asked),
    and `-W error` would turn any RuntimeWarning it printed into a crash
    (without the app's np.errstate/np.seterr: "internal error:
    RuntimeWarning: overflow encountered in divide", measured). The answer is
    the one line about the scale the model does not have."""
    with np.load(bundle_copy / "eval.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["x"] = arrays["x"].copy()
    arrays["x"][0] = 3e38
    np.savez(bundle_copy / "eval.npz", **arrays)
    fix_checksum(bundle_copy, "eval.npz")

    def edit(manifest):
        manifest["models"]["int8"]["input"]["scale"] = 1e-30

    edit_manifest(bundle_copy, edit)
    done = subprocess.run(
        [str(edge_python("litert")), "-W", "error", "-m", "edge_demo", str(bundle_copy)]
        + ["--quant", "int8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "input tensor differs from manifest.json: scale" in lines[0] and "1e-30" in lines[0]


# --- review of the hardening (issue 21, second round) ----------------------------------------


def _edge_in_512_mb(*argv) -> subprocess.CompletedProcess:
    """The app in a child whose address space is 512 MB (a device's whole budget)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return edge_process(*argv, preexec_fn=limit)


def _zeros_member(archive: zipfile.ZipFile, name: str, header_shape, dtype: str, mib: int) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": header_shape}
    )
    with archive.open(name, "w", force_zip64=True) as member:
        member.write(header.getvalue())
        block = bytes(1 << 20)
        for _ in range(mib):
            member.write(block)


def _huge_attention(bundle: pathlib.Path) -> str:
    """Signatures declaring 64M-value attention outputs (the old cap: 10 GiB a layer), and
    a 1 MB attention.npz whose layer inflates to 600 MiB."""

    def edit(manifest):
        for entry in manifest["models"].values():
            if entry.get("attention"):
                outputs = entry["signatures"][entry["attention"]["signature"]]["outputs"]
                outputs["attention_0"]["shape"] = [1, 64, 1024, 1024]

    edit_manifest(bundle, edit)
    with zipfile.ZipFile(bundle / "attention.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        _zeros_member(archive, "attention_0.npy", (40, 64, 1024, 1024), "float32", 600)
    return "attention.npz"


def _huge_eval(bundle: pathlib.Path) -> str:
    """eval.x declared int32 (40, 1,600,000) (the old cap: 8 bytes a value, 512 MB), and a
    1 MB eval.npz whose x inflates to 480 MiB."""
    width = 1_600_000

    def edit(manifest):
        manifest["eval"]["x_shape"] = [40, width]
        for entry in manifest["models"].values():
            entry["input"]["shape"] = [1, width]

    edit_manifest(bundle, edit)
    with zipfile.ZipFile(bundle / "eval.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        _zeros_member(archive, "x.npy", (40, width), "int32", 480)
        archive.writestr("y.npy", _npy(np.zeros(40, np.int64)))
        archive.writestr("probs.npy", _npy(np.full((40, 2), 0.5, np.float32)))
    return "eval.npz"


@pytest.mark.parametrize("make", [_huge_attention, _huge_eval], ids=["attention", "eval"])
def test_a_manifest_declaring_huge_shapes_does_not_raise_the_inflate_budget(text_copy, make):

    name = make(text_copy)
    assert (text_copy / name).stat().st_size < 4_000_000
    fix_checksum(text_copy, name)
    done = _edge_in_512_mb(text_copy, "--quant", "int8", "--runtime", "litert")
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-2000:])
    one_error_line(done.stderr, PROG, name, "inflates")


def test_read_inside_never_reads_more_than_the_file_cap(tmp_path, monkeypatch):
    from bundle_contract import files

    monkeypatch.setattr(files, "MAX_FILE_BYTES", 1000)
    (tmp_path / "eval.npz").write_bytes(bytes(2000))
    with pytest.raises(UsageError, match="at most 1000 bytes"):
        read_inside(tmp_path, "eval.npz", max_bytes=10**12)


def _shared_reference_model(n: int) -> bytes:
    """A flatbuffer whose n subgraph refs share one subgraph, whose n operator refs share one
    operator with n inputs: n**3 index checks from ~24 n bytes."""
    out = bytearray()

    def u32(value=0):
        out.extend(struct.pack("<I", value))
        return len(out) - 4

    def point(at, target):
        struct.pack_into("<I", out, at, target - at)

    root_ref = u32()
    out.extend(b"TFL3")
    vtable_root = len(out)
    out.extend(struct.pack("<6H", 16, 16, 0, 4, 8, 0) + struct.pack("<2H", 12, 0))
    root = u32()
    struct.pack_into("<i", out, root, root - vtable_root)
    opcodes_ref, subgraphs_ref, buffers_ref = u32(), u32(), u32()
    point(root_ref, root)
    for ref in (opcodes_ref, buffers_ref):
        point(ref, len(out))
        u32(1), u32(0)
    point(subgraphs_ref, len(out))
    u32(n)
    subgraph_refs = [u32() for _ in range(n)]
    vtable_sub = len(out)
    out.extend(struct.pack("<6H", 12, 12, 4, 0, 0, 8))
    sub = u32()
    struct.pack_into("<i", out, sub, sub - vtable_sub)
    tensors_ref, operators_ref = u32(), u32()
    for ref in subgraph_refs:
        point(ref, sub)
    point(tensors_ref, len(out))
    u32(1)
    tensor_ref = u32()
    vtable_tensor = len(out)
    out.extend(struct.pack("<2H", 4, 4))
    tensor = u32()
    struct.pack_into("<i", out, tensor, tensor - vtable_tensor)
    point(tensor_ref, tensor)
    point(operators_ref, len(out))
    u32(n)
    operator_refs = [u32() for _ in range(n)]
    vtable_op = len(out)
    out.extend(struct.pack("<4H", 8, 8, 0, 4))
    op = u32()
    struct.pack_into("<i", out, op, op - vtable_op)
    inputs_ref = u32()
    for ref in operator_refs:
        point(ref, op)
    point(inputs_ref, len(out))
    u32(n)
    for _ in range(n):
        u32(0)
    return bytes(out)


def test_the_flatbuffer_walk_has_one_budget_for_shared_tables(tmp_path):
    from bundle_contract.flatbuffer import index_problem

    assert index_problem(_shared_reference_model(3)) is None  # sound, and small: walked whole
    model = tmp_path / "model.tflite"
    model.write_bytes(_shared_reference_model(4000))  # 96 KB, 6.4e10 checks without a budget
    code = (
        "import sys; from bundle_contract.flatbuffer import index_problem; "
        "print(index_problem(open(sys.argv[1], 'rb').read()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(model)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "corrupt TFLite flatbuffer" in done.stdout and "reads" in done.stdout, done.stdout


def test_a_model_is_checked_against_its_sha256_before_it_is_parsed(text_copy):
    path = text_copy / "model_int8.tflite"
    data = bytearray(path.read_bytes())
    data[4:8] = b"XXXX"  # a corrupt header, and the manifest's sha256 no longer matches
    path.write_bytes(bytes(data))
    line = assert_bad(edge(text_copy, "--quant", "int8"), "model_int8.tflite", "sha256")
    assert "TFLite" not in line


def test_attention_outputs_must_be_named_by_layer(text_copy, tmp_path):

    path = text_copy / "model_int8.tflite"
    data = path.read_bytes()
    assert data.count(b"attention_0") == 1
    path.write_bytes(data.replace(b"attention_0", b"attention_x"))
    fix_checksum(text_copy, "model_int8.tflite")

    def edit(manifest):
        manifest["attention"] = None
        outputs = manifest["models"]["int8"]["signatures"]["view"]["outputs"]
        outputs["attention_x"] = dict(outputs.pop("attention_0"), name="attention_x")

    edit_manifest(text_copy, edit)
    result = edge(text_copy, "--quant", "int8", "--sample", "0", "--view", tmp_path / "v.html")
    assert_bad(result, "models.int8.signatures.view.outputs", "attention_0", "attention_x")


def test_a_coref_head_the_models_lack_is_refused_and_a_real_one_is_named(text_copy, tmp_path):
    """The manifest's coref_head must name a head of every mode's view signature: a forged
    one is one line, exit 2, before any page is written; a true one opens the page on it."""
    manifest = json.loads((text_copy / "manifest.json").read_text())
    outputs = manifest["models"]["int8"]["signatures"]["view"]["outputs"]
    layers, heads = len(outputs), outputs["attention_0"]["shape"][1]
    page = tmp_path / "view.html"
    for field, forged in (("layer", layers), ("head", heads)):
        forgery = {**COREF, field: forged}
        edit_manifest(text_copy, lambda m, forgery=forgery: m.update(coref_head=forgery))
        line = assert_bad(edge(text_copy, "--sample", "0", "--view", page), f"coref_head.{field}")
        assert f"is {forged};" in line and "manifest.json" in line
        assert not page.exists()
    named = {**COREF, "layer": layers - 1, "head": heads - 1}
    edit_manifest(text_copy, lambda m: m.update(coref_head=named))
    status, _, stderr = edge(text_copy, "--quant", "int8", "--sample", "0", "--view", page)
    assert status == 0, stderr
    text = page.read_text(encoding="utf-8")
    start = text.index('id="attention-data">') + len('id="attention-data">')
    data = json.loads(text[start : text.index("</script>", start)])
    assert data["named_head"] == {
        "layer": layers - 1,
        "head": heads - 1,
        "caption": f"layer {layers - 1} head {heads - 1}: the best coreference head, 0.500 "
        "(0.400-0.600) of 50 generated pronoun sentences, keras-mha-heads coref",
    }
    assert data["initial_layer"] == layers - 1


def test_export_and_run_directories_read_labels_with_the_devices_parser():
    from keras_mha.rundir import check_labels

    assert check_labels(b'["a", "b"]', 2, "labels.json") == ["a", "b"]
    for hostile in (["ok", "\x1b[31mred"], ["x" * 300, "b"]):
        with pytest.raises(UsageError, match="printable"):
            check_labels(hostile, 2, "labels.json")
    with pytest.raises(UsageError, match="appears twice"):
        check_labels(b'[{"a": 1, "a": 2}, "b"]', 2, "labels.json")


def test_a_symbolic_link_or_fifo_swapped_in_after_the_check_is_not_followed(tmp_path, monkeypatch):
    import signal

    from bundle_contract import files

    monkeypatch.setattr(files, "inside", lambda root, name: root / name)  # the race, won
    (tmp_path / "secret").write_bytes(b"outside")
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "labels.json").symlink_to(tmp_path / "secret")
    with pytest.raises(UsageError, match="symbolic link"):
        read_inside(tmp_path / "bundle", "labels.json")
    os.mkfifo(tmp_path / "bundle" / "eval.npz")

    def hung(*_):
        raise TimeoutError("open() blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(UsageError, match="not a regular file"):
            read_inside(tmp_path / "bundle", "eval.npz")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_an_archive_of_too_many_members_is_refused_before_zipfile_reads_its_directory(
    monkeypatch,
):
    from bundle_contract import arrays

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for i in range(5000):
            archive.writestr(f"a{i}.npy", b"")

    def no_zipfile(*_, **__):
        raise AssertionError("zipfile.ZipFile parsed the central directory first")

    monkeypatch.setattr(arrays.zipfile, "ZipFile", no_zipfile)
    with pytest.raises(UsageError, match="5000 members"):
        read_npz(buffer, ("x",), where="eval.npz")


@pytest.mark.parametrize(
    ("detail", "cannot_run"),
    [
        # TFLite Micro on an int16 REDUCE_MIN: a kernel it lacks, a verdict
        ("TFLM invoke failed: Only float32 and int8 types are supported. Node REDUCE_MIN", True),
        ("Didn't find op for builtin opcode 'GELU' version '1'", True),
        ("Type INT16 (7) not supported.", True),
        # not a missing kernel: a broken model stays a load error, named as such
        ("the commonly used types are supported", False),
        ("Invalid tensor index 99 in inputs", False),
    ],
)
def test_the_probe_tells_a_missing_kernel_from_a_broken_model(detail, cannot_run):
    from edge_demo.runtimes.probe import _UNSUPPORTED

    assert bool(_UNSUPPORTED.search(detail)) is cannot_run
