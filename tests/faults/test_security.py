"""Security: no pickle loading, no remote code unless the user sets it, no path out of results/.

Static checks over the whole tree (src, scripts, bench, tests): an AST scan, so comments and strings
do not count and aliases of `torch.load` are still calls of `.load` on `torch`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from eyas.config import ASSET_NAME_PATTERN, ModelSettings, load_config_file

REPO = Path(__file__).parents[2]
PY_FILES = sorted(p for d in ("src", "scripts", "bench", "tests") for p in (REPO / d).rglob("*.py"))
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "joblib", "cloudpickle", "shelve", "marshal"}
HOSTILE = [
    "..",
    "../x",
    "../../etc/passwd",
    "/etc/passwd",
    ".hidden",
    "a/b",
    "train/../../x",
    "",
    "x\n",
    "00001/..",
]


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _scan(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any((n or "").split(".")[0] in PICKLE_MODULES for n in names):
                found.append(f"{path}:{node.lineno}: imports a pickle-family module")
        if isinstance(node, ast.FunctionDef):  # def f(..., trust_remote_code=True)
            args = node.args.args[-len(node.args.defaults) :] if node.args.defaults else []
            for arg, default in [
                *zip(args, node.args.defaults, strict=False),  # defaults may span posonly args
                *zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True),
            ]:
                if arg.arg == "trust_remote_code" and _is_true(default):
                    found.append(f"{path}:{node.lineno}: trust_remote_code defaults to True")
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "trust_remote_code":
            if _is_true(node.value):
                found.append(f"{path}:{node.lineno}: trust_remote_code field defaults to True")
    for call in _calls(tree):
        keywords = {k.arg: k.value for k in call.keywords}
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
        if owner == "torch" and name == "load" and not _is_true(keywords.get("weights_only")):
            found.append(f"{path}:{call.lineno}: torch.load without weights_only=True")
        if name == "load" and owner in ("np", "numpy") and _is_true(keywords.get("allow_pickle")):
            found.append(f"{path}:{call.lineno}: np.load(allow_pickle=True)")
        if name == "read_pickle" or (owner == "jit" and name == "load"):
            found.append(f"{path}:{call.lineno}: {name} loads pickled code/data")
        if _is_true(keywords.get("trust_remote_code")):
            found.append(f"{path}:{call.lineno}: trust_remote_code=True hard-coded")
    return found


def test_scanner_catches_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nimport torch\ntorch.load('x')\ntorch.load('x', weights_only=False)\n"
        "f(trust_remote_code=True)\ndef g(trust_remote_code=True): pass\nnp.load('x', allow_pickle=True)\n"
    )
    assert len(_scan(bad)) == 6
    good = tmp_path / "good.py"
    good.write_text("import torch\ntorch.load('x', weights_only=True)\nf(trust_remote_code=flag)\n")
    assert _scan(good) == []


def test_no_pickle_loading_and_no_remote_code_by_default(ledger):
    assert len(PY_FILES) > 40
    with ledger.case("bad_input", "static scan: pickle / torch.load / trust_remote_code", "none found"):
        problems = [p for path in PY_FILES for p in _scan(path)]
        assert problems == [], "\n".join(problems)
        assert ModelSettings().trust_remote_code is False
        default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
        assert default["model"]["trust_remote_code"] is False


def _constraints() -> dict[str, str]:
    """The `wildcard_constraints:` block of rules/common.smk, its values evaluated."""
    text = (REPO / "rules" / "common.smk").read_text()
    block = text.split("wildcard_constraints:", 1)[1].split("\n\n", 1)[0]
    # the names the values use: the asset pattern, and the default config (the `set` constraint is its sets)
    scope = {
        "ASSET_NAME_PATTERN": ASSET_NAME_PATTERN,
        "EYAS": load_config_file(REPO / "config" / "config.yaml"),
    }
    return {
        m.group(1): eval(m.group(2), {}, scope)  # noqa: S307 (our own rule file: string literals, two names)
        for m in re.finditer(r"^\s+(\w+)=(.+?),\s*(#.*)?$", block, re.M)
    }


def test_every_rule_wildcard_is_constrained_and_outputs_stay_in_results():
    constraints = _constraints()
    assert set(constraints) >= {"split", "shard", "name"}
    for rules in (REPO / "rules").glob("*.smk"):
        if rules.name == "common.smk":  # python helpers with f-strings, no rules
            continue
        text = rules.read_text()
        for wildcard in set(re.findall(r'"[^"\n]*\{(\w+)\}[^"\n]*"', text)):
            assert wildcard in constraints, f"{rules.name}: wildcard {{{wildcard}}} has no constraint"
        for block in re.findall(r"^    output:\n((?:        .+\n)+)", text, re.M):
            # report(path, caption="../report/x.rst", category=...): the caption is an input, not an output
            block = re.sub(r'\b(caption|category)="[^"]*"', "", block)
            for path in re.findall(r'"([^"]+)"', block):
                assert path.startswith("results/") and ".." not in path, f"{rules.name}: output {path}"


@pytest.mark.parametrize("value", HOSTILE)
def test_wildcard_constraints_refuse_paths_that_climb_out(value, ledger):
    with ledger.case("bad_input", f"wildcard value {value!r}", "no constraint matches it"):
        for name, pattern in _constraints().items():
            assert not re.fullmatch(pattern, value), f"{name}={pattern!r} accepts {value!r}"
    assert re.fullmatch(_constraints()["name"], "glaive_toolcall_en_demo.json")
