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
        ({"extract": {"writer_threads": 0}}, "extract.writer_threads must be >= 1"),
        (
            {"extract": {"sglang": {"mem_fraction_static": 1.0}}},
            r"extract.sglang.mem_fraction_static must be in \(0, 1\)",
        ),
        (
            {"train": {"draft_vocab_size": 64}},
            "unknown config key train.draft_vocab_size",
        ),  # derived: vocab's
        ({"train": {"threads": 2}}, "unknown config key train.threads"),  # the rule's threads
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
            for candidate in (cfg.DataInput,) if f.name == "inputs" else ():
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


def test_stage_settings_come_back_typed_from_rule_params():
    """Rules pass a section as `dataclasses.asdict`: plain values, which Snakemake's params rerun
    trigger compares (it skips dataclass objects); the script gets the checked dataclass back."""
    import json

    c = cfg.load_config_file(DEFAULT)
    for cls, section in (
        (cfg.TrainSettings, c.train),
        (cfg.ExtractSettings, c.extract),
        (cfg.DataSettings, c.data),
    ):
        params = json.loads(json.dumps(dataclasses.asdict(section)))  # nothing but plain values
        assert cfg.stage_settings(cls, params) == section
    extract = cfg.stage_settings(cfg.ExtractSettings, dataclasses.asdict(c.extract))
    assert isinstance(extract.sglang, cfg.SglangSettings)
    with pytest.raises(cfg.ConfigError, match="nproc must be >= 1"):
        cfg.stage_settings(cfg.TrainSettings, dataclasses.asdict(c.train) | {"nproc": 0})
