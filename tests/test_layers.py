"""Imports run down the layers (docs/design.md, module map): a module imports only from its own layer
or the ones below it, so no lower module depends on a higher one. A new module must be placed here."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

# EYAS_LAYERS_SRC: check another tree instead (an older checkout, say)
SRC = Path(os.environ.get("EYAS_LAYERS_SRC") or Path(__file__).parents[1] / "src" / "eyas")
LAYERS = [  # bottom first; an entry is a top-level module or package of eyas ("" = eyas itself)
    {"", "core", "config", "settings"},  # foundations: core helpers and the config schema
    {"store", "assets"},
    {"model", "engine"},
    {"data", "regenerate", "extract", "validate"},  # the stages before training
    {"train"},
    {"evaluate", "export"},
    {"interop"},  # other tools' formats and the `eyas` command line
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def top(module: str) -> str:
    """eyas.train.loss -> train; eyas -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def eyas_imports(path: Path) -> list[str]:
    """Every eyas module `path` imports, at any depth (imports inside functions included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "eyas":
            # `from eyas import target` imports a module, `from eyas import __version__` the package
            found += [f"eyas.{a.name}" if (SRC / f"{a.name}.py").exists() else "eyas" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.startswith("eyas."):
            # `from eyas.train import distributed` imports the module eyas.train.distributed
            package = SRC.joinpath(*node.module.split(".")[1:])
            subs = [f"{node.module}.{a.name}" for a in node.names if (package / f"{a.name}.py").exists()]
            found += subs if len(subs) == len(node.names) else [node.module, *subs]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "eyas"]
    return found


MODULES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_run_down_the_layers(path):
    parts = path.relative_to(SRC).with_suffix("").parts
    own = "" if parts == ("__init__",) else parts[0]
    assert own in RANK, f"{own}: not in a layer of tests/test_layers.py (and docs/design.md)"
    upward = [m for m in eyas_imports(path) if RANK.get(top(m), len(LAYERS)) > RANK[own]]
    assert not upward, f"{path.relative_to(SRC)} imports from a higher layer: {upward}"


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "loss.py"
    bad.write_text("def f():\n    from eyas.evaluate.stage_merge import run_evaluation\n")
    assert [m for m in eyas_imports(bad) if RANK[top(m)] > RANK["train"]] == ["eyas.evaluate.stage_merge"]


def module_name(path: Path) -> str:
    """src/eyas/train/loss.py -> eyas.train.loss; src/eyas/store/__init__.py -> eyas.store."""
    parts = ("eyas", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the eyas modules it imports (at any depth), modules of one package included."""
    names = {module_name(p) for p in MODULES}
    graph = {}
    for path in MODULES:
        # `from eyas.store import x` imports the package eyas.store (its face), not the module behind it
        graph[module_name(path)] = {m for m in eyas_imports(path) if m in names} - {module_name(path)}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as [a, b, ..., a], or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle_between_modules():
    """Ranks order packages; inside a package the modules must not import each other in a circle either
    (a circle means two modules share one idea: give it a home of its own)."""
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_the_check_sees_a_circle():
    graph = {"eyas.a": {"eyas.b"}, "eyas.b": {"eyas.c"}, "eyas.c": {"eyas.a"}, "eyas.d": set()}
    assert find_cycle(graph) == ["eyas.a", "eyas.b", "eyas.c", "eyas.a"]
    assert find_cycle({"eyas.a": {"eyas.b"}, "eyas.b": set()}) is None


# The only modules that import sglang (docs/design.md), each only inside functions, so the rest of eyas
# imports without it.
SGLANG_IMPORTERS = {
    "engine/sglang.py",
    "engine/sglang_args.py",
    "engine/sglang_draft_swap.py",
    "extract/sglang_backend.py",
    "extract/sglang_capture.py",
}


def sglang_imports(tree: ast.Module) -> tuple[list[ast.stmt], list[int]]:
    """Every `import sglang...` / `from sglang... import` statement of a module, at any depth, and the
    lines of those outside any function (imported when the module is)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sglang" for a in node.names):
            found.append(node)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "sglang":
            found.append(node)
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    lazy = {id(n) for f in ast.walk(tree) if isinstance(f, functions) for n in ast.walk(f)}
    return found, [node.lineno for node in found if id(node) not in lazy]


def test_only_the_sglang_modules_import_sglang_and_lazily():
    importers = set()
    for path in MODULES:
        found, at_top = sglang_imports(ast.parse(path.read_text()))
        importers |= {str(path.relative_to(SRC))} if found else set()
        assert not at_top, f"{path.relative_to(SRC)}: sglang imported at module level, line {at_top}"
    assert importers == SGLANG_IMPORTERS


def test_the_check_sees_an_eager_sglang_import():
    source = "try:\n    import sglang.srt\nexcept ImportError:\n    pass\ndef f():\n    from sglang import x"
    found, at_top = sglang_imports(ast.parse(source))
    assert (len(found), at_top) == (2, [2])
