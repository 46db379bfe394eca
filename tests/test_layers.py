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
    {"", "atomic", "logs", "gpus", "provenance", "quant", "layer_ids", "chunk_rows", "config", "model_dir"},
    {"store", "assets"},
    {"target", "capture", "vocab", "model", "sglang_engine"},
    {"data", "extract", "validate"},
    {"train"},
    {"evaluate", "export", "specforge_import", "specforge_export", "specforge_train", "cli"},
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
            found.append(node.module)
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
    bad.write_text("def f():\n    from eyas.evaluate.stage import run_evaluation\n")
    assert [m for m in eyas_imports(bad) if RANK[top(m)] > RANK["train"]] == ["eyas.evaluate.stage"]
