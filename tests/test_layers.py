"""The library's imports, drawn from its source: no circle among klear_lib's modules (imports at module level and
inside functions alike), and nothing in klear_lib imports the command line (``klear_lib.cli`` sits on top)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "klear_lib"
TOP = "klear_lib.cli"


def module_files(package: pathlib.Path) -> dict[str, pathlib.Path]:
    """``{"klear_lib.train.rl": path, "klear_lib": path/__init__.py, ...}``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imported_modules(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The klear_lib modules that ``name`` imports anywhere in its source (functions included). ``from a import b``
    counts as ``a.b`` when that is a module, else as ``a``; relative imports are resolved against the package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return {m for m in found if m in known and m != name}


def import_graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    files = module_files(package)
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted: a module in one can reach itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_reader_sees_circles_and_imports_inside_functions(tmp_path):
    """The reader on a package made for it: a circle closed by an import inside a function, a relative import."""
    pkg = tmp_path / "klear_lib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from klear_lib import b\n")
    (pkg / "b.py").write_text("def f():\n    from klear_lib.sub import c\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\nimport os\n")
    (pkg / "d.py").write_text("from klear_lib.sub.c import thing\n")
    graph = import_graph(pkg)
    assert graph["klear_lib.sub.c"] == {"klear_lib.a"} and graph["klear_lib.d"] == {"klear_lib.sub.c"}
    assert circles(graph) == [["klear_lib.a", "klear_lib.b", "klear_lib.sub.c"]]
    (pkg / "b.py").write_text("import os\n")
    assert circles(import_graph(pkg)) == []


def test_no_circle_in_klear_lib():
    graph = import_graph()
    assert len(graph) > 40 and "klear_lib.runner" in graph["klear_lib.cli"]  # the reader saw the package
    assert circles(graph) == []


@pytest.mark.parametrize("layer, below", [
    ("klear_lib.presets", set()),  # parameters and presets: imports nothing of klear_lib
    ("klear_lib.runs", set()),  # the run-directory contract
])
def test_the_lowest_layers_import_nothing_of_klear_lib(layer, below):
    assert import_graph()[layer] - {"klear_lib"} == below


def test_nothing_in_the_library_imports_the_command_line():
    graph = import_graph()
    assert sorted(name for name, imported in graph.items() if TOP in imported) == []


# The core: the algorithms, their configs and the run-directory contract. It must work without the trainers, the
# executor, the notebooks' helpers, the report or the command line (a verl or TRL user imports it alone).
CORE = ("klear_lib.losses", "klear_lib.advantages", "klear_lib.logprobs", "klear_lib.recipe", "klear_lib.config",
        "klear_lib.runs", "klear_lib.presets", "klear_lib.claims", "klear_lib.glossary", "klear_lib.models",
        "klear_lib.cache", "klear_lib.data.tasks", "klear_lib.data.selection", "klear_lib.evaluation.metrics")
UPPER = ("klear_lib.train", "klear_lib.experiment", "klear_lib.runner", "klear_lib.notebook", "klear_lib.report",
         "klear_lib.cli", "klear_lib.lab", "klear_lib.integrations")


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


@pytest.mark.parametrize("module", CORE)
def test_the_core_reaches_no_upper_layer(module):
    """Transitively: ``config`` once reached the trainers' package through ``train.tracking`` (``check_tracker``)."""
    graph = import_graph()
    assert sorted(m for m in reachable(graph, module) if m.startswith(UPPER)) == []
