"""Bad bundles and bad flags, in process: `main(argv)` returns 2 with one line naming the file.

The exit-code contract as a device sees it (subprocesses, TensorFlow-free
venvs) is tests/test_edge_cli.py.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
from edge_bundle import edit_manifest, match_file, match_model_file, one_error_line, run_main

from bundle_contract.files import sha256_file
from edge_demo.app.cli import PROG, main

pytest_plugins = ["edge_fixtures"]  # bundle fixtures, built once per session


def edge(*argv) -> tuple[int, str, str]:
    return run_main(main, [*argv, "--runtime", "litert"] if "--runtime" not in argv else list(argv))


def assert_bad(result: tuple[int, str, str], *fragments: str) -> str:
    status, stdout, stderr = result
    assert status == 2, (status, stdout, stderr)
    return one_error_line(stderr, PROG, *fragments)


def _write(name: str, data: bytes | str):
    def edit(bundle: pathlib.Path) -> None:
        path = bundle / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)

    return edit


def _transform(name: str, fn):
    def edit(bundle: pathlib.Path) -> None:
        path = bundle / name
        path.write_bytes(fn(path.read_bytes()))

    return edit


def _random_bytes(data: bytes) -> bytes:
    return np.random.default_rng(0).integers(0, 256, len(data), dtype=np.uint8).tobytes()


def _flip_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _manifest_edit(path: str):
    def edit(bundle: pathlib.Path) -> None:
        def drop(m):
            *parents, last = path.split(".")
            for key in parents:
                m = m[key]
            del m[last]

        edit_manifest(bundle, drop)

    return edit


def _npz(**change):
    """Rewrite eval.npz with `change`d arrays (None drops one) and fix its sha256."""

    def edit(bundle: pathlib.Path) -> None:
        with np.load(bundle / "eval.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
        for key, value in change.items():
            if value is None:
                del arrays[key]
            else:
                arrays[key] = value(arrays[key])
        np.savez(bundle / "eval.npz", **arrays)
        match_file(bundle, "eval")

    return edit


def _then(*edits):
    def edit(bundle: pathlib.Path) -> None:
        for e in edits:
            e(bundle)

    return edit


def _link_outside(name: str, key: str | None = None):
    """Replace bundle file `name` by a symlink to an identical file outside the bundle."""

    def edit(bundle: pathlib.Path) -> None:
        outside = bundle.parent / f"outside-{name}"
        (bundle / name).rename(outside)
        (bundle / name).symlink_to(outside)
        if key is None:
            match_model_file(bundle, name[len("model_") : -len(".tflite")])
        assert sha256_file(bundle / name) == sha256_file(outside)

    return edit


BAD_DIGITS_BUNDLES = {
    "zero-byte-model": (
        _write("model_int8.tflite", b""),
        "model_int8.tflite",
        "empty file (0 bytes)",
    ),
    "truncated-model": (
        _transform("model_int8.tflite", lambda d: d[: len(d) // 2]),
        "model_int8.tflite",
        "truncated or replaced",
    ),
    "random-bytes-model": (  # the manifest forged to match: the header check speaks
        _then(
            _transform("model_int8.tflite", _random_bytes),
            lambda b: match_model_file(b, "int8"),
        ),
        "model_int8.tflite",
        "not a TFLite model: file identifier",
    ),
    "wrong-identifier-model": (
        _then(
            _transform("model_int8.tflite", lambda d: d[:4] + b"TFL2" + d[8:]),
            lambda b: match_model_file(b, "int8"),
        ),
        "model_int8.tflite",
        "file identifier b'TFL2'",
    ),
    "checksum-mismatch-model": (
        _transform("model_int8.tflite", _flip_middle),
        "model_int8.tflite",
        "does not match manifest.json",
    ),
    "missing-model": (
        lambda b: (b / "model_float16.tflite").unlink(),
        "model_float16.tflite",
        "not found",
    ),
    "random-bytes-model-with-TFL3-and-matching-manifest": (
        _then(
            _transform(
                "model_int8.tflite", lambda d: (r := _random_bytes(d))[:4] + b"TFL3" + r[8:]
            ),
            lambda b: match_model_file(b, "int8"),
        ),
        "model_int8.tflite",
        "corrupt TFLite flatbuffer",
    ),
    "model-symlink-outside-matching-sha256": (
        _link_outside("model_int8.tflite"),
        "model_int8.tflite",
        "is a symbolic link",
    ),
    "model-directory": (
        _then(
            lambda b: (b / "model_int8.tflite").unlink(),
            lambda b: (b / "model_int8.tflite").mkdir(),
        ),
        "model_int8.tflite",
        "not a regular file",
    ),
    "eval-symlink-outside": (_link_outside("eval.npz", "eval"), "eval.npz", "is a symbolic link"),
    "labels-symlink-outside": (
        _link_outside("labels.json", "labels"),
        "labels.json",
        "is a symbolic link",
    ),
    "manifest-symlink": (
        _link_outside("manifest.json", "manifest"),
        "manifest.json",
        "is a symbolic link",
    ),
    "manifest-missing": (lambda b: (b / "manifest.json").unlink(), "manifest.json", "not found"),
    "manifest-not-json": (_write("manifest.json", "{not json"), "manifest.json", "not valid JSON"),
    "manifest-binary": (
        _write("manifest.json", b"\xff\xfe\x00garbage"),
        "manifest.json",
        "not valid JSON",
    ),
    "manifest-missing-eval-sha256": (
        _manifest_edit("eval.sha256"),
        "manifest.json",
        "missing field 'eval.sha256'",
    ),
    "manifest-missing-models": (
        _manifest_edit("models"),
        "manifest.json",
        "missing field 'models'",
    ),
    "manifest-missing-model-file": (
        _manifest_edit("models.int8.file"),
        "manifest.json",
        "missing field 'models.int8.file'",
    ),
    "eval-missing": (lambda b: (b / "eval.npz").unlink(), "eval.npz", "not found"),
    "eval-checksum-mismatch": (
        _transform("eval.npz", _flip_middle),
        "eval.npz",
        "does not match manifest.json",
    ),
    "eval-not-npz": (
        _then(_write("eval.npz", b"not a zip file"), lambda b: match_file(b, "eval")),
        "eval.npz",
        "not a readable .npz file",
    ),
    "eval-x-wrong-shape": (_npz(x=lambda x: x[:, :, :7]), "eval.npz", "x has shape [360, 8, 7]"),
    "eval-x-wrong-dtype": (
        _npz(x=lambda x: x.astype(np.float16)),
        "eval.npz",
        "x has dtype float16",
    ),
    "eval-x-wider-dtype": (  # sized by the manifest's x_dtype before it is inflated
        _npz(x=lambda x: x.astype(np.float64)),
        "eval.npz",
        "array x inflates to",
    ),
    "eval-y-wrong-dtype": (
        _npz(y=lambda y: y.astype(np.float32)),
        "eval.npz",
        "y must be integer labels",
    ),
    "eval-probs-wrong-shape": (
        _npz(probs=lambda p: p[:, :9]),
        "eval.npz",
        "probs must be float of shape [360, 10]",
    ),
    "eval-probs-times-3": (_npz(probs=lambda p: p * 3), "eval.npz", "probs rows must sum to 1"),
    "eval-probs-missing": (_npz(probs=None), "eval.npz", "missing array(s) probs"),
    "labels-wrong-count": (
        _then(
            _write("labels.json", json.dumps(list("012345678"))), lambda b: match_file(b, "labels")
        ),
        "labels.json",
        "has 9 names",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_DIGITS_BUNDLES))
def test_bad_digits_bundle(case, bundle_copy):
    edit, filename, problem = BAD_DIGITS_BUNDLES[case]
    edit(bundle_copy)
    line = assert_bad(edge(bundle_copy), filename, problem)
    assert str(bundle_copy) in line  # names the file with its path


@pytest.mark.slow
def test_a_symlinked_bundle_directory_is_fine_its_files_are_not(bundle_copy, tmp_path):
    """Linking the directory (e.g. `latest -> bundle`) is how users name bundles; files stay regular."""
    link = tmp_path / "latest"
    link.symlink_to(bundle_copy)
    status, stdout, stderr = edge(link, "--quant", "float32")
    assert status == 0, stderr


def _vocab_edit(edit):
    def apply(bundle: pathlib.Path) -> None:
        path = bundle / "vocab.json"
        vocab = json.loads(path.read_text())
        edit(vocab)
        path.write_text(json.dumps(vocab))
        match_file(bundle, "vocab")

    return apply


BAD_TEXT_BUNDLES = {
    "vocab-missing": (lambda b: (b / "vocab.json").unlink(), "vocab.json", "not found"),
    "vocab-not-json": (
        _then(_write("vocab.json", "[1,"), lambda b: match_file(b, "vocab")),
        "vocab.json",
        "not valid JSON",
    ),
    "vocab-missing-token-pattern": (
        _vocab_edit(lambda v: v.pop("token_pattern")),
        "vocab.json",
        "missing field(s): token_pattern",
    ),
    "vocab-missing-tokens-field": (
        _vocab_edit(lambda v: v.pop("tokens")),
        "vocab.json",
        "missing field(s): tokens",
    ),
    "vocab-missing-tokens": (
        _vocab_edit(lambda v: v.update(tokens=v["tokens"][:5])),
        "vocab.json",
        "but 'tokens' has only 5 tokens",
    ),
    "vocab-wrong-max-length": (
        _vocab_edit(lambda v: v.update(max_length=9)),
        "vocab.json",
        "max_length 9 does not match",
    ),
    "vocab-checksum-mismatch": (
        _vocab_edit(lambda v: v.update(max_length=6)),
        "vocab.json",
        "",
    ),
    "vocab-symlink": (_link_outside("vocab.json", "vocab"), "vocab.json", "is a symbolic link"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_TEXT_BUNDLES))
def test_bad_text_bundle(case, text_copy):
    edit, filename, problem = BAD_TEXT_BUNDLES[case]
    if case == "vocab-checksum-mismatch":  # the file changes, the manifest does not
        (text_copy / "vocab.json").write_text((text_copy / "vocab.json").read_text() + " ")
        problem = "does not match manifest.json"
    else:
        edit(text_copy)
    assert_bad(edge(text_copy, "--text", "the cat"), filename, problem)


@pytest.mark.slow
def test_flags_that_depend_on_the_bundle(digits_bundle, text_bundle, tmp_path):
    assert_bad(edge(digits_bundle, "--text", "seven"), "--text", "vocab")
    assert_bad(edge(text_bundle, "--text", "!!! 42"), "--text", "no words")
    assert_bad(edge(digits_bundle, "--sample", 360), "--sample", "out of range")
    assert_bad(
        edge(digits_bundle, "--quant", "float32,int4"), "--quant", "'int4' is not a known mode"
    )
    assert_bad(edge(digits_bundle, "--json", tmp_path), "--json", "is a directory")
    (tmp_path / "file").write_text("x")
    assert_bad(
        edge(digits_bundle, "--json", tmp_path / "file" / "r.json"), "--json", "is not a directory"
    )
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]


@pytest.mark.slow
def test_text_of_unknown_words_says_the_prediction_means_nothing(text_bundle):
    status, stdout, _ = edge(text_bundle, "--text", "zorp blick quux")
    assert status == 0, stdout
    assert "unknown to the vocabulary: blick, quux, zorp" in stdout
    assert "every word is unknown to the vocabulary" in stdout
    known = json.loads((text_bundle / "vocab.json").read_text())["tokens"][2]
    status, stdout, _ = edge(text_bundle, "--text", f"{known} zorp")
    assert status == 0 and "unknown to the vocabulary: zorp" in stdout, stdout
    assert "every word is unknown" not in stdout


@pytest.mark.slow
def test_eval_npz_may_hold_arrays_the_device_does_not_read(bundle_copy):
    """A pronouns run's eval.npz carries its sentences (text, cue, nouns: 0.6 MB for
    1,500 sentences); export copies it, and the device reads only x, y, probs."""
    path = bundle_copy / "eval.npz"
    with np.load(path) as held:
        arrays = {k: held[k] for k in held.files}
    text = np.array([f"sentence number {i} " * 4 for i in range(len(arrays["x"]))])
    np.savez(path, **arrays, text=text, cue=np.array(["number"] * len(text)))
    # past a cap made of the three arrays' sizes (+ 64 KiB), the one that refused it
    assert path.stat().st_size > sum(a.nbytes for a in arrays.values()) + 65536 + 4096
    match_file(bundle_copy, "eval")
    status, stdout, stderr = edge(bundle_copy, "--quant", "float32")
    assert status == 0, stderr
    assert "float32  PASS" in stdout


def test_usage_errors_are_one_line(tmp_path, capsys):
    for argv, fragment in (
        ([tmp_path, "--threads", "0"], "--threads"),
        ([tmp_path, "--sample", "1", "--text", "hi"], "not allowed with"),
        ([tmp_path, "--sample", "1", "--json", "x.json"], "--json applies to the parity run"),
        ([tmp_path / "nothing"], "not a directory"),
    ):
        status, _, stderr = run_main(main, argv)
        assert status == 2 and stderr.count("\n") == 1 and fragment in stderr, stderr
        assert stderr.startswith(f"{PROG}: error: ")
    status, stdout, _ = run_main(main, ["--help"])
    assert status == 0 and "exit codes" in stdout and "130 interrupted" in stdout


@pytest.mark.slow
def test_manifest_quantization_must_match_the_model(bundle_copy):
    edit_manifest(bundle_copy, lambda m: m["models"]["int8"]["input"].update(scale=0.5))
    assert_bad(
        edge(bundle_copy, "--quant", "int8"),
        "model_int8.tflite",
        "input tensor differs from manifest.json",
        "scale",
    )


@pytest.mark.slow
def test_parity_failure_exits_1_with_a_json_report(bundle_copy, tmp_path):
    edit_manifest(
        bundle_copy, lambda m: m["models"]["float16"].update(thresholds={"max_abs_diff": 1e-9})
    )
    report = tmp_path / "r.json"
    status, stdout, stderr = edge(bundle_copy, "--quant", "float16,float32", "--json", report)
    assert status == 1, stdout + stderr
    assert "float16: FAIL: max |Δprob|" in stdout
    result = json.loads(report.read_text())
    assert (
        result["modes"]["float16"]["passed"] is False
        and result["modes"]["float32"]["passed"] is True
    )
    assert result["exit_code"] == 1
    assert os.listdir(tmp_path) == ["r.json", "bundle"] or sorted(os.listdir(tmp_path)) == [
        "bundle",
        "r.json",
    ]


@pytest.mark.slow
def test_raw_keeps_each_modes_outputs_as_the_runtime_gives_them(digits_bundle, tmp_path):
    """--raw: the parity run's outputs before dequantization, one array per mode
    (what the arm64 run compares across machines bit for bit)."""
    raw_path = tmp_path / "raw.npz"
    status, stdout, stderr = edge(digits_bundle, "--quant", "float32,int8", "--raw", raw_path)
    assert status == 0, stdout + stderr
    assert "raw outputs of float32, int8" in stdout
    manifest = json.loads((digits_bundle / "manifest.json").read_text())
    with np.load(digits_bundle / "eval.npz") as npz:
        reference = npz["probs"]
    with np.load(raw_path) as npz:
        raw = {name: npz[name] for name in npz.files}
    assert sorted(raw) == ["float32", "int8"]
    assert raw["float32"].dtype == np.float32 and raw["int8"].dtype == np.int8
    assert raw["float32"].shape == raw["int8"].shape == reference.shape
    np.testing.assert_allclose(raw["float32"], reference, atol=1e-5)
    out = manifest["models"]["int8"]["output"]
    probs = (raw["int8"].astype(np.float32) - out["zero_point"]) * out["scale"]
    # the parity table's own figure, from the raw values
    agreement = (probs.argmax(1) == reference.argmax(1)).mean()
    assert agreement >= manifest["models"]["int8"]["thresholds"]["min_agreement"]
    assert_bad(edge(digits_bundle, "--sample", "1", "--raw", raw_path), "--raw applies")
    assert_bad(edge(digits_bundle, "--raw", digits_bundle / "r.npz"), "--raw")
