"""The README's examples run as written.

- Its Python blocks run in this process.
- Every command line of its shell blocks (fenced with no language, or sh,
  bash, shell, console) runs (slow tier), on small models, in a temporary
  folder, and must exit 0: `test_readme_shell_commands_run`. The fast tier
  checks that each line is either run there or named in NOT_RUN with its
  reason, so the README cannot gain a command no test runs.

A line is taken as written: `# comments` are dropped, `a|b|c` gives one
command per alternative, and console blocks' `$ ` lines are the commands
(their other lines are output). The only changes made to a line:

- it runs in the temporary folder, so `runs/...` lands there (with
  PYTHONPATH=REPO, as if from the repo's root, where `python -m edge_demo`
  finds the device app); `.venv/bin/...` and `.venv-*/bin/...` are the
  repo's venvs, `.venv-edge/bin/python` is tests/edge_bundle.edge_python;
- SMALL's flags are appended (training of seconds; 48 word pieces, within the
  tiny checkpoint's 64 positions);
- PLACEHOLDERS: all-MiniLM-L6-v2 and DIR are a tiny random BERT checkpoint
  (tests/test_pretrained_oracle.py's oracle, TINY's shape), RUN and RUN_DIR
  a small pronouns run (the one kind every keras-mha-heads subcommand takes:
  curve and plot refuse an imported or fine-tuned encoder, coref a run that
  reads no words), and a placeholder after --out a new run folder;
- `my.csv` is written: 60 of the lesson's pronoun sentences (text,label);
- a `runs/...` folder a line reads and no line writes (runs/minilm: `make
  encoder` writes it) is made first by the lines of PREPARE.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import re
import shlex
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"

SHELL_INFO = {"", "sh", "bash", "shell", "console"}

# Shell lines of the README not run here, each with the reason.
NOT_RUN = {
    "make demo": (
        "sets up every venv, then trains, exports and runs the device app on the full-size "
        "digits model: the README's keras-mha-train, keras-mha-export and edge_demo lines, "
        "run here on a small model"
    ),
    "make test": "is CI itself: it runs this test",
    "make llm": (
        "imports the real SmolLM2 (98 MB), compares it with transformers on three "
        "backends (tests/test_decoder.py's smollm2 tests, which make test runs, do the "
        "same) and exports its bundle (tests/test_decoder_bundle.py: a small one)"
    ),
    ".venv-edge/bin/python -m edge_demo runs/smollm2/bundle --chat "
    "'What is multi-head attention?' --quant dynamic": (
        "reads the SmolLM2 bundle make llm writes; tests/test_decoder_bundle.py exports a "
        "small language model's bundle and runs --chat and --generate on it"
    ),
    ".venv/bin/keras-mha-generate runs/smollm2 'What is multi-head attention?' --chat": (
        "reads the SmolLM2 run make llm writes; tests/test_decoder_gguf.py runs "
        "keras-mha-generate on a small GGUF, test_decoder.py generates with the real one"
    ),
    "make encoder": (
        "imports the real all-MiniLM-L6-v2 and exports it in every mode (minutes; "
        "tests/test_pretrained_minilm.py); here PREPARE imports and exports the tiny "
        "checkpoint with the same commands, so the lines that read runs/minilm run"
    ),
}

# Appended to a line (argparse: the last value wins), by the command it runs.
FROM_SCRATCH = "--epochs 2 --d-model 16 --num-heads 2 --num-layers 1 --ff-dim 32 --no-augment"
TINY_LENGTH = "--max-length 48"  # the tiny checkpoint has 64 positions
SMALL = {
    "keras-mha-train": FROM_SCRATCH,  # with --from: FINE_TUNE
    "keras-mha-import": TINY_LENGTH,
}
FINE_TUNE = f"--epochs 1 {TINY_LENGTH}"
MODULES = {"keras_mha.train": "keras-mha-train", "keras_mha.pretrained.cli": "keras-mha-import"}

TINY_CHECKPOINT = "checkpoints/tiny-bert"
PLACEHOLDERS = {
    "all-MiniLM-L6-v2": TINY_CHECKPOINT,
    "DIR": TINY_CHECKPOINT,
    "RUN_DIR": "runs/pronouns",
    "RUN": "runs/pronouns",
}
CSV_ROWS = 60  # my.csv: pronoun sentences, 3 classes, 12 held out

# What makes a runs/ folder that README lines read and none writes.
PREPARE = {
    "runs/minilm": [
        ".venv/bin/keras-mha-import DIR --out runs/minilm",
        ".venv/bin/keras-mha-export runs/minilm --out runs/minilm/bundle --quant float32",
    ],
    "runs/pronouns": [".venv/bin/keras-mha-train --dataset pronouns --out runs/pronouns"],
    "runs/digits": [
        ".venv/bin/keras-mha-train --dataset digits --out runs/digits",
        ".venv/bin/keras-mha-export runs/digits --out runs/digits/bundle --quant float32",
    ],
}

ALTERNATIVES = re.compile(r"[\w.-]+(?:\|[\w.-]+)+")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]+")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced ``` block, in order."""
    blocks, info, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"\s*```\s*(\S*)", line)
        if info is None:
            if fence:
                info, body = fence.group(1).lower(), []
        elif fence and not fence.group(1):
            blocks.append((info, "\n".join(body)))
            info = None
        else:
            body.append(line)
    return blocks


def shell_lines(text: str) -> list[str]:
    """Every command of the shell blocks, one per `a|b` alternative, as shell words joined."""
    lines = []
    for info, body in fenced_blocks(text):
        if info not in SHELL_INFO:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if info == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            words = shlex.split(line, comments=True)
            choices = [w.split("|") if ALTERNATIVES.fullmatch(w) else [w] for w in words]
            lines.extend(shlex.join(c) for c in itertools.product(*choices) if c)
    return lines


@dataclasses.dataclass
class Command:
    written: str  # the README's line (one alternative)
    words: list[str]  # as run, the program as written (`program` resolves it)
    inputs: list[str]  # runs/ paths it reads
    outputs: list[str]  # runs/ paths it writes (--out)

    @property
    def shown(self) -> str:
        return shlex.join(self.words)


def tool(words: list[str]) -> str:
    if len(words) >= 3 and words[1] == "-m":
        return MODULES.get(words[2], words[2])
    return pathlib.Path(words[0]).name


def plan(line: str, fresh: itertools.count) -> Command:
    """The command a README line runs here; AssertionError saying why it cannot."""
    words = shlex.split(line)
    program = words[0]
    assert program.startswith((".venv/bin/", ".venv-")), (
        f"{line!r}: no venv program (.venv/bin/..., .venv-edge/bin/python): run it here "
        "or name it in NOT_RUN with the reason"
    )
    operators = SHELL_OPERATORS.intersection(words)
    assert not operators, f"{line!r}: shell operators {sorted(operators)} are not run here"
    run, inputs, outputs = [program], [], []
    for before, word in zip(words, words[1:]):
        if before == "--out" and PLACEHOLDER.fullmatch(word):
            word = f"runs/new-{next(fresh)}"
        elif word in PLACEHOLDERS:
            word = PLACEHOLDERS[word]
        assert not PLACEHOLDER.fullmatch(word), f"{line!r}: give {word} a value in PLACEHOLDERS"
        if word.startswith("runs/"):
            (outputs if before == "--out" else inputs).append(word)
        run.append(word)
    name = tool(words)
    extra = FINE_TUNE if name == "keras-mha-train" and "--from" in words else SMALL.get(name, "")
    return Command(line, run + extra.split(), inputs, outputs)


def within(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f + "/") for f in folders)


def readme_plan() -> tuple[list[Command], list[Command]]:
    """(PREPARE's commands, the README's commands): AssertionError for a line neither
    run nor in NOT_RUN, or a runs/ folder read that nothing makes."""
    lines = shell_lines(README.read_text(encoding="utf-8"))
    assert lines, "README.md has no shell command"
    stale = set(NOT_RUN) - set(lines)
    assert not stale, f"NOT_RUN names lines the README no longer has: {sorted(stale)}"
    fresh = itertools.count(1)
    commands = [plan(line, fresh) for line in lines if line not in NOT_RUN]
    written = [o for c in commands for o in c.outputs]
    prepare: list[Command] = []
    for command in commands:
        for path in command.inputs:
            if within(path, written):
                continue
            folder = next((f for f in PREPARE if within(path, [f])), None)
            assert folder is not None, (
                f"{command.written!r} reads {path}, which no README line writes: add its "
                "commands to PREPARE"
            )
            prepare.extend(plan(line, fresh) for line in PREPARE[folder])
            written.append(folder)
    return prepare, commands


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    # The first example's shapes are what its comments say.
    first = {}
    exec(compile(blocks[0], str(README), "exec"), first)  # noqa: S102
    assert tuple(first["scores"].shape) == (2, 12, 10, 10)
    assert first["mha"].d_k == 64


def test_every_readme_shell_line_is_run_or_named_not_run():
    """The fast half of the slow test below: each line plans (or is in NOT_RUN)."""
    prepare, commands = readme_plan()
    assert commands
    for command in prepare + commands:
        assert command.words[0].startswith((".venv/bin/", ".venv-")), command


def test_shell_lines_expand_alternatives_and_drop_comments():
    text = (
        "```\nmake demo   # a comment\n.venv/bin/x a|b R  # c|d\n```\n"
        "```python\nprint(1)\n```\n"
        "```console\n$ .venv/bin/y 'q # r'\noutput | line\n```\n"
        "```text\n.venv/bin/z\n```\n"
    )
    assert shell_lines(text) == [
        "make demo",
        ".venv/bin/x a R",
        ".venv/bin/x b R",
        ".venv/bin/y 'q # r'",
    ]
    fresh = itertools.count(1)
    command = plan(".venv/bin/keras-mha-heads prune RUN_DIR --out NEW_RUN_DIR", fresh)
    assert command.words[2:] == ["runs/pronouns", "--out", "runs/new-1"]
    assert command.inputs == ["runs/pronouns"] and command.outputs == ["runs/new-1"]
    trained = plan(".venv/bin/keras-mha-train --from all-MiniLM-L6-v2 --out runs/m", fresh)
    assert trained.words[2] == TINY_CHECKPOINT and trained.words[-4:] == FINE_TUNE.split()
    with pytest.raises(AssertionError, match="PLACEHOLDERS"):
        plan(".venv/bin/keras-mha-export BUNDLE", fresh)


def program(word: str) -> str:
    if word == ".venv-edge/bin/python":
        from edge_bundle import edge_python

        return str(edge_python("litert"))
    path = REPO / word
    if not path.exists():
        from environment import missing

        missing(f"{path} (make sets up the venvs)")
    return str(path)


def tail(text: str, lines: int = 25) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


@pytest.mark.slow
def test_readme_shell_commands_run(tmp_path):
    """Every shell line of the README not in NOT_RUN exits 0 (about 5 minutes on 2 cores).

    In README order, except that a line waits for the line that writes what it
    reads (the learner's head view reads the run the edge engineer's lines
    train). A failure is reported with its output's tail; the other lines still
    run, so one run shows every failure.
    """
    from keras_mha.examples import pronoun_rows, write_csv
    from tests.test_pretrained_oracle import TINY, oracle, torch_python

    prepare, commands = readme_plan()
    options = [f"--{k}={v}" for k, v in TINY.items()]
    (tmp_path / TINY_CHECKPOINT).parent.mkdir(parents=True)
    oracle(torch_python(), "tiny", tmp_path / TINY_CHECKPOINT, *options, "--seed", 7)
    write_csv(tmp_path / "my.csv", pronoun_rows(CSV_ROWS))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(REPO)

    def run(command: Command) -> tuple[subprocess.CompletedProcess, float]:
        argv = [program(command.words[0]), *command.words[1:]]
        start = time.monotonic()
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=1200, check=False,
        )  # fmt: skip
        return done, time.monotonic() - start

    timings, failures = [], []
    for command in prepare:
        done, seconds = run(command)
        timings.append((seconds, "(prepare) " + command.shown))
        if done.returncode:
            pytest.fail(
                f"preparing {command.shown}: exit {done.returncode}\n{tail(done.stdout)}",
                pytrace=False,
            )
    pending = list(commands)
    while pending:
        ready = [c for c in pending if all((tmp_path / p).exists() for p in c.inputs)]
        if not ready:
            for command in pending:
                absent = [p for p in command.inputs if not (tmp_path / p).exists()]
                failures.append(f"{command.written}\n  not run: {absent} not written")
            break
        command = ready[0]
        pending.remove(command)
        done, seconds = run(command)
        timings.append((seconds, command.shown))
        if done.returncode:
            failures.append(
                f"{command.written}\n  ran: {command.shown}\n  exit {done.returncode}, "
                f"{seconds:.0f} s:\n{tail(done.stdout)}"
            )
    print("\n".join(f"{s:7.1f} s  {shown}" for s, shown in timings))
    assert not failures, f"{len(failures)} README line(s) failed:\n\n" + "\n\n".join(failures)
