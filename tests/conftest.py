"""Shared fixtures (a small trained run directory, made on the fly) and marks.

Every test that requests a fixture of SLOW_FIXTURES, directly or through
another fixture, is marked `slow`, and so is every test marked by hand that
starts a Python child importing TensorFlow, JAX or PyTorch: `make test-fast`
(-m "not slow") trains no run, exports and converts nothing, and starts no
such child but the tiny BERT's reference in the torch venv (the oracle the
import is checked against, one server process for all of them). Goal: at
most 180 s on 2 cores; measured 102 to 153 s on an AMD EPYC (README,
docs/development.md). A test that make test's table also counts on a line of
its own (tests/summary.py's part_of: browser, tflite-runtime, TFLite Micro,
layer tests) carries that line's name as the junit property `part`.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# A shell without job control starts its background commands with SIGINT ignored
# (`.ci/run &` from a script), and an ignored signal stays ignored across exec: the
# children that the Ctrl-C tests interrupt would never see it. A handler is not
# inherited (exec resets it to the default), so Python's own comes back in them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest
from environment import missing
from once import once_per_run
from summary import part_of

REPO = pathlib.Path(__file__).resolve().parents[1]

# The fixtures that train or export a model. A fixture built on one of them
# (bundle_copy, micro_run, ...) needs no entry: pytest's item.fixturenames is
# the whole closure. A test parametrized with a fixture's name that it gets
# with request.getfixturevalue is caught by that name: so digits_bundle.
SLOW_FIXTURES = {
    "digits_run",  # here: make_digits_run, 40 epochs
    "tiny_pronouns",  # test_train_cli.py: a tiny pronouns run, one epoch
    "pronouns_run",  # the default pronouns model, 40 epochs
    "augmented_run",  # here: train(), 3 epochs with shifted copies
    "digits_export",  # edge_fixtures: python -m keras_mha_export on digits_run, every mode
    "digits_bundle",  # edge_fixtures: digits_export's bundle
    "text_bundle",  # edge_fixtures: python -m keras_mha_export on text_run
    "token_files",  # test_export_tokens: fits a token classifier, 10 epochs
    "converted",  # test_export_view_signature: converts every mode, twice
    "tiny_bundle",  # test_pretrained: keras-mha-import + export of the tiny BERT
    "encoder",  # test_debug: the tiny BERT exported in float32 and int8
    "tiny_llama",  # test_decoder: transformers builds a Llama and generates with it
    "smollm2",  # test_decoder: transformers reads SmolLM2's GGUF and generates with it
}


def trains_or_exports(item) -> bool:
    names = set(item.fixturenames)
    callspec = getattr(item, "callspec", None)
    if callspec is not None:  # parameters naming a fixture (request.getfixturevalue)
        names.update(v for v in callspec.params.values() if isinstance(v, str))
    return not SLOW_FIXTURES.isdisjoint(names)


CPU_AT_START = pytest.StashKey[float]()


# The files that take minutes, longest first (make test on an AMD EPYC). pytest-xdist
# (--dist loadfile) deals whole files to its workers in collection order: started
# first, they run beside the many short files instead of leaving one worker alone
# with one of them at the end. A name here that no longer exists fails the fast tier
# (tests/test_harness.py).
LONGEST_FILES = (
    "test_finetune.py",
    "test_pretrained_minilm.py",
    "test_qat_runs.py",
    "test_readme.py",
    "test_edge_hostile.py",
    "test_pretrained.py",
    "test_export_view_signature.py",
    "test_export_verify.py",
)


def longest_first(items) -> None:
    """Sort `items` (pytest's, in place) with LONGEST_FILES' first; otherwise as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


def pytest_collection_modifyitems(config, items):
    longest_first(items)
    for item in items:
        if trains_or_exports(item):
            item.add_marker(pytest.mark.slow)
        part = part_of(item)
        if part is not None:
            item.user_properties.append(("part", part))


def pytest_collection_finish(session):
    """Python's garbage collector set to skip what every test keeps.

    After collection the process holds Keras, its backend and the test modules:
    a million or more objects that live until it ends. Every full collection
    walked all of them: the TFLite converter and the device's scoring call
    gc.collect() once a model (0.2 s each here), and Python's own collections
    ran as often. gc.freeze() moves what exists now out of the collector's
    sight (nothing frozen is garbage: it stays until exit anyway); what tests
    create is collected as before. tests/test_export_verify.py: 63 s to 52 s,
    its gc.collect() calls 16 s to 3.3 s (AMD EPYC). Keras (with its backend) and
    Hypothesis are imported first, where installed: nearly every test process
    imports them, and Hypothesis, imported after a freeze, warns about trio's
    random generator (its check cannot see frozen referrers)."""
    import gc
    import importlib

    for name in ("keras", "hypothesis"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (user + system)."""
    import resource

    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[CPU_AT_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds (setup, call, teardown; with the child processes
    it waited for) as the junit property "cpu": tests/summary.py adds them up
    per file. On 2 cores shared by several processes a test's wall time says
    how busy the machine was; its CPU time says what it costs. A long-lived
    child (tests/oracle/serving.py) counts where it ends."""
    if call.when == "teardown" and CPU_AT_START in item.stash:
        item.user_properties.append(("cpu", f"{_cpu_seconds() - item.stash[CPU_AT_START]:.2f}"))
    yield


def pytest_report_header(config):
    """Where the tests' random examples come from, so a failure can be replayed."""
    profile = os.environ.get("HYPOTHESIS_PROFILE", "test")
    how = {
        "test": "derandomized: the same examples every run (a fixed seed per test)",
        "fuzz": "new examples every run (make fuzz; a failure prints its reproduce blob)",
    }.get(profile, "a profile of your own")
    return f"hypothesis profile {profile!r} (tests/fuzz/test_fuzz_parsers.py): {how}"


def make_digits_run(out: pathlib.Path, epochs: int = 40, seed: int = 0, **config) -> pathlib.Path:
    """Train a small digits classifier and write a run directory (docs/artifacts.md).

    `keras_mha.train.train` with a small model: one encoder block, d_model 16,
    2 heads, ff_dim 32, no dropout, mean pooling; `config` overrides
    ModelConfig fields. Batch 32, no shifted copies, ~10-30 s.

    What it reaches depends on the CPU (training is deterministic on one
    machine only): on AMD EPYC (2 cores) 92.5-97.5 % test accuracy over
    seeds 0-10 (93.6 % for seed 0, the one the tests use), and int8 changes
    0-4 of its 360 predictions (docs/artifacts.md); 96.1 % on the machine
    this fixture was first measured on. Tests that use it assert what holds on any CPU (learning
    far above chance, a mode against the float model of the same run),
    never these figures.
    """
    from keras_mha.train import train

    options = {
        "d_model": 16,
        "num_heads": 2,
        "num_layers": 1,
        "ff_dim": 32,
        "dropout": 0.0,
        "pooling": "mean",
        **config,
    }
    train(
        "digits",
        out,
        epochs=epochs,
        seed=seed,
        batch_size=32,
        shift_augment=False,
        overwrite=True,
        verbose=0,
        **options,
    )
    return out


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> pathlib.Path:
    """A trained digits run directory, made once per test run. Read-only."""
    return (
        once_per_run(tmp_path_factory, "digits_run", lambda d: make_digits_run(d / "run")) / "run"
    )


@pytest.fixture(scope="session")
def pronouns_run(tmp_path_factory) -> pathlib.Path:
    """The default pronouns model, trained as `keras-mha-train --dataset
    pronouns` trains it (all 40 epochs: early stopping off), made once per test
    run: tests/test_train_runs.py checks it, tests/test_qat_runs.py starts its
    per-head QAT from it. Read-only."""
    from keras_mha.train import train

    make = lambda d: train("pronouns", d / "run", patience=40, verbose=0)  # noqa: E731
    return once_per_run(tmp_path_factory, "pronouns_run", make) / "run"


@pytest.fixture(scope="session")
def augmented_run(tmp_path_factory) -> pathlib.Path:
    """A short digits run (3 epochs) with dropout and the shifted copies. Read-only.

    Far from converged on purpose: the fine-tune tests need room to improve.
    """
    from keras_mha.train import train

    def make(folder: pathlib.Path) -> None:
        options = dict(d_model=16, num_heads=2, num_layers=1, ff_dim=32, pooling="mean")
        train(
            "digits",
            folder / "run",
            epochs=3,
            shift_augment=True,
            dropout=0.1,
            verbose=0,
            **options,
        )

    return once_per_run(tmp_path_factory, "augmented_run", make) / "run"


@pytest.fixture
def figure(request):
    """`figure(name, value, bound)`: keep a figure a trained model gave beside the
    bound its test asserts (a junit property); returns `value`.

    make test prints every one after its table (tests/summary.py), so a run on
    any CPU shows how close each came to its bound. docs/trained_figures.md
    lists them with the figures measured on each CPU and why each margin holds.
    """

    def record(name: str, value, bound: str):
        request.node.user_properties.append(("figure", f"{name} = {float(value):.4g} ({bound})"))
        return value

    return record


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only file system (a tmpfs mounted ro; needs root, as CI runs)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]
    try:
        done = subprocess.run(mount, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        missing("the mount command (for a read-only tmpfs)")
    if done.returncode:
        missing(f"a read-only tmpfs mount as root ({done.stderr.strip()})")
    yield ro
    subprocess.run(["umount", str(ro)], check=True)
