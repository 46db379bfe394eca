"""`eyas.engine.sglang_models` against the real registry of the installed sglang: with the skip list
eyas sets while an engine starts, a fresh process's `ModelRegistry` (the one a scheduler process
builds) still resolves every architecture the engine needs, and imports a handful of modules only."""

import json
import os
import subprocess
import sys

import pytest

from eyas.engine.sglang_draft_swap import EAGLE3_DRAFT_ARCHS
from eyas.engine.sglang_models import SKIP_ENV, only_needed_models

REGISTRY = (
    "import json, sys\n"
    "from sglang.srt.models.registry import ModelRegistry\n"
    "print(json.dumps({arch: cls.__module__ for arch, cls in ModelRegistry.models.items()}))\n"
)
CASES = {
    # the recipe's target, and the served engine's drafters (either may be selected in place)
    "llama-served": ({"architectures": ["LlamaForCausalLM"]}, EAGLE3_DRAFT_ARCHS),
    # issue 28's wrapped target: the wrapper and its language model, named in a nested config
    "kimi-wrapped": (
        {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {"architectures": ["DeepseekV3ForCausalLM"]},
        },
        (),
    ),
}


def registry_in_a_fresh_process() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", REGISTRY], env=dict(os.environ), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_registry_of_an_engine_process_resolves_what_the_engine_needs(case, tmp_path, monkeypatch):
    config, extra = CASES[case]
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.delenv(SKIP_ENV, raising=False)
    with only_needed_models([tmp_path], extra):
        assert os.environ.get(SKIP_ENV), "the scan found a module for every architecture"
        registry = registry_in_a_fresh_process()
    nested = config.get("text_config", {}).get("architectures", [])
    needed = set(extra) | {config["architectures"][0], *nested}
    assert needed <= set(registry), f"unresolved: {sorted(needed - set(registry))}"
    modules = set(registry.values())
    assert len(modules) <= 6, f"imported {sorted(modules)}"  # of the 250-odd the full registry imports
