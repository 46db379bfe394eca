"""eyas.engine.sglang_models: which of SGLang's model modules an engine imports, on a stand-in models
folder (the real registry is tests/sglang/test_model_modules.py)."""

import json
import os

import pytest

from eyas.engine import sglang_models
from eyas.engine.sglang_models import (
    SKIP_ENV,
    config_architectures,
    entry_classes,
    modules_to_skip,
    only_needed_models,
)

MODULES = {
    "__init__": "",
    "llama": "class LlamaForCausalLM:\n    pass\nclass Phi3ForCausalLM(LlamaForCausalLM):\n    pass\n"
    "EntryClass = [LlamaForCausalLM, Phi3ForCausalLM]\n",
    # names the architecture (a subclass) but registers only its own class
    "mistral": "from sglang.srt.models.llama import LlamaForCausalLM\n"
    "class MistralForCausalLM(LlamaForCausalLM):\n    pass\nEntryClass = MistralForCausalLM\n",
    "llama_eagle3": "import x\nclass LlamaForCausalLMEagle3:\n    pass\n"
    "EntryClass = [x.LlamaForCausalLMEagle3]\n",
    "qwen2": "class Qwen2ForCausalLM:\n    pass\nEntryClass = Qwen2ForCausalLM\n",
    "transformers": "class TransformersForCausalLM:\n    pass\nEntryClass = TransformersForCausalLM\n",
    "helpers": "def rope():\n    return 0\n",
}


@pytest.fixture
def models_dir(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    for name, source in MODULES.items():
        (folder / f"{name}.py").write_text(source)
    return folder


def test_only_the_modules_that_register_the_architectures_are_imported(models_dir):
    skip = modules_to_skip(models_dir, {"LlamaForCausalLM"})
    # llama registers it; transformers is SGLang's fallback, always kept; mistral only subclasses it
    assert skip == ["helpers", "llama_eagle3", "mistral", "qwen2"]
    both = modules_to_skip(models_dir, {"LlamaForCausalLM", "LlamaForCausalLMEagle3"})
    assert both == ["helpers", "mistral", "qwen2"]


def test_an_architecture_no_module_registers_imports_every_module(models_dir):
    assert modules_to_skip(models_dir, {"LlamaForCausalLM", "GemmaForCausalLM"}) is None
    assert modules_to_skip(models_dir, set()) is None


def test_a_module_that_does_not_parse_is_kept_where_it_names_the_architecture(models_dir):
    (models_dir / "newer.py").write_text("match x:\n  case LlamaForCausalLM(:\n")
    assert entry_classes((models_dir / "newer.py").read_text()) is None
    assert "newer" not in modules_to_skip(models_dir, {"LlamaForCausalLM"})


def test_entry_classes_reads_names_and_attributes():
    assert entry_classes("EntryClass = [A, m.B]\nOther = C\n") == {"A", "B"}
    assert entry_classes("x = 1\n") == set()


def test_nested_architectures_of_a_wrapper_are_found(tmp_path):
    config = {"architectures": ["KimiK25ForConditionalGeneration"],
              "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 8}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert config_architectures(tmp_path) == {"KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"}
    assert config_architectures(tmp_path / "absent") == set()


@pytest.fixture
def target(tmp_path, models_dir, monkeypatch):
    monkeypatch.setattr(sglang_models, "sglang_models_dir", lambda: models_dir)
    monkeypatch.delenv(SKIP_ENV, raising=False)
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return folder


def test_the_skip_list_is_set_while_the_engine_starts_and_removed_after(target):
    with only_needed_models([target], ["LlamaForCausalLMEagle3"]):
        assert os.environ[SKIP_ENV] == "helpers,mistral,qwen2"
    assert SKIP_ENV not in os.environ


def test_the_users_own_setting_is_left_as_it_is(target, monkeypatch):
    monkeypatch.setenv(SKIP_ENV, "")  # the user's way to import every module
    with only_needed_models([target]):
        assert os.environ[SKIP_ENV] == ""
    assert os.environ[SKIP_ENV] == ""


def test_an_unknown_architecture_leaves_the_registry_whole(target):
    with only_needed_models([target], ["GemmaForCausalLM"]):
        assert SKIP_ENV not in os.environ
