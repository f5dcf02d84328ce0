"""The import graph of the device app and the bundle contract: one way, no cycle.

Every module under edge_demo/ and bundle_contract/ is parsed (ast) for every
import it makes: module-level, inside functions and under `if TYPE_CHECKING:`
alike, since a hidden import is still a dependency (issue 20: bundle ->
manifest -> entries -> deployed ⇢ bundle was hidden that way). The layers,
bottom first:

    errors           bundle_contract.errors: standard library only
    contract         bundle_contract: the bundle format; imports errors
    tables           edge_demo.tables: standard library only
    runtimes         edge_demo.runtimes: imports contract, errors
    view             edge_demo.view, the head view page: imports contract, errors
    debug            edge_demo.debug: imports runtimes, contract, tables, errors
    app              edge_demo.app, the command line: may import everything;
                     nothing imports it but __main__

So contract <- library, export, device: bundle_contract imports nothing of
the others, and the device app nothing but it (and numpy and a runtime).
keras_mha (the library) may import from edge_demo only the head view page
(`view.page`, which `keras-mha-heads view` writes too); the exporter only
`runtimes.*`: it verifies a bundle with the device's own code
(`runtimes.score.run_mode`).
"""

from __future__ import annotations

import ast
import configparser
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
EDGE = REPO / "edge_demo"
TOP = "edge_demo"  # the folder's name, installed under it (setup.cfg)
CONTRACT = REPO / "bundle_contract"
CONTRACT_TOP = "bundle_contract"
PACKAGES = {TOP: EDGE, CONTRACT_TOP: CONTRACT}

# layer -> the layers its modules may import ("" is the package's __init__.py).
ALLOWED = {
    "": set(),
    "errors": set(),
    "tables": set(),
    "contract": {"errors", "contract"},
    "runtimes": {"errors", "contract", "runtimes"},
    "view": {"errors", "contract", "view"},
    "debug": {"errors", "tables", "contract", "runtimes", "debug"},
    "app": {"", "errors", "tables", "contract", "runtimes", "view", "debug", "app"},
    "__main__": {"app"},
}
# What each importer outside the device app may import from edge_demo, by
# dotted prefix below the package (bundle_contract: anything).
OUTSIDE = {
    "keras_mha": ("view.page",),
    "export": ("runtimes",),
}
FORBIDDEN_TOP_LEVEL = {"tensorflow", "tf_keras", "keras", "keras_mha", "keras_mha_export", "export"}


def _module_name(path: pathlib.Path, root: pathlib.Path, top: str) -> str:
    parts = [top, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _python_files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


MODULES = {
    _module_name(p, root, top): p for top, root in PACKAGES.items() for p in _python_files(root)
}


def imports_of(
    source: str, module: str, is_package: bool, where: str = "<source>", known=None
) -> list[tuple[int, str, bool]]:
    """Every import in `source`, anywhere in it: (line, absolute module, relative?).

    `from X import name` counts as an import of `X.name` when that is a module
    of edge_demo (a submodule), else of `X`.
    """
    found = []
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, False) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                named = _edge_name(candidate)
                modules = MODULES if known is None else known
                found.append(
                    (node.lineno, candidate if named in modules else target, node.level > 0)
                )
    return found


def _edge_name(name: str) -> str:
    """The edge_demo module a dotted name names (the identity: one name per room)."""
    return name


def layer(module: str) -> str:
    """`bundle_contract.files` -> "contract" (`bundle_contract.errors` -> "errors");
    `edge_demo.runtimes.model` -> "runtimes"; edge_demo's __init__ -> ""."""
    parts = module.split(".")
    if parts[0] == CONTRACT_TOP:
        return "errors" if parts[1:] == ["errors"] else "contract"
    return parts[1] if len(parts) > 1 else ""


def _ours(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


def edge_graph() -> dict[str, dict[str, int]]:
    """module of either package -> {module of either it imports: first line}."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        targets = graph.setdefault(name, {})
        is_package = path.name == "__init__.py"
        for line, target, _ in imports_of(path.read_text(), name, is_package, str(path)):
            target = _edge_name(target)
            if _ours(target):
                while target not in MODULES:  # a name inside a module: the module
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    targets.setdefault(target, line)
    return graph


def find_cycle(graph: dict[str, dict[str, int]] | dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None if it has none."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in zip(cycle, cycle[1:], strict=False)]
    return "import cycle: " + "; ".join(steps)


# --- the tests -------------------------------------------------------------------


def test_the_parser_sees_hidden_imports_and_the_finder_their_cycle():
    """The old cycle, hidden by a function-level and a TYPE_CHECKING import, is found."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ..errors import UsageError\n"
        "if TYPE_CHECKING:\n"
        "    from .runtime import Runtime\n"
        "def content():\n"
        "    from .bundle import read_model\n"
    )
    found = imports_of(source, "edge_demo.contract.deployed", is_package=False)
    assert [target for _, target, _ in found] == [
        "typing",
        "edge_demo.errors",
        "edge_demo.contract.runtime",
        "edge_demo.contract.bundle",
    ]
    old = {"bundle": {"manifest"}, "manifest": {"entries"}, "entries": {"deployed"}}
    assert find_cycle(old) is None
    old["deployed"] = {"bundle"}
    assert find_cycle(old) == ["bundle", "manifest", "entries", "deployed", "bundle"]


def test_the_device_app_and_the_contract_have_no_import_cycle():
    graph = edge_graph()
    assert len(graph) == len(MODULES) > 20
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph)


def test_every_module_is_in_a_layer():
    unknown = sorted(name for name in MODULES if layer(name) not in ALLOWED)
    assert not unknown, f"modules in no layer of ALLOWED (add the layer, or move them): {unknown}"


def test_imports_flow_one_way():
    """Each layer imports only the layers below it; nothing imports the app but __main__."""
    wrong = [
        f"{MODULES[a].relative_to(REPO)}:{line} imports {b}"
        for a, targets in edge_graph().items()
        for b, line in targets.items()
        if layer(b) not in ALLOWED[layer(a)]
    ]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_each_package_imports_itself_relatively_and_never_tensorflow():
    """Relative imports inside a package (a device runs a copy of the folders),
    the contract by its name; no tensorflow, keras or keras_mha anywhere, not even
    inside a function, and nothing of the device app in the contract."""
    wrong = []
    for name, path in MODULES.items():
        is_package = path.name == "__init__.py"
        home = name.split(".")[0]
        for line, target, relative in imports_of(path.read_text(), name, is_package, str(path)):
            top = target.split(".")[0]
            where = f"{path.relative_to(REPO)}:{line}"
            if top == home and not relative:
                wrong.append(f"{where}: absolute import of {target}; use a relative import")
            if top != home and relative:
                wrong.append(f"{where}: relative import of {target} outside its package")
            if top in FORBIDDEN_TOP_LEVEL or (home == CONTRACT_TOP and top == TOP):
                wrong.append(f"{where}: imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_contract_stands_alone():
    """bundle_contract imports nothing of the library, the exporter or the device
    app; the device app imports it and nothing else of the repository."""
    contract = {n for n in MODULES if n.split(".")[0] == CONTRACT_TOP}
    graph = edge_graph()
    assert len(contract) > 15
    outward = [(a, b) for a in contract for b in graph[a] if b.split(".")[0] != CONTRACT_TOP]
    assert not outward, outward
    used = {b for a in graph if a.split(".")[0] == TOP for b in graph[a]}
    assert used & contract, "the device app imports nothing of bundle_contract?"


@pytest.mark.parametrize("importer", sorted(OUTSIDE))
def test_the_library_and_the_exporter_import_only_what_they_may(importer):
    """keras_mha: the head view page; export: the runtimes (bundle_contract: anything)."""
    root = REPO / importer
    top = "keras_mha_export" if importer == "export" else importer
    allowed = OUTSIDE[importer]
    seen, wrong = set(), []
    for path in _python_files(root):
        name = _module_name(path, root, top)
        for line, target, _ in imports_of(path.read_text(), name, path.name == "__init__.py"):
            target = _edge_name(target)
            if target != TOP and not target.startswith(f"{TOP}."):
                continue
            below = target[len(TOP) + 1 :]
            seen.add(below)
            if not any(below == a or below.startswith(f"{a}.") for a in allowed):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {TOP}.{below or ''}")
    assert not wrong, f"{importer} may import only {allowed} from {TOP}:\n" + "\n".join(wrong)
    assert seen, f"{importer} imports nothing from {TOP}: is the test looking right?"


def test_setup_cfg_installs_every_sub_package():
    """A sub-package left out of setup.cfg's `packages` is missing from a wheel."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    packages = set(config["options"]["packages"].split())
    wanted = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert {TOP, CONTRACT_TOP} <= wanted
    library = REPO / "keras_mha"
    wanted |= {
        _module_name(path, library, "keras_mha")
        for path in _python_files(library)
        if path.name == "__init__.py"
    }
    assert {"keras_mha.attention", "keras_mha.qat"} <= wanted
    assert wanted <= packages, (
        f"missing from setup.cfg [options] packages: {sorted(wanted - packages)}"
    )
    folders = {p.parent for p in MODULES.values()}
    assert all((folder / "__init__.py").is_file() for folder in folders)
    scripts = config["options.entry_points"]["console_scripts"]
    (target,) = [
        line.split("=", 1)[1].strip() for line in scripts.split("\n") if "keras-mha-edge" in line
    ]
    module, _, function = target.partition(":")
    assert _edge_name(module) in MODULES, target
    assert f"def {function}(" in MODULES[_edge_name(module)].read_text()


_PATH = re.compile(r"\b(?:edge_demo|bundle_contract)/[\w/]*\w\.py\b")
_DOTTED = re.compile(r"\b(?:edge_demo|bundle_contract)(?:\.\w+)+")


def test_module_paths_named_in_docs_and_docstrings_exist():
    """`edge_demo/x/y.py` and `edge_demo.x.y[.name]` (bundle_contract's too) in docs
    and code name what exists."""
    texts = [*(REPO / "docs").glob("*.md"), REPO / "README.md"]
    texts += [EDGE / "README.md", CONTRACT / "README.md"]
    for folder in (
        "edge_demo",
        "bundle_contract",
        "export",
        "keras_mha",
        "tests",
        "benchmarks",
        ".ci",
    ):
        texts.extend(p for p in _python_files(REPO / folder) if p != pathlib.Path(__file__))
    wrong = []
    for path in texts:
        text = path.read_text(encoding="utf-8")
        for match in _PATH.finditer(text):
            if not (REPO / match.group()).is_file():
                wrong.append(f"{path.relative_to(REPO)}: {match.group()}")
        for match in _DOTTED.finditer(text):
            name = _edge_name(match.group())
            module = name
            while module not in MODULES and "." in module:
                module = module.rsplit(".", 1)[0]
            rest = name[len(module) + 1 :].split(".") if name != module else []
            if not rest or rest[0].startswith("__"):
                continue
            pattern = rf"^(?:def |class |)({re.escape(rest[0])})\b"
            if not re.search(pattern, MODULES[module].read_text(), re.MULTILINE):
                wrong.append(f"{path.relative_to(REPO)}: {match.group()}")
    assert not wrong, "names of modules that do not exist:\n" + "\n".join(sorted(set(wrong)))


def test_each_room_is_imported_by_its_folders_name():
    """A newcomer who greps a folder's name finds its imports: edge_demo/ is
    imported as edge_demo, bundle_contract/ as bundle_contract; export/ as keras_mha_export (a top-level `export`
    would clash with other packages), the one mapping setup.cfg makes and
    export/__init__.py states. No other name for either anywhere."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    mapping = dict(
        line.split("=", 1) for line in config["options"]["package_dir"].split("\n") if "=" in line
    )
    assert {k.strip(): v.strip() for k, v in mapping.items()} == {"keras_mha_export": "export"}
    assert "keras_mha_export" in (REPO / "export" / "__init__.py").read_text()
    old = "keras_mha" + "_edge"  # the former installed name of edge_demo/
    stale = [
        f"{path.relative_to(REPO)}"
        for folder in (
            "keras_mha",
            "export",
            "edge_demo",
            "bundle_contract",
            "tests",
            "benchmarks",
            ".ci",
        )
        for path in (REPO / folder).rglob("*")
        if path.suffix in (".py", ".sh", ".cfg", ".toml", ".md")
        and "__pycache__" not in path.parts
        and old in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert not stale, f"{old} is no longer a name: {stale}"


def test_every_command_is_a_console_script_of_a_cli_module_the_error_policy_names():
    """Every command is a console script whose module is a command line (a `cli`
    module: no main() inside a library module), and errors.py's docstring, the
    policy they share, names each one."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    scripts = dict(
        line.split("=", 1)
        for line in config["options.entry_points"]["console_scripts"].split("\n")
        if "=" in line
    )
    policy = (CONTRACT / "errors.py").read_text().split('"""')[1]
    for name, target in scripts.items():
        module = target.strip().split(":")[0]
        assert module.rsplit(".", 1)[-1] == "cli", (name, module)
        assert name.strip() in " ".join(policy.split()), f"errors.py does not name {name}"
    mains = [
        str(path.relative_to(REPO))
        for folder in ("keras_mha", "export")
        for path in _python_files(REPO / folder)
        if path.name not in ("cli.py", "__main__.py")
        and re.search(r"^def main\(", path.read_text(), re.MULTILINE)
    ]
    assert not mains, f"main() inside library modules: {mains}"


# --- tasks: one object each, looked up by name in the registries alone -----------

# Where a task's name may be written: the contract's tasks (one module each and
# their registry) and the library's table of run readers.
TASK_HOMES = ("bundle_contract/tasks/", "keras_mha/rundir/tasks.py")


def _task_names() -> set[str]:
    """Every registered task's name (the registry: bundle_contract/tasks/registry.py)."""
    from bundle_contract.tasks import TASKS

    return set(TASKS)


TASK_NAMES = _task_names()


def task_branches(source: str, where: str = "<source>") -> list[tuple[int, str]]:
    """The lines of `source` that tell tasks apart by name rather than ask the task:
    a comparison (==, !=, in, is, match case) with a task's name, with the old
    `embedding` flag or `task_of(...)`; `is_encoder(...)` (an encoder told by its
    class name); and a test on an `embedding` flag (`if bundle.embedding`)."""
    found = []

    def names_a_task(node) -> bool:
        return any(
            (isinstance(n, ast.Constant) and n.value in TASK_NAMES)
            or (isinstance(n, ast.Attribute) and n.attr == "embedding")
            or (isinstance(n, ast.Call) and getattr(n.func, "id", None) == "task_of")
            for n in ast.walk(node)
        )

    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Compare) and names_a_task(node):
            found.append((node.lineno, "compares with a task"))
        elif isinstance(node, ast.match_case) and names_a_task(node.pattern):
            found.append((node.pattern.lineno, "matches a task"))
        elif isinstance(node, (ast.If, ast.IfExp, ast.While)) and any(
            isinstance(n, ast.Attribute) and n.attr == "embedding" for n in ast.walk(node.test)
        ):
            found.append((node.lineno, "tests an embedding flag"))
        elif isinstance(node, ast.Call) and "is_encoder" in (
            getattr(node.func, "id", None),
            getattr(node.func, "attr", None),
        ):
            found.append((node.lineno, "tells an encoder by its class"))
    return sorted(set(found))


def test_the_task_branch_finder_sees_the_old_branches():
    old = (
        'if task_of(run) == "embedding":\n    pass\n'
        "x = 8 if loaded.embedding else 32\n"
        'if spec.task == "classification":\n    pass\n'
        "if is_encoder(model):\n    pass\n"
        "match task:\n    case 'embedding':\n        pass\n"
    )
    assert [line for line, _ in task_branches(old)] == [1, 3, 4, 6, 9]
    asked = "x = task.attention_samples\nif bundle.task.search:\n    pass\n"
    assert task_branches(asked) == []


def test_only_the_task_registries_tell_tasks_apart():
    """Commands, export and the device ask the task (bundle_contract/tasks/);
    none tests a task's name. Before the registry 36 lines did (issue 32 counted 33)."""
    wrong = []
    for folder in ("keras_mha", "export", "edge_demo", "bundle_contract", "benchmarks"):
        for path in _python_files(REPO / folder):
            where = str(path.relative_to(REPO))
            if where.startswith(TASK_HOMES):
                continue
            for line, what in task_branches(path.read_text(), where):
                wrong.append(f"{where}:{line} {what}")
    assert not wrong, "ask the task instead (bundle_contract/tasks/):\n" + "\n".join(wrong)


LAYER_MODULES = ("attention/__init__.py", "attention/layer.py", "attention/args.py",
                 "attention/masks.py", "attention/weights.py", "attention/keras_names.py",
                 "attention/recording.py", "layers.py", "qat/points.py")  # fmt: skip


def test_the_layer_imports_nothing_of_the_device_side():
    """The layer (keras_mha's attention, blocks and quantization points) stands
    alone: a Keras user copies it without the device app or the exporter."""
    wrong = []
    for name in LAYER_MODULES:
        path = REPO / "keras_mha" / name
        assert path.is_file(), f"LAYER_MODULES names {name}, which is gone"
        for line, target, _ in imports_of(path.read_text(), f"keras_mha.{path.stem}", False):
            if target.split(".")[0] in {TOP, "keras_mha_export", "export"}:
                wrong.append(f"keras_mha/{name}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_layer_module_is_the_lesson_and_the_api():
    """keras_mha/attention/layer.py defines the layer class and nothing else, and
    none of Keras's private names (attention/keras_names.py holds them)."""
    from keras_mha.attention.keras_names import KerasNames

    tree = ast.parse((REPO / "keras_mha" / "attention" / "layer.py").read_text())
    defined = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    assert [n.name for n in defined] == ["MultiHeadAttention"]
    (layer,) = defined
    names = {
        n.name if isinstance(n, ast.FunctionDef) else t.id
        for n in layer.body
        for t in (n.targets if isinstance(n, ast.Assign) else [n])
        if isinstance(n, ast.FunctionDef) or isinstance(t, ast.Name)
    }
    keras_names = {n for n in vars(KerasNames) if n.startswith("_") and not n.startswith("__")}
    assert len(keras_names) > 15
    assert not names & keras_names, f"Keras's names in layer.py: {sorted(names & keras_names)}"


def test_export_has_no_import_cycle():
    """export/'s modules import one another one way (aeq.py and convert.py once
    imported each other; the schema they share is tflite_schema.py's)."""
    root, top = REPO / "export", "keras_mha_export"
    modules = {_module_name(p, root, top): p for p in _python_files(root)}
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        targets = graph.setdefault(name, {})
        source, package = path.read_text(), path.name == "__init__.py"
        for line, target, _ in imports_of(source, name, package, str(path), known=modules):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target not in (name, top):
                targets.setdefault(target, line)
    assert len(graph) > 10 and "keras_mha_export.aeq" in graph["keras_mha_export.convert"]
    cycle = find_cycle(graph)
    assert cycle is None, _describe(cycle, graph)
