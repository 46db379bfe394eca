"""The config schema: defaults load, unknown keys and wrong types are rejected by name, all documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from eyas import config as cfg

DEFAULT = Path(__file__).parents[1] / "config" / "config.yaml"


def _default() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_default_config_loads():
    c = cfg.load_config_file(DEFAULT)
    assert c.model.source == cfg.DEFAULT_MODEL_SOURCE
    assert c.train.ttt_steps == 7 and c.train.step_weight == 0.8
    assert c.train.draft_vocab_size == c.vocab.draft_vocab_size
    assert [i.format for i in c.data.inputs] == ["alpaca", "sharegpt"]


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"train": {"lrr": 1}}, "unknown config key train.lrr"),
        ({"bogus": 1}, "unknown config key bogus"),
        ({"train": {"lr": "fast"}}, "train.lr: expected a number"),
        ({"train": {"epochs": 1.5}}, "train.epochs: expected an integer"),
        ({"train": {"progress": "yes"}}, "train.progress: expected true/false"),
        ({"extract": {"device": "tpu"}}, "extract.device: 'tpu' is not one of"),
        ({"data": {"inputs": [{"path": 3}]}}, r"data.inputs\[0\].path: expected a string"),
        ({"data": {"inputs": [{"format": "alpaca"}]}}, "missing required key path"),
        ({"tokenize": {"train_shards": 0}}, "tokenize.train_shards must be >= 1"),
        ({"data": {"eval_fraction": 1.5}}, "data.eval_fraction must be in"),
        ({"evaluate": {"num_draft_tokens": 4}}, "evaluate.num_draft_tokens: expected a list"),
        ({"evaluate": {"num_draft_tokens": [3, 0]}}, "evaluate.num_draft_tokens: a non-empty list of k >= 1"),
        ({"evaluate": {"num_draft_tokens": [3, 3]}}, "evaluate.num_draft_tokens: each k once"),
        ({"evaluate": {"backend": "vllm"}}, "evaluate.backend: 'vllm' is not one of"),
        ({"evaluate": {"backend": "sglang", "temperature": 0.5}}, "measures greedy serving"),
        ({"evaluate": {"concurrency": 0}}, "evaluate.concurrency must be >= 1"),
        ({"evaluate": {"sets": [{"name": "heldout", "path": "/x.json"}]}}, r"evaluate.sets\[0\].name"),
        ({"evaluate": {"sets": [{"name": "a/b", "path": "/x.json"}]}}, r"evaluate.sets\[0\].name"),
        (
            {"evaluate": {"sets": [{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}]}},
            "names must be unique",
        ),
        ({"evaluate": {"sets": ["dev"]}}, r"evaluate.sets\[0\]"),
        ({"regenerate": {"samples": 2}}, "regenerate.samples > 1 needs regenerate.temperature > 0"),
        ({"regenerate": {"turns": "first"}}, "regenerate.turns: 'first' is not one of"),
    ],
)
def test_bad_values_are_rejected_by_name(patch, message):
    values = _default()
    for section, value in patch.items():
        if isinstance(value, dict) and isinstance(values.get(section), dict):
            values[section] = {**values[section], **value}
        else:
            values[section] = value
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.load_config(values)


def test_bad_yaml_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train: {lr: [\n")
    with pytest.raises(cfg.ConfigError, match="c.yaml: not valid YAML"):
        cfg.load_config_file(path)


def _settings_classes():
    seen, todo = [], [cfg.Config]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        for f in dataclasses.fields(cls):
            extra = {
                "inputs": (cfg.DataInput,),
                "sets": (cfg.PromptFileSet,),
                "baselines": (cfg.BaselineDrafter,),
            }
            for candidate in extra.get(f.name, ()):
                todo.append(candidate)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(default):
                todo.append(type(default))
    return seen


@pytest.mark.parametrize(
    "cls", [c for c in _settings_classes() if c is not cfg.Config], ids=lambda c: c.__name__
)
def test_every_key_is_documented(cls):
    docs = cfg.field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert not missing, f"{cls.__name__}: undocumented keys {missing}"


def test_config_yaml_sets_only_known_keys_and_covers_every_section():
    values = _default()
    assert set(values) == {f.name for f in dataclasses.fields(cfg.Config)}


def test_evaluation_prompt_files_and_k_sweep_load():
    values = _default()
    values["evaluate"] = values["evaluate"] | {
        "backend": "both",
        "num_draft_tokens": [3, 5],
        "sets": ["heldout", {"name": "chats", "path": "/data/chats.jsonl", "format": "sharegpt"}],
    }
    c = cfg.load_config(values)
    assert c.evaluate.set_names == ["heldout", "chats"] and c.evaluate.sets[1].format == "sharegpt"
    assert c.evaluate.num_draft_tokens == [3, 5] and c.evaluate.concurrency == 8
