"""The run directory type: one reader, one writer, one-line refusals, nothing half-written."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from bundle_contract.errors import UsageError
from keras_mha.data import pronouns_vocab
from keras_mha.model import ModelConfig, build_classifier
from keras_mha.rundir import EvalSet, RunWriter, read_run

DIGITS = ModelConfig(d_model=8, num_heads=2, ff_dim=8, seed=1)


def _parts(config: ModelConfig, n: int = 12, vocab=None):
    """An untrained model and consistent run contents (no training needed)."""
    rng = np.random.default_rng(0)
    model = build_classifier(config)
    if config.input_kind == "tokens":
        x = rng.integers(1, config.feature_dim, (n, config.sequence_length)).astype("int32")
    else:
        x = rng.random((n, config.sequence_length, config.feature_dim)).astype("float32")
    probs = model.predict(x, verbose=0).astype("float32")
    y = rng.integers(0, config.num_classes, n).astype("int32")
    metrics = {"dataset": "digits", "seed": config.seed, "test_accuracy": 0.5}
    labels = [f"class {i}" for i in range(config.num_classes)]
    return model, metrics, config, EvalSet(x, y, probs), x[:5].copy(), labels, vocab


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rundir") / "run"
    with RunWriter(out) as writer:
        writer.write(*_parts(DIGITS))
    return out


def test_written_run_reads_back(good_run):
    run = read_run(good_run)
    assert sorted(p.name for p in good_run.iterdir()) == [
        "calibration.npz",
        "eval.npz",
        "labels.json",
        "metrics.json",
        "model.keras",
    ]
    assert run.config == DIGITS and run.metrics["config"] == DIGITS.to_dict()
    assert run.eval.x.shape == (12, 8, 8) and run.eval.y.dtype == np.int32
    assert run.labels == [f"class {i}" for i in range(10)] and run.vocab is None
    model = run.load_model()
    np.testing.assert_allclose(model.predict(run.eval.x, verbose=0), run.eval.probs, atol=1e-6)


def test_token_run_keeps_its_vocabulary(tmp_path):
    vocab = pronouns_vocab()
    config = ModelConfig(
        input_kind="tokens",
        sequence_length=vocab.max_length,
        feature_dim=len(vocab),
        num_classes=3,
        d_model=8,
        num_heads=2,
        ff_dim=8,
    )
    parts = _parts(config, vocab=vocab)
    extras = {"cue": np.array(["number"] * 12), "nouns": np.full(12, 2, "int32")}
    parts = (*parts[:3], EvalSet(parts[3].x, parts[3].y, parts[3].probs, extras), *parts[4:])
    with RunWriter(tmp_path / "run") as writer:
        writer.write(*parts)
    run = read_run(tmp_path / "run")
    assert run.vocab == vocab and set(run.eval.extras) == {"cue", "nouns"}
    (tmp_path / "run" / "vocab.json").unlink()
    with pytest.raises(UsageError, match=r"vocab.json: missing; a token model's run needs"):
        read_run(tmp_path / "run")
    with pytest.raises(UsageError, match=r"array x holds token ids in \[1, 99\]"):
        bad = parts[3].x.copy()
        bad[0, 0] = 99
        with RunWriter(tmp_path / "other") as writer:
            writer.write(*parts[:3], EvalSet(bad, parts[3].y, parts[3].probs), *parts[4:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _bad_eval(ev: EvalSet, change: str) -> EvalSet:
    probs, y = ev.probs, ev.y
    if change == "probs-times-3":
        return EvalSet(ev.x, y, 3 * probs)
    if change == "log-probs":
        return EvalSet(ev.x, y, np.log(probs))
    if change == "nan-probs":
        return EvalSet(ev.x, y, np.where(np.arange(len(y))[:, None] == 2, np.nan, probs))
    if change == "probs-classes":
        return EvalSet(ev.x, y % 4, np.full((len(y), 4), 0.25, "float32"))
    if change == "labels-out-of-range":
        return EvalSet(ev.x, np.full_like(y, 10), probs)
    if change == "probs-rows":
        return EvalSet(ev.x, y, probs[:-1])
    raise AssertionError(change)


# (what is changed, the file named, the problem in its one line)
BAD_VALUES = [
    ("probs-times-3", "eval.npz", r"probs rows must sum to 1 .* row \d+ sums to 3"),
    ("log-probs", "eval.npz", r"probs has negative values"),
    ("nan-probs", "eval.npz", r"probs has NaN or infinite values"),
    ("probs-classes", "eval.npz", r"array probs has 4 classes; metrics.json's model has 10"),
    ("labels-out-of-range", "eval.npz", r"y has labels outside 0..9"),
    ("probs-rows", "eval.npz", r"probs must be float of shape \[12, classes\]"),
    ("calibration-nan", "calibration.npz", r"x is all NaN or infinite"),
    ("calibration-shape", "calibration.npz", r"x is float32 \[5, 8, 4\] but the model takes"),
    ("calibration-dtype", "calibration.npz", r"x is float64 \[5, 8, 8\] but the model takes"),
    ("labels-count", "labels.json", r"3 class names, but the model has 10"),
]


def _bad_parts(change: str):
    model, metrics, config, ev, calibration, labels, vocab = _parts(DIGITS)
    if change.startswith("calibration-"):
        calibration = {
            "calibration-nan": np.full_like(calibration, np.nan),
            "calibration-shape": calibration[:, :, :4],
            "calibration-dtype": calibration.astype("float64"),
        }[change]
    elif change == "labels-count":
        labels = labels[:3]
    else:
        ev = _bad_eval(ev, change)
    return model, metrics, config, ev, calibration, labels, vocab


@pytest.mark.parametrize("change, name, problem", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_writer_refuses_bad_values_and_writes_nothing(change, name, problem, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(UsageError) as error:
        with RunWriter(out) as writer:
            writer.write(*_bad_parts(change))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{out / name}: "), message
    assert re.search(problem, message), message
    assert list(tmp_path.iterdir()) == []  # neither the run nor its staging directory


@pytest.mark.parametrize("change, name, problem", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_reader_refuses_bad_files(change, name, problem, good_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    _, _, _, ev, calibration, labels, _ = _bad_parts(change)
    if name == "eval.npz":
        np.savez(run / name, **ev.arrays())
    elif name == "calibration.npz":
        np.savez(run / name, x=calibration)
    else:
        (run / name).write_text(json.dumps(labels))
    with pytest.raises(UsageError, match=problem) as error:
        read_run(run)
    assert str(error.value).startswith(f"{run / name}: ")


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda run: (run / "eval.npz").unlink(), r"eval.npz: missing; expected a run directory"),
        (lambda run: (run / "eval.npz").write_bytes(b"PK junk"), r"eval.npz: not a readable .npz"),
        (lambda run: (run / "metrics.json").write_text("{"), r"metrics.json: not valid JSON"),
        (lambda run: (run / "metrics.json").write_text("{}"), r"metrics.json: missing key\(s\)"),
        (
            lambda run: (run / "metrics.json").write_text(
                json.dumps(
                    {"dataset": "d", "seed": 0, "test_accuracy": 1, "config": {"d_model": 30}}
                )
            ),
            r"metrics.json: key config: d_model must be divisible by num_heads",
        ),
    ],
    ids=["missing-eval", "corrupt-eval", "bad-json", "no-keys", "bad-config"],
)
def test_reader_names_the_file(damage, match, good_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    damage(run)
    with pytest.raises(UsageError, match=match):
        read_run(run)
    with pytest.raises(UsageError, match="does not exist; expected a run directory"):
        read_run(tmp_path / "nope")


def test_model_must_match_the_stored_config(good_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    build_classifier(ModelConfig(d_model=8, num_heads=4, ff_dim=8)).save(run / "model.keras")
    with pytest.raises(UsageError, match=r"model.keras: heads per layer \[4\]; .* says \[2\]"):
        read_run(run).load_model()
    (run / "model.keras").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="model.keras: cannot load the model"):
        read_run(run).load_model()


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_an_interrupted_writer_keeps_the_old_run(error, good_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(good_run, out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(type(error)):
        with RunWriter(out, overwrite=True) as writer:
            writer.write(*_parts(ModelConfig(d_model=8, num_heads=1, ff_dim=8)))
            raise error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in out.iterdir()) == before
    assert read_run(out).config == DIGITS  # the old run, untouched


def test_output_checks(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep")
    with pytest.raises(UsageError, match="exists and is not empty; pass --overwrite"):
        RunWriter(tmp_path / "notes")
    with pytest.raises(UsageError, match="refusing to overwrite: not a run directory"):
        RunWriter(tmp_path / "notes", overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        RunWriter(tmp_path / "file")
    with pytest.raises(UsageError, match="cannot write the run directory"):
        RunWriter(tmp_path / "file" / "run")
    with pytest.raises(RuntimeError):  # a writer that wrote nothing replaces nothing
        with RunWriter(tmp_path / "empty"):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "notes"]


def test_model_config_refuses_unknown_keys():
    """A metrics.json config with a key this version does not know is refused, not dropped."""
    data = {**DIGITS.to_dict(), "num_head": 4}
    with pytest.raises(ValueError, match="unknown ModelConfig key.*num_head; expected"):
        ModelConfig.from_dict(data)
    assert ModelConfig.from_dict(DIGITS.to_dict()) == DIGITS


def test_first_rows_cuts_eval_and_calibration_and_links_the_rest(good_run, tmp_path):
    """keras_mha.rundir.subset: the arm64 run's smaller bundles (mk/arm64.mk)."""
    from keras_mha.rundir.subset import first_rows

    (good_run / "bundle").mkdir(exist_ok=True)  # made from the run: not the subset's
    try:
        out = first_rows(good_run, tmp_path / "sub", 5, 3)
    finally:
        (good_run / "bundle").rmdir()  # the module's run, as the other tests expect it
    run, whole = read_run(out), read_run(good_run)
    np.testing.assert_array_equal(run.eval.x, whole.eval.x[:5])
    np.testing.assert_array_equal(run.eval.probs, whole.eval.probs[:5])
    np.testing.assert_array_equal(run.calibration, whole.calibration[:3])
    assert (out / "model.keras").resolve() == (good_run / "model.keras").resolve()
    assert (out / "model.keras").is_symlink() and not (out / "eval.npz").is_symlink()
    assert not (out / "bundle").exists()


def test_first_rows_cuts_a_json_row_file_with_its_eval(tmp_path):
    from keras_mha.rundir.subset import _json_rows

    for data, cut in (([1, 2, 3, 4], [1, 2]), ({"texts": ["a", "b", "c", "d"], "k": 1},
                                                  {"texts": ["a", "b"], "k": 1})):  # fmt: skip
        (tmp_path / "texts.json").write_text(json.dumps(data))
        (tmp_path / "out").mkdir(exist_ok=True)
        _json_rows(tmp_path / "texts.json", 2, 4, tmp_path / "out")
        assert json.loads((tmp_path / "out" / "texts.json").read_text()) == cut
    with pytest.raises(UsageError, match="expected one entry per eval row"):
        _json_rows(tmp_path / "texts.json", 2, 5, tmp_path / "out")


@pytest.mark.parametrize(
    "args, problem",
    [
        ((13,), "eval_rows: 13 rows asked for; .*eval.npz has 12 \\(expected 1 to 12\\)"),
        ((0,), "eval_rows: 0 rows asked for"),
        ((4, 6), "calibration_rows: 6 rows asked for; .*calibration.npz has 5"),
    ],
)
def test_first_rows_refuses_in_one_line_and_leaves_nothing(good_run, tmp_path, args, problem):
    from keras_mha.rundir.subset import first_rows

    before = sorted(p.name for p in good_run.iterdir())
    with pytest.raises(UsageError, match=problem) as info:
        first_rows(good_run, tmp_path / "sub", *args)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "sub").exists() and list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in good_run.iterdir()) == before
