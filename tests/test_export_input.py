"""keras-mha-export refuses bad input: one line, exit 2, nothing written (also Ctrl-C: exit 130).

In process (`main(argv)`), except where the exit-code contract itself is the
subject (`--help` without TensorFlow, Ctrl-C).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
from edge_bundle import REPO
from export_checks import PROG, leftovers, run_cli

from bundle_contract.errors import UsageError
from keras_mha_export import SourcePaths, export_bundle
from keras_mha_export.cli import main

pytest_plugins = ["edge_fixtures"]  # read_only_dir


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> pathlib.Path:
    """An untrained digits-shaped run directory: enough to reach every input check."""
    from keras_mha.model import ModelConfig, build_classifier

    config = ModelConfig(d_model=8, num_heads=2, ff_dim=8, dropout=0.0)
    model = build_classifier(config)
    rng = np.random.default_rng(0)
    x = rng.random((40, 8, 8)).astype("float32")
    run = tmp_path_factory.mktemp("tiny") / "run"
    run.mkdir()
    model.save(run / "model.keras")
    probs = model.predict(x, verbose=0).astype("float32")
    np.savez(run / "eval.npz", x=x, y=rng.integers(0, 10, 40).astype("int32"), probs=probs)
    np.savez(run / "calibration.npz", x=x[:16])
    (run / "labels.json").write_text(json.dumps([str(i) for i in range(10)]))
    metrics = {"dataset": "digits", "seed": 0, "config": config.to_dict(), "test_accuracy": 0.1}
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def _garbage(run):
    (run / "model.keras").write_bytes(b"this is not a zip archive")


def _bad_zip(run):
    with zipfile.ZipFile(run / "model.keras", "w") as archive:
        archive.writestr("config.json", "{not json")


def _unknown_layer(run):
    import keras

    # A layer class Keras cannot find again: unregistered, in no importable module.
    doubler = type("Doubler", (keras.layers.Layer,), {"call": lambda self, x: x * 2})
    doubler.__module__ = "no_such_module_for_keras_mha_tests"
    model = keras.Sequential(
        [keras.Input((8, 8)), doubler(), keras.layers.Flatten(), keras.layers.Dense(10)]
    )
    model.save(run / "model.keras")


def _existing_bundle(run):
    (run / "bundle").mkdir()
    (run / "bundle" / "keep").write_text("an older bundle")


def _npz(name, **change):
    def mutate(run):
        arrays = dict(np.load(run / name))
        for key, fn in change.items():
            if fn is None:
                del arrays[key]
            else:
                arrays[key] = fn(arrays[key])
        np.savez(run / name, **arrays)

    return mutate


def _nan(x):
    return np.full_like(x, np.nan)


BAD_INPUTS = {
    "missing-model": (lambda run: (run / "model.keras").unlink(), [], "model.keras"),
    "corrupt-model": (_garbage, [], "model.keras: cannot load"),
    "broken-keras-archive": (_bad_zip, [], "model.keras: cannot load"),
    "unknown-custom-object": (_unknown_layer, [], "model.keras: cannot load"),
    "probs-times-3": (
        _npz("eval.npz", probs=lambda p: p * 3),
        [],
        "eval.npz: ",
        "sums to 3",
    ),
    "probs-are-log-probs": (
        _npz("eval.npz", probs=np.log),
        [],
        "eval.npz: ",
        "negative",
    ),
    "probs-nan": (_npz("eval.npz", probs=_nan), [], "eval.npz: ", "NaN"),
    "calibration-all-nan": (_npz("calibration.npz", x=_nan), [], "calibration.npz: ", "NaN"),
    "calibration-dtype": (
        _npz("calibration.npz", x=lambda x: x.astype("float64")),
        [],
        "calibration.npz: ",
        "float64",
    ),
    "calibration-shape": (
        _npz("calibration.npz", x=lambda x: x[:, :, :4]),
        [],
        "calibration.npz: ",
        "[16, 8, 4]",
    ),
    "eval-shape": (
        _npz("eval.npz", x=lambda x: x.reshape(len(x), 64)),
        [],
        "eval.npz: ",
        "[40, 64]",
    ),
    "eval-dtype": (_npz("eval.npz", x=lambda x: x.astype("float16")), [], "eval.npz: ", "float16"),
    "eval-without-probs": (_npz("eval.npz", probs=None), [], "eval.npz: ", "probs"),
    "labels-count": (
        lambda run: (run / "labels.json").write_text('["a", "b"]'),
        [],
        "labels.json: ",
        "2 class names",
    ),
    "unknown-mode": (lambda run: None, ["--quant", "int8,int4"], "--quant: unknown mode 'int4'"),
    "existing-bundle": (_existing_bundle, [], "exists and is not empty (use --overwrite)"),
    "bundle-is-run-dir": (lambda run: None, ["--out", "{run}", "--overwrite"], "holds the"),
    "out-under-a-file": (
        lambda run: (run / "afile").write_text("x"),
        ["--out", "{run}/afile/bundle"],
        "afile is not a directory",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tiny_run, tmp_path):
    mutate, extra, *fragments = BAD_INPUTS[case]
    run = pathlib.Path(shutil.copytree(tiny_run, tmp_path / "run"))
    mutate(run)
    before = sorted(p.name for p in run.iterdir())
    bundle_before = (
        sorted(p.name for p in (run / "bundle").iterdir()) if (run / "bundle").exists() else None
    )
    status, stdout, stderr = run_cli([str(run), *[arg.format(run=run) for arg in extra]])
    assert status == 2, (stdout, stderr)
    assert stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith(f"{PROG}: error: "), stderr
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)
    assert sorted(p.name for p in run.iterdir()) == before  # no bundle, no temp dir
    if bundle_before is not None:
        assert sorted(p.name for p in (run / "bundle").iterdir()) == bundle_before
    assert leftovers(tmp_path) == []


def test_unwritable_out_is_refused_before_any_work(tiny_run, read_only_dir, monkeypatch):
    from keras_mha_export import source

    def must_not_load(*args, **kwargs):
        raise AssertionError("loaded the source before checking --out")

    monkeypatch.setattr(source, "load_run_dir", must_not_load)
    status, stdout, stderr = run_cli([tiny_run, "--out", read_only_dir / "bundle"])
    assert status == 2 and stdout == ""
    assert (
        stderr.count("\n") == 1 and f"--out {read_only_dir / 'bundle'}: cannot write in" in stderr
    ), stderr


def test_import_module_registers_custom_layers(tiny_run, tmp_path, monkeypatch):
    import keras

    module = "keras_mha_export_test_layers"
    (tmp_path / f"{module}.py").write_text(
        "import keras\n\n\n"
        f"@keras.saving.register_keras_serializable(package={module!r})\n"
        "class Doubler(keras.layers.Layer):\n"
        "    def call(self, x):\n"
        "        return x * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    layers = __import__(module)
    model = keras.Sequential(
        [keras.Input((8, 8)), layers.Doubler(), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    model.save(tmp_path / "custom.keras")
    files = ["--model", tmp_path / "custom.keras", "--calibration", tiny_run / "calibration.npz"]
    files += ["--eval", tiny_run / "eval.npz", "--out", tmp_path / "b"]
    # Forget the layer, as a fresh process would.
    monkeypatch.delitem(keras.saving.get_custom_objects(), f"{module}>Doubler")
    monkeypatch.delitem(sys.modules, module)
    status, _, stderr = run_cli(files)
    assert status == 2 and "unknown custom object" in stderr and "--import-module" in stderr
    status, _, stderr = run_cli([*files, "--import-module", module])
    # Loaded now; it fails later, on its 3 outputs against eval's 10 classes.
    assert status == 2 and "does not match eval probs with 10 classes" in stderr, stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{tmp}/nope"], "run directory {tmp}/nope: does not exist"),
        ([], "give RUN_DIR, or --model, --calibration and --eval"),
        (["--model", "m.keras", "--out", "{tmp}"], "missing --calibration"),
        (["{tmp}", "--eval", "e.npz"], "not both"),
        (["--model", "m.keras", "--calibration", "c.npz", "--eval", "e.npz"], "--out is required"),
        (["{tmp}", "--bogus"], "unrecognized arguments: --bogus"),
    ],
    ids=["missing-run-dir", "no-source", "model-alone", "run-dir-and-files", "no-out", "bad-flag"],
)
def test_bad_command_lines_are_one_line_exit_2(argv, message, tmp_path, capsys):
    try:
        status = main([arg.format(tmp=tmp_path) for arg in argv])
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert message.format(tmp=tmp_path) in captured.err
    assert list(tmp_path.iterdir()) == []


def test_api_rejects_unknown_modes_and_missing_out(tmp_path):
    with pytest.raises(UsageError, match="unknown mode 'int4'"):
        export_bundle(tmp_path, modes=["int4"])
    with pytest.raises(UsageError, match="output directory"):
        export_bundle(SourcePaths(tmp_path / "m.keras", tmp_path / "c.npz", tmp_path / "e.npz"))


def test_help_and_argument_errors_answer_without_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from keras_mha_export.cli import main\n"
        "status = main(sys.argv[1:])\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'keras_mha'}\n"
        "print(status, sorted(heavy))\n"
    )
    for argv, status in ((["--help"], 0), ([str(tmp_path), "--bogus"], 2), ([], 2)):
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True
        )
        assert proc.stdout.strip().splitlines()[-1] == f"{status} []", (
            argv,
            proc.stdout,
            proc.stderr,
        )


@pytest.mark.slow
def test_ctrl_c_is_exit_130_and_leaves_nothing(tiny_run, tmp_path):
    """SIGINT while converting: "interrupted" in one line, no bundle and no staging directory."""
    out = tmp_path / "bundle"
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_mha_export", str(tiny_run), "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    while not list(tmp_path.glob(".bundle.tmp-*")) and proc.poll() is None:
        time.sleep(0.05)  # staging exists: the source is loaded, conversion under way
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == [f"{PROG}: interrupted"]
    assert list(tmp_path.iterdir()) == []
