"""The config schema: defaults load, unknown keys and wrong types are rejected by name, all documented."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
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
        ({"data": {"eval_fraction": 1.5}}, r"data.eval_fraction must be < 1, got 1.5 \(allowed: \(0, 1\)\)"),
        ({"evaluate": {"num_draft_tokens": 4}}, "evaluate.num_draft_tokens: expected a list"),
        ({"evaluate": {"num_draft_tokens": [3, 0]}}, r"evaluate.num_draft_tokens\[1\] must be >= 1, got 0"),
        ({"evaluate": {"num_draft_tokens": []}}, "evaluate.num_draft_tokens is empty"),
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
        (
            {"evaluate": {"sets": ["dev"]}},
            r"evaluate.sets\[0\]: 'dev' is not one of heldout, humaneval "
            r"\(or a mapping \{name, path, format\}\)",
        ),
        (
            {"evaluate": {"sets": [{"name": "mine", "path": "/x.csv", "format": "csv"}]}},
            r"^evaluate.sets\[0\].format: 'csv' is not one of auto, sharegpt, openai, alpaca$",
        ),
        (
            {"evaluate": {"sets": [3]}},
            r"evaluate.sets\[0\]: 3 is not one of heldout, humaneval \(or a mapping",
        ),
        (
            {"evaluate": {"sets": [["heldout"]]}},
            r"evaluate.sets\[0\]: expected one of heldout, humaneval or a",
        ),
        ({"regenerate": {"samples": 2}}, "regenerate.samples > 1 needs regenerate.temperature > 0"),
        ({"regenerate": {"turns": "first"}}, "regenerate.turns: 'first' is not one of"),
        ({"extract": {"writer_threads": 0}}, "extract.writer_threads must be >= 1"),
        ({"sglang": {"mem_fraction_static": 1.0}}, r"sglang.mem_fraction_static must be < 1"),
        (
            {"extract": {"sglang": {"tp_size": 8}}},
            "config key extract.sglang has moved: it is sglang \\(a top-level section",
        ),
        ({"train": {"lr": float("nan")}}, "train.lr: expected a finite number, got nan"),
        ({"model": {"aux_layer_ids": [1, -2]}}, r"model.aux_layer_ids\[1\] must be >= 0"),
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
        "sglang={tp_size: 2, mem_fraction_static: .5, attention_backend: ~, "
        "engine_args: {ep_size: 8, dp: true, moe: triton}}",
        "evaluate={sets: [heldout], baselines: [{name: b1, path: /d/x}], temperature: 0}",
    )
    assert _command_line("train={epochs: 1}") == {"train": {"epochs": "1"}}  # what Snakemake hands over
    assert (c.train.epochs, c.train.lr, c.train.grad_clip, c.train.progress, c.train.max_steps) == (
        1, 1e-3, 2.0, False, 7,
    )  # fmt: skip
    assert (c.data.max_conversations, c.data.eval_max) == (None, 100)
    assert [(i.path, i.format) for i in c.data.inputs] == [("llamafactory:x.json", "alpaca")]
    assert (c.model.aux_layer_ids, c.model.model_id, c.model.trust_remote_code) == ([1, 2, 3], None, True)
    sglang = c.sglang
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
        (cfg.SglangSettings, c.sglang),
    ):
        params = json.loads(json.dumps(dataclasses.asdict(section)))  # nothing but plain values
        assert cfg.stage_settings(cls, params) == section
    with pytest.raises(cfg.ConfigError, match="nproc must be >= 1"):
        cfg.stage_settings(cfg.TrainSettings, dataclasses.asdict(c.train) | {"nproc": 0})


# --------------------------------------------------------------------------- one home for defaults
def _schema_keys(cls: type, prefix: str = ""):
    """(dotted key, field, type hint) of every key of the schema; nested sections walked."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _schema_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, hints[f.name]


def _plain(value):
    """A default as YAML writes it: dataclass items (data.inputs) as mappings, less the fields left at
    their item class's own defaults (the YAML need not spell out `source: file` on every input)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if not dataclasses.is_dataclass(value):
        return value
    own = type(value)()
    return {k: v for k, v in dataclasses.asdict(value).items() if v != getattr(own, k)}


def default_mismatches(yaml_values: dict) -> list[str]:
    """Every schema key whose dataclass default differs from (or is missing in) `yaml_values`."""
    problems = []
    for key, f, _ in _schema_keys(cfg.Config):
        node = yaml_values
        for part in key.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if node is KeyError:
            problems.append(f"{key}: missing in config/config.yaml (dataclass default {_plain(default)!r})")
        elif _plain(default) != node:
            problems.append(f"{key}: dataclass default {_plain(default)!r}, config/config.yaml {node!r}")
    return problems


def test_every_dataclass_default_equals_config_yaml():
    """The schema's defaults are the embedded default job's: `TrainSettings()` in a test or a bench
    trains the recipe `make run` trains (list-valued defaults and nested sections included)."""
    assert default_mismatches(_default()) == []
    assert cfg.load_config_file(DEFAULT) == cfg.Config()


def test_the_defaults_check_sees_a_difference():
    values = _default()
    values["train"]["epochs"] = 7
    values["data"]["inputs"] = values["data"]["inputs"][:1]
    del values["sglang"]["engine_args"]
    assert [p.split(":")[0] for p in default_mismatches(values)] == [
        "data.inputs",
        "train.epochs",
        "sglang.engine_args",
    ]


# --------------------------------------------------------------------------- bounds on every number
def _number_type(hint) -> type | None:
    """int or float when `hint` is a number, a nullable number or a list of numbers."""
    if hint in (int, float):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType, list):
        found = {_number_type(a) for a in typing.get_args(hint)} - {None}
        return found.pop() if len(found) == 1 else None
    return None


NUMERIC_KEYS = [(key, f, hint) for key, f, hint in _schema_keys(cfg.Config) if _number_type(hint)]
ABSURD = {int: 10**15, float: 1e15}
# Numeric keys where 0 is a value with a meaning of its own, not a mistake.
ZERO_ALLOWED = {
    "model.aux_layer_ids": "tap 0 is the output of the first decoder layer",
    "data.seed": "a seed like any other",
    "train.seed": "a seed like any other",
    "evaluate.seed": "a seed like any other",
    "regenerate.seed": "a seed like any other",
    "prompts.seed": "a seed like any other",
    "prompts.chinese_share": "a share: 0 = no conversation steered to Chinese",
    "prompts.tool_share": "a share: 0 = no tool-use conversation",
    "prompts.opener_share": "a share: 0 = the target writes every first turn whole",
    "train.warmup_steps": "0 = none (its docstring)",
    "train.weight_decay": "0 = none (its docstring)",
    "evaluate.temperature": "0 = greedy (its docstring)",
    "regenerate.temperature": "0 = greedy (its docstring)",
}


def _with(key: str, value) -> dict:
    values, (*sections, name) = _default(), key.split(".")
    node = values
    for section in sections:
        node = node[section]
    node[name] = value
    return values


@pytest.mark.parametrize("bad", ["zero", "negative", "nan", "inf", "-inf", "absurd"])
@pytest.mark.parametrize(("key", "f", "hint"), NUMERIC_KEYS, ids=[k for k, _, _ in NUMERIC_KEYS])
def test_every_numeric_key_refuses_nonsense_by_name(key, f, hint, bad):
    """Zero, negative, NaN, infinite and absurdly large values on each numeric key of the schema (a new
    key is covered by being in the dataclasses) are refused naming the key, unless the value has a
    meaning of its own: 0 where ZERO_ALLOWED says why, `bounded(off=...)` where the docstring says."""
    kind = _number_type(hint)
    value = {"zero": 0, "negative": -1, "nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(bad)
    value = ABSURD[kind] if bad == "absurd" else value
    meaningful = (bad == "zero" and key in ZERO_ALLOWED) or value == cfg.field_bounds(f)[4]
    is_list = any(typing.get_origin(h) is list for h in (hint, *typing.get_args(hint)))
    given = [value] if is_list else value
    if meaningful:
        if bad != "zero":  # the off value: its docstring says what it means
            assert f"{value} = " in cfg.field_docs(_owner(key))[f.name]
        cfg.load_config(_with(key, given))
        return
    with pytest.raises(cfg.ConfigError) as refused:
        cfg.load_config(_with(key, given))
    assert str(refused.value).startswith(key), str(refused.value)


def _owner(key: str) -> type:
    """The dataclass that holds `key`."""
    cls = cfg.Config
    for section in key.split(".")[:-1]:
        cls = typing.get_type_hints(cls)[section]
    return cls


def test_every_numeric_key_has_both_bounds():
    unbounded = []
    for key, f, _ in NUMERIC_KEYS:
        ge, gt, lt, le, _off = cfg.field_bounds(f)
        if (ge is None and gt is None) or (lt is None and le is None):
            unbounded.append(key)
    assert not unbounded, f"numeric keys without a lower and an upper bound: {unbounded}"


# --------------------------------------------------------------------------- union-typed keys
def _union_keys():
    """(key, hint) of every union-typed key, list items of a union type as `key[0]`."""
    for key, _, hint in _schema_keys(cfg.Config):
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            yield key, hint
        elif typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            if typing.get_origin(item) in (typing.Union, types.UnionType):
                yield f"{key}[0]", item


UNION_KEYS = list(_union_keys())


@pytest.mark.parametrize("wrong", [{"bogus": 1}, [["x"]], True], ids=["mapping", "nested-list", "bool"])
@pytest.mark.parametrize(("key", "hint"), UNION_KEYS, ids=[k for k, _ in UNION_KEYS])
def test_union_typed_keys_name_the_field_that_is_wrong(key, hint, wrong):
    """A value no option of the union takes is refused naming the key (or the field under it that is
    wrong), never with another option's complaint about the union as a whole."""
    path, index = key.removesuffix("[0]"), key.endswith("[0]")
    with pytest.raises(cfg.ConfigError) as refused:
        cfg.load_config(_with(path, [wrong] if index else wrong))
    message = str(refused.value)
    assert message.startswith(f"{key}") or message.startswith(f"unknown config key {key}."), message


@dataclasses.dataclass
class UnionProbe:
    b: int | typing.Literal["auto"] | None = None


def test_a_union_of_several_scalar_options_names_them_all():
    """A union with two options of one shape (none in the schema today, e.g. `int | "auto"`): a value
    both refuse is refused naming the key and every option; a value either takes is kept."""
    from eyas.core.schema import build

    assert [build(UnionProbe, {"b": v}, "a").b for v in (3, "auto", None)] == [3, "auto", None]
    with pytest.raises(cfg.ConfigError, match="^a.b: expected an integer or one of auto or null, got 'x'$"):
        build(UnionProbe, {"b": "x"}, "a")


def test_extract_compression_choices_are_the_stores():
    """settings.py imports nothing from the store layer, so the choices are written twice; kept equal here."""
    from eyas.store import COMPRESSIONS

    hint = typing.get_type_hints(cfg.ExtractSettings)["compression"]
    assert typing.get_args(hint) == COMPRESSIONS
