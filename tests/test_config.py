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
    assert c.train.ttt_steps == 4 and c.train.step_weight == 0.8  # the default evaluates k = 4
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
        ({"data": {"inputs": [{"format": "alpaca"}]}}, r"data.inputs\[0\].path: needed for source file"),
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


# --------------------------------------------------------------------------- `snakemake --config`
def _command_line(*entries: str) -> dict:
    """What Snakemake makes of `--config ENTRY...` (its own parser: nested scalars stay strings)."""
    from snakemake.cli import parse_config

    return parse_config(list(entries))


def _with_command_line(*entries: str) -> cfg.Config:
    from snakemake.utils import update_config

    values, cli = _default(), _command_line(*entries)
    update_config(values, cli)  # as Snakemake merges --config over the config files
    return cfg.load_config(values, command_line=cli)


def test_command_line_values_are_typed_by_the_schema():
    c = _with_command_line(
        "train={'epochs': 1, lr: 1e-3, grad_clip: 2, progress: false, max_steps: 7}",
        "data={max_conversations: null, eval_max: 100, inputs: [{path: 'llamafactory:x.json', "
        "format: alpaca}]}",
        "model={aux_layer_ids: [1, 2, 3], model_id: null, trust_remote_code: true}",
        "extract={sglang: {tp_size: 2, mem_fraction_static: .5, attention_backend: ~, "
        "engine_args: {ep_size: 8, dp: true, moe: triton}}}",
        "evaluate={sets: [heldout], baselines: [{name: b1, path: /d/x}], temperature: 0}",
    )
    assert _command_line("train={epochs: 1}") == {"train": {"epochs": "1"}}  # what Snakemake hands over
    assert (c.train.epochs, c.train.lr, c.train.grad_clip, c.train.progress, c.train.max_steps) == (
        1, 1e-3, 2.0, False, 7,
    )  # fmt: skip
    assert (c.data.max_conversations, c.data.eval_max) == (None, 100)
    assert [(i.path, i.format) for i in c.data.inputs] == [("llamafactory:x.json", "alpaca")]
    assert (c.model.aux_layer_ids, c.model.model_id, c.model.trust_remote_code) == ([1, 2, 3], None, True)
    sglang = c.extract.sglang
    assert (sglang.tp_size, sglang.mem_fraction_static, sglang.attention_backend) == (2, 0.5, None)
    assert sglang.engine_args == {"ep_size": 8, "dp": True, "moe": "triton"}
    assert c.evaluate.sets == ["heldout"] and c.evaluate.baselines[0].path == "/d/x"
    assert c.train.warmup_steps == _default()["train"]["warmup_steps"]  # the rest of train is kept


def test_command_line_strings_stay_strings_where_the_schema_wants_one():
    c = _with_command_line("model={source: '123', model_id: 'true'}", "data={inputs: [{path: 'a: b.json'}]}")
    assert (c.model.source, c.model.model_id, c.data.inputs[0].path) == ("123", "true", "a: b.json")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("train={epochs: one}", "train.epochs: expected an integer, got 'one'"),
        ("train={epochs: 1.5}", "train.epochs: expected an integer, got 1.5"),
        ("train={progress: 3}", "train.progress: expected true/false, got 3"),
        ("extract={device: gpu}", "extract.device: 'gpu' is not one of"),
        ("model={aux_layer_ids: [1, x]}", r"model.aux_layer_ids\[1\]: expected an integer, got 'x'"),
        ("train={lrr: 1}", "unknown config key train.lrr"),
    ],
)
def test_bad_command_line_values_are_still_rejected_by_name(entry, message):
    with pytest.raises(cfg.ConfigError, match=message):
        _with_command_line(entry)


def test_config_file_strings_stay_strict_beside_command_line_values():
    """Only values that came from --config are typed: a quoted number in a YAML file is still an error."""
    values = _default()
    values["train"]["epochs"] = "1"  # as a config file with `epochs: "1"` gives it
    cli = _command_line("data={max_conversations: 5}")
    with pytest.raises(cfg.ConfigError, match="train.epochs: expected an integer, got '1'"):
        cfg.load_config(values | {"data": {**values["data"], "max_conversations": "5"}}, command_line=cli)


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
