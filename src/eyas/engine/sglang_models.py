"""Which of SGLang's model modules an engine's processes import: only those its models need.

Every SGLang scheduler process builds its model registry by importing every module of
`sglang.srt.models` (`import_model_classes`, `srt/models/registry.py` of sglang 0.5.17 and 0.5.23:
255 modules in 0.5.23), whatever model it serves: 2.9 s of a scheduler process's ~37 s start on an
H100 (sglang 0.5.17, SmolLM2; 0.16 s with the needed modules only,
bench/results/engine-start-h100-smollm2.json), paid by every engine a job starts (regeneration's
engines, the served evaluation's two). SGLang skips the modules named in `SGLANG_DISABLED_MODEL_ARCHS`
(comma-separated module names, read by the registry in each engine process), so `only_needed_models`
names there every module that registers none of the architectures the engine's models declare
(`architectures` in their `config.json`, nested ones of a multimodal wrapper included).

Safe by construction: a module is kept when its `EntryClass` names a needed architecture (the class
the registry would register from it), and where some needed architecture is registered by no module
the scan found, nothing is skipped. A user who sets `SGLANG_DISABLED_MODEL_ARCHS` (even to an empty
string: import every module) is left as they set it. Nothing here imports sglang: the package is
located with `importlib.util.find_spec` and its model files are read as text.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("eyas.sglang")

SKIP_ENV = "SGLANG_DISABLED_MODEL_ARCHS"
# SGLang's fallback for an architecture it has no class for, and what `model_impl="transformers"`
# serves (`_normalize_archs`, `srt/models/registry.py`): always kept.
ALWAYS_KEPT = ("transformers",)


def config_architectures(model_dir: str | os.PathLike) -> set[str]:
    """Every `architectures` entry in `model_dir`/config.json, at any depth (a multimodal wrapper
    names its language model's in a nested config); empty where there is no config.json."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return set()
    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            archs = node.get("architectures")
            if isinstance(archs, list):
                found.update(a for a in archs if isinstance(a, str))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(path.read_text()))
    return found


def entry_classes(source: str) -> set[str] | None:
    """The class names a model module's top-level `EntryClass = X` / `= [X, Y]` names (what SGLang's
    registry registers from it); None where the source does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in targets):
            value = node.value
            for item in value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]:
                if isinstance(item, ast.Name):
                    names.add(item.id)
                elif isinstance(item, ast.Attribute):
                    names.add(item.attr)
    return names


def modules_to_skip(models_dir: str | os.PathLike, archs: set[str]) -> list[str] | None:
    """The module names under `models_dir` that register none of `archs`, sorted; None when some
    architecture of `archs` is registered by no module there (then every module must be imported)."""
    if not archs:
        return None
    modules = sorted(p for p in Path(models_dir).glob("*.py") if p.stem != "__init__")
    kept, registered = set(ALWAYS_KEPT), set()
    for path in modules:
        source = path.read_text(errors="replace")
        named = {arch for arch in archs if arch in source}
        if not named:
            continue
        entries = entry_classes(source)
        hits = named if entries is None else named & entries  # unparsable: kept where it names one
        if hits:
            kept.add(path.stem)
            registered |= hits
    if registered != archs:
        return None
    return [p.stem for p in modules if p.stem not in kept]


def sglang_models_dir() -> Path | None:
    """The installed `sglang/srt/models` folder, found without importing sglang; None if absent."""
    spec = importlib.util.find_spec("sglang")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "srt" / "models"
        if path.is_dir():
            return path
    return None


@contextlib.contextmanager
def only_needed_models(model_dirs, extra_archs=()):
    """While an engine starts (its processes are spawned with this environment), SGLang's registry
    imports only the model modules the architectures of `model_dirs` (target, drafter) and
    `extra_archs` need; the variable is restored after. Unchanged where the user set it or where the
    scan cannot tell (see the module doc)."""
    if SKIP_ENV in os.environ:
        yield
        return
    archs = set(extra_archs)
    for model_dir in model_dirs:
        archs |= config_architectures(model_dir)
    models_dir = sglang_models_dir()
    skip = modules_to_skip(models_dir, archs) if models_dir else None
    if skip is None:
        log.info("SGLang imports every model module: no module found for every one of %s", sorted(archs))
        yield
        return
    log.info("SGLang skips the %d model modules that register none of %s", len(skip), sorted(archs))
    os.environ[SKIP_ENV] = ",".join(skip)
    try:
        yield
    finally:
        os.environ.pop(SKIP_ENV, None)
