"""keras-mha-train --from CHECKPOINT --data FILE: a user's labelled text read,
refused in one line when a classifier cannot learn from it, split with a
held-out test set, and (slow) all-MiniLM-L6-v2 fine-tuned on the corpus's 29
topics into a run that export verifies and the device runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bundle_contract.errors import UsageError
from keras_mha.examples import topic_rows, write_csv
from keras_mha.pretrained import corpus
from keras_mha.train import finetune
from keras_mha.train.cli import main

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def write(path, text: str | bytes):
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    return path


GOOD_CSV = "text,label\nthe soup is hot,food\nthe train is late,travel\nadd salt,food\nbook a seat,travel\n"


def test_a_csv_and_jsonl_give_the_same_rows(tmp_path):
    csv_rows = finetune.read_labelled(write(tmp_path / "a.csv", GOOD_CSV))
    lines = [json.dumps({"label": lab, "text": t, "id": i}) for i, (t, lab) in enumerate(
        [("the soup is hot", "food"), ("the train is late", "travel"), ("add salt", "food"),
         ("book a seat", "travel")])]  # fmt: skip
    json_rows = finetune.read_labelled(write(tmp_path / "a.jsonl", "\n".join(lines) + "\n"))
    assert csv_rows.texts == json_rows.texts and csv_rows.labels == json_rows.labels
    assert csv_rows.classes == ("food", "travel")
    np.testing.assert_array_equal(csv_rows.y, [0, 1, 0, 1])
    # other column names, a byte-order mark and quoted commas
    other = '\ufeffsentence,intent\n"hi, there",greet\nbye,leave\nhello,greet\nsee you,leave\n'
    rows = finetune.read_labelled(write(tmp_path / "b.csv", other), "sentence", "intent")
    assert rows.texts[0] == "hi, there" and rows.classes == ("greet", "leave")


BAD = {
    "empty": ("a.csv", b"", "is empty"),
    "header only": ("a.csv", b"text,label\n", "has no labelled rows"),
    "one class": ("a.csv", b"text,label\na,x\nb,x\n", "every row has label 'x'"),
    "a lonely class": ("a.csv", b"text,label\na,x\nb,x\nc,y\n", "class 'y' has 1 row"),
    "unknown column": ("a.csv", b"sentence,label\na,x\n", "has no column 'text' (--text-column); its columns are: sentence, label"),
    "duplicate header": ("a.csv", b"text,label,text\na,x,b\n", "the header names column 'text' twice"),
    "bad encoding": ("a.csv", "text,label\ncaf\u00e9,x\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 14)"),
    "ragged line": ("a.csv", b"text,label\na,x\nb\n", "line 3: 1 fields, the header has 2"),
    "empty label": ("a.csv", b"text,label\na,x\nb, \n", "line 3: label is empty"),
    "not json": ("a.jsonl", b'{"text": "a", "label": "x"}\nnope\n', "line 2: not a JSON object"),
    "json without the key": ("a.jsonl", b'{"text": "a"}\n', "line 1: no key 'label' (--label-column)"),
    "json number text": ("a.jsonl", b'{"text": 3.5, "label": "x"}\n', "line 1: text must be text, got float"),
    "other suffix": ("a.xlsx", b"text,label\n", "expected a .csv or .jsonl file, got .xlsx"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_a_classifier_cannot_learn_is_one_line(tmp_path, case):
    name, data, expected = BAD[case]
    path = write(tmp_path / name, data)
    with pytest.raises(UsageError) as info:
        finetune.read_labelled(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)) and expected in message, message


def test_the_command_refuses_in_one_line_with_exit_2_before_tensorflow(tmp_path):
    bad = write(tmp_path / "bad.csv", b"text,label\na,x\nb,x\n")
    good = write(tmp_path / "good.csv", GOOD_CSV)
    cases = [
        (["--from", "all-MiniLM-L6-v2", "--data", bad], "every row has label 'x'"),
        (["--data", good], "--data: needs --from CHECKPOINT"),
        (["--from", "all-MiniLM-L6-v2"], "--from: needs --data FILE"),
        (["--from", "all-MiniLM-L6-v2", "--data", good, "--num-heads", "2"], "--num-heads: is for"),
        (["--from", "all-MiniLM-L6-v2", "--data", good, "--dataset", "pronouns"], "--dataset: is for"),
        (["--from", "all-MiniLM-L6-v2", "--data", good, "--dataset=digits"], "--dataset: is for"),
        (["--from", tmp_path / "nowhere", "--data", good], "nowhere"),
        (["--from", "all-MiniLM-L6-v2", "--data", good, "--distribute", "mirrored"],
         "--distribute mirrored: is TensorFlow's, for a classifier trained from scratch"),
    ]  # fmt: skip
    code = "import sys; from keras_mha.train.cli import main; r = main(sys.argv[1:]); "
    code += "assert 'tensorflow' not in sys.modules; raise SystemExit(r)"
    for argv, expected in cases:
        done = subprocess.run(
            [sys.executable, "-c", code, *map(str, argv), "--out", str(tmp_path / "run")],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert done.returncode == 2, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and expected in done.stderr, done.stderr
        assert not (tmp_path / "run").exists()


JOB = ["--distribute", "heads", "--processes", "2", "--process-id", "0"]


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--processes", "2", "--process-id", "0", "--coordinator", "h:1"],
         "--processes 2: needs --distribute data or heads"),
        ([*JOB[:4]], "--processes 2: needs --process-id too"),
        ([*JOB], "--processes 2: needs --coordinator too"),
        ([*JOB[:4], "--process-id", "2", "--coordinator", "h:1"],
         "--process-id 2: must be below --processes 2"),
        ([*JOB, "--coordinator", "localhost"],
         "--coordinator localhost: expected HOST:PORT, e.g. 10.0.0.1:29500"),
        ([*JOB, "--coordinator", "h:70000"], "--coordinator h:70000: expected HOST:PORT"),
        (["--process-id", "1"], "--process-id: needs --processes N above 1"),
        (["--peer-timeout", "5"], "--peer-timeout: needs --processes N above 1"),
        ([*JOB, "--coordinator", "h:1"], "--processes 2: joins JAX processes (jax.distributed), "
         "and Keras runs on tensorflow: run with KERAS_BACKEND=jax"),
    ],
)  # fmt: skip
def test_a_job_of_several_processes_is_checked_in_one_line(extra, expected, tmp_path, capsys):
    """keras-mha-train --processes (keras_mha/train/job.py): what the job's flags
    lack or get wrong is one line and exit 2, before TensorFlow or JAX, and
    before a worker is started: on TensorFlow too (this venv's backend), where
    a whole job is refused last."""
    good = write(tmp_path / "good.csv", GOOD_CSV)
    argv = ["--from", "all-MiniLM-L6-v2", "--data", str(good), *extra]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--checkpoint", "state"], "--checkpoint: is for fine-tuning (--from)"),
        (["--processes", "2"], "--processes: is for fine-tuning (--from)"),
    ],
)
def test_checkpoints_and_jobs_are_for_fine_tuning(extra, expected, tmp_path, capsys):
    assert main(["--dataset", "pronouns", *extra, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_a_checkpoint_of_another_run_or_a_torn_one_is_refused_in_one_line(tmp_path):
    """keras_mha/train/checkpoint.py: the state resumed must be this run's, and
    its weights the file state.json names (checked before the model is touched)."""
    from keras_mha.train.checkpoint import META, TrainingState

    mine = {"seed": 0, "data_sha256": "ab", "batch_size": 16}
    (tmp_path / "state-2.safetensors").write_bytes(b"weights")
    meta = {
        "version": 1, "epochs_done": 2, "train_loss": [1.0, 0.9], "fingerprint": mine,
        "variables": [], "state": "state-2.safetensors",
        "sha256": "0" * 64,
    }  # fmt: skip
    cases = [
        ({"fingerprint": {**mine, "seed": 1}}, "holds the state of another run (its seed differs: "
         "1, this run's 0); give another directory or remove it"),
        ({"fingerprint": {**mine, "max_length": 64}}, "its max_length differs: 64, this run's None"),
        ({"train_loss": [1.0]}, "state.json says 2 epochs done with 1 losses, of 4"),
        ({"epochs_done": 6, "train_loss": [1.0] * 6}, "says 6 epochs done with 6 losses, of 4"),
        ({"version": 2}, "state.json is version 2; expected 1"),
        ({}, "state-2.safetensors is missing or not the one state.json names (sha256)"),
        ({"state": "../../etc/passwd"}, "passwd is missing or not the one state.json names"),
    ]  # fmt: skip
    for change, expected in cases:
        (tmp_path / META).write_text(json.dumps({**meta, **change}))
        with pytest.raises(UsageError) as info:
            TrainingState(tmp_path, mine).restore(None, 4, None)
        message = str(info.value)
        assert message.startswith(f"--checkpoint {tmp_path}: ") and expected in message, message
    (tmp_path / META).write_text("{not json")
    with pytest.raises(UsageError, match="state.json is not a training state"):
        TrainingState(tmp_path, mine).restore(None, 4, None)
    assert TrainingState(tmp_path / "empty", mine).restore(None, 4, None) == (0, [])


def test_a_length_past_the_checkpoints_positions_is_one_line_with_exit_2(tmp_path, capsys):
    """Found by the README's commands on a small checkpoint: this was exit 3, an
    internal error, for what is bad input (MiniLM has 512 positions)."""
    from keras_mha.train.cli import main

    good = write(tmp_path / "good.csv", GOOD_CSV)
    argv = ["--from", "all-MiniLM-L6-v2", "--data", str(good), "--max-length", "600"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--max-length: 600 exceeds" in err and "512" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("scratch", [False, True])
def test_distributing_on_tensorflow_is_one_line_with_exit_2(scratch, tmp_path, capsys):
    """--distribute data|heads is keras.distribution's, which shards on JAX: on
    TensorFlow the command says so before it reads the checkpoint (or loads the
    dataset, for a classifier from scratch)."""
    import keras

    assert keras.backend.backend() == "tensorflow"
    good = write(tmp_path / "good.csv", GOOD_CSV)
    source = ["--dataset", "pronouns"] if scratch else ["--from", "all-MiniLM-L6-v2"]
    argv = [*source, "--data", str(good), "--distribute", "heads"]
    argv = argv[:2] + argv[4:] if scratch else argv
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "--distribute heads: Keras's distribution API shards on JAX, not tensorflow" in err
    assert not (tmp_path / "run").exists()


def test_the_heads_split_needs_a_count_that_divides_devices_and_heads():
    """training_distribution: the model axis is the largest count dividing both
    (12 heads, 8 devices: 4), and none above 1 is refused in one line."""
    import keras

    from keras_mha import MultiHeadAttention
    from keras_mha.distribution import training_distribution

    inputs = keras.Input((4, 24))
    model = keras.Model(inputs, MultiHeadAttention(num_heads=3, key_dim=8)(inputs, inputs))
    with pytest.raises(ValueError) as info:
        training_distribution(model, "heads", devices=[f"cpu:{i}" for i in range(8)])
    assert str(info.value) == (
        "no count above 1 divides both the 8 devices and the heads (3): the heads cannot "
        "be split; use data parallel"
    )
    with pytest.raises(ValueError, match="unknown distribution 'tensor'; expected one of data"):
        training_distribution(model, "tensor", devices=["cpu:0"])


def test_the_held_out_split_is_stratified_disjoint_and_seeded():
    y = np.repeat(np.arange(5), [2, 3, 10, 40, 7])
    train, test = finetune.split(y, 0.2, seed=3)
    assert not set(train) & set(test) and sorted([*train, *test]) == list(range(len(y)))
    for c, n in enumerate([2, 3, 10, 40, 7]):  # at least one held out, at least one trained
        held = int((y[test] == c).sum())
        assert held == min(max(1, round(0.2 * n)), n - 1)
    again = finetune.split(y, 0.2, seed=3)
    np.testing.assert_array_equal(again[1], test)
    assert not np.array_equal(finetune.split(y, 0.2, seed=4)[1], test)


# ----------------------------------------------------- the real encoder, slow
@pytest.fixture(scope="module")
def topics_run(tmp_path_factory):
    """all-MiniLM-L6-v2 fine-tuned on the corpus's 29 topics (CSV, as a user's)."""
    root = tmp_path_factory.mktemp("topics")
    write_csv(root / "topics.csv", topic_rows())
    # 48 word pieces hold every topic's words (the longest sentences are cut), in
    # half the time of padding to the longest (about 90)
    metrics = finetune.finetune(
        "all-MiniLM-L6-v2", root / "topics.csv", root / "run", max_length=48
    )
    return root, metrics


@pytest.mark.slow
def test_minilm_fine_tuned_on_the_topics_classifies_held_out_sentences(topics_run, figure):
    root, metrics = topics_run
    figure("test_accuracy", metrics["test_accuracy"], ">= 0.70")
    rows = topic_rows()
    assert metrics["test_size"] + metrics["train_size"] == len(rows)
    assert len(metrics["config"]["labels"]) == len(set(corpus.topics().values())) == 29
    # Chance is 1/29. The topics are distinct subjects, each a group of
    # paraphrases, and a sentence encoder is trained to put paraphrases
    # together. Measured 0.827 (81 of 98) on an Intel Xeon with oneDNN on,
    # off and capped at AVX2 (0.806 before the batches took epoch_rows' order;
    # 0.82 on an AMD EPYC, training the embedding layer too); 98 rows make the
    # figure's standard deviation about 0.04
    # (binomial), and another CPU's kernels train another model: 0.70 is
    # about three deviations below, still 20 times chance.
    assert metrics["test_accuracy"] >= 0.70, metrics["test_accuracy"]
    assert metrics["train_loss"][-1] < metrics["train_loss"][0] / 4
    held_out = json.loads((root / "run" / "texts.json").read_text())
    texts = held_out["texts"] if isinstance(held_out, dict) else held_out
    assert len(texts) == metrics["test_size"]


@pytest.mark.slow
def test_the_fine_tuned_run_exports_and_the_device_prints_its_label(topics_run, tmp_path):
    from keras_mha_export.bundle import export_bundle
    from tests.test_pretrained import _edge

    root, metrics = topics_run
    manifest = export_bundle(root / "run", tmp_path / "bundle", "float32,dynamic")
    assert manifest.verified == ["float32", "dynamic"]
    assert manifest.models["float32"].parity.max_abs_diff <= 1e-5
    done = _edge(tmp_path / "bundle", "--quant", "float32", "--text", "Whisk the eggs with sugar.")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("float32"))
    assert row.split()[1] == "cooking", row
    # The held-out gold labels are in the bundle: its float accuracy is the
    # run's, each mode is scored on them, and the device names sample 0's label.
    assert manifest.eval.float_accuracy == pytest.approx(metrics["test_accuracy"], abs=1e-12)
    assert manifest.models["float32"].parity.accuracy == manifest.eval.float_accuracy
    with np.load(root / "run" / "eval.npz") as ev:
        gold = metrics["config"]["labels"][int(ev["y"][0])]
    done = _edge(tmp_path / "bundle", "--quant", "float32", "--sample", "0")
    assert done.returncode == 0, done.stderr
    assert f"sample 0 of {metrics['test_size']} in eval.npz: label {gold!r}" in done.stdout


@pytest.mark.slow
def test_head_tools_take_the_fine_tuned_run(topics_run):
    """Importance and pruning on the fine-tuned classifier, as on an imported one:
    removing heads is masking them, the head kept."""
    from keras_mha.heads.encoder import (
        jacobian_importance,
        prune_encoder,
        removal_masks,
        select_heads,
    )
    from keras_mha.pretrained.encoding import embed
    from keras_mha.rundir.embedding import read_embedding_run

    root, _ = topics_run
    run = read_embedding_run(root / "run")
    model = run.load_model()
    # 8 sentences: one Jacobian batch (each is 12 heads' passes a layer); the
    # claims are the shapes and that pruning is masking, not the scores' values
    scores = jacobian_importance(model, run.calibration[:8])
    assert [len(s) for s in scores] == [12] * 6  # all-MiniLM-L6-v2: 6 layers x 12 heads
    removed = select_heads(scores, 0.25)
    pruned, _ = prune_encoder(model, removed, run.config)
    x = run.eval.x[:8]
    masked = embed(model, x, removal_masks(model, removed))
    np.testing.assert_allclose(embed(pruned, x), masked, atol=1e-5)
    assert np.abs(masked - run.eval.probs[:8]).max() > 1e-3  # the heads did matter


# Three standard deviations of an accuracy near 0.7 measured on 600 sentences
# (sqrt(0.7 * 0.3 / 600) = 0.019): a model above the ceiling by this much beats
# it on more than these sentences' luck.
MARGIN = 0.06


def noun_blind_ceiling(texts, y) -> float:
    """The best accuracy any classifier on the from-scratch vocabulary can
    reach on `texts`: it sees each unseen word as <unk>, so sentences that
    encode alike get one answer; the ceiling gives each group its majority
    label (computed with the answers: an upper bound, no training)."""
    from keras_mha import data as datasets

    x = datasets.pronouns_vocab().encode(list(texts))
    groups: dict[bytes, dict[int, int]] = {}
    for row, label in zip(x, y):
        counts = groups.setdefault(row.tobytes(), {})
        counts[int(label)] = counts.get(int(label), 0) + 1
    return sum(max(c.values()) for c in groups.values()) / len(y)


@pytest.mark.slow
def test_fine_tuned_pronouns_beat_any_from_scratch_classifier_on_unseen_words(tmp_path, figure):
    """all-MiniLM-L6-v2 fine-tuned on the pronoun task answers sentences of
    nouns and frames no training row has above what any classifier trained
    from scratch on our vocabulary could (README, docs/finetune.md)."""
    from keras_mha import data as datasets
    from keras_mha.examples import pronoun_rows
    from keras_mha.rundir.embedding import read_embedding_run

    write_csv(tmp_path / "pronouns.csv", pronoun_rows())
    # 8 epochs, not the default 6: the loss sits at chance until the heads find
    # the cues (the 4th epoch here); 2 more leave room for a CPU where it is later
    metrics = finetune.finetune(
        "all-MiniLM-L6-v2", tmp_path / "pronouns.csv", tmp_path / "run", epochs=8, max_length=32
    )
    figure("test_accuracy", metrics["test_accuracy"], ">= 0.95")
    assert metrics["test_accuracy"] >= 0.95  # its own held-out rows: the task is learnt
    texts, y, _, _ = datasets.generate_pronouns(600, 1, datasets.UNSEEN_GRAMMAR)
    ceiling = noun_blind_ceiling(texts, y)
    assert ceiling < 0.6  # 0.547: the unseen words carry the answer
    run = read_embedding_run(tmp_path / "run")
    probs = finetune.encoder_probs(run.load_model(), run.tokenizer.encode(list(texts))[0])
    accuracy = figure(
        "unseen accuracy", (probs.argmax(1) == y).mean(), f">= {ceiling + MARGIN:.3f}"
    )
    # The claim is the comparison: above what any from-scratch classifier can
    # reach on these 600 sentences, by more than sampling can explain (MARGIN).
    # The level itself depends on the kernels (which cue words 1,200 rows teach
    # it to lean on). One thread a process, as make test runs it, on an Intel
    # Xeon, the batches in epoch_rows' order: 0.915 (oneDNN on), 0.928 (off),
    # 0.940 (capped at AVX2); with each backend's own shuffle 0.885, 0.888 and
    # 0.798; before the embedding layer was frozen, 0.840 and 0.872 there and
    # 0.69 at worst (AVX2, AMD EPYC): the margin is the claim's, not one run's.
    assert float(accuracy) >= ceiling + MARGIN, (accuracy, ceiling)


def test_progress_goes_to_stderr_a_line_per_epoch_off_a_terminal():
    import io

    stream = io.StringIO()
    callback = finetune.Progress(stream).callback
    callback.set_params({"epochs": 2, "steps": 3})
    callback.on_train_begin()
    for epoch in range(2):
        callback.on_epoch_begin(epoch)
        for batch in range(3):
            callback.on_train_batch_end(batch, {"loss": 1.0 - 0.1 * batch})
        callback.on_epoch_end(epoch, {"loss": 0.8 - 0.3 * epoch, "accuracy": 0.5 + 0.25 * epoch})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in stream.getvalue()  # not a terminal: no rewrites
    assert lines[0].startswith("epoch 1/2  loss 0.8000  accuracy 0.5000")
    assert lines[1].startswith("epoch 2/2  loss 0.5000  accuracy 0.7500")
    assert lines[0].endswith("s left)") and lines[1].endswith("(0 s left)")
