"""The one config schema: typed dataclasses, documented fields, unknown keys rejected.

The face of the schema: `Config` assembles the sections of `eyas.settings` (one dataclass per section
of `config/config.yaml`, where each key's default, meaning and bounds are stated) and checks what
spans several of them; `load_config(dict)` is what the Snakefile calls, `load_config_file` reads a YAML
file, `stage_settings` rebuilds a rule's section, `local_paths` / `check_local_paths` refuse missing
inputs. The checks themselves are `eyas.core.schema`'s; errors name the key. Import the settings
classes from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eyas.core.schema import ConfigError, build, field_bounds, field_docs, from_command_line, overlay
from eyas.settings import (
    DEFAULT_MODEL_SOURCE,
    BaselineDrafter,
    DataInput,
    DataSettings,
    EvaluateSettings,
    ExportSettings,
    ExtractSettings,
    ModelSettings,
    PromptFileSet,
    PromptSettings,
    RegenerateEngineSettings,
    RegenerateSettings,
    SglangSettings,
    TokenizeSettings,
    TrainSettings,
    VocabSettings,
)

__all__ = [  # the face: what stages, rules, scripts and tests import from eyas.config
    "ASSET_NAME_PATTERN",
    "DEFAULT_MODEL_SOURCE",
    "LLAMAFACTORY_PREFIX",
    "BaselineDrafter",
    "Config",
    "ConfigError",
    "DataInput",
    "DataSettings",
    "EvaluateSettings",
    "ExportSettings",
    "ExtractSettings",
    "ModelSettings",
    "PromptFileSet",
    "PromptSettings",
    "RegenerateEngineSettings",
    "RegenerateSettings",
    "SglangSettings",
    "TokenizeSettings",
    "TrainSettings",
    "VocabSettings",
    "check_local_paths",
    "field_bounds",
    "field_docs",
    "load_config",
    "load_config_file",
    "local_paths",
    "stage_settings",
]

LLAMAFACTORY_PREFIX = "llamafactory:"  # data path prefix: a file of the llamafactory sdist's data/ folder
# A fetched file's name becomes the `name` wildcard of results/assets/data/{name} (rules/common.smk uses
# this pattern as its constraint): no path separator and no leading dot, so no `..` can climb out.
ASSET_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"


@dataclass
class Config:
    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    tokenize: TokenizeSettings = field(default_factory=TokenizeSettings)
    vocab: VocabSettings = field(default_factory=VocabSettings)
    extract: ExtractSettings = field(default_factory=ExtractSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    regenerate: RegenerateSettings = field(default_factory=RegenerateSettings)
    prompts: PromptSettings = field(default_factory=PromptSettings)
    export: ExportSettings = field(default_factory=ExportSettings)
    sglang: SglangSettings = field(default_factory=SglangSettings)

    def __post_init__(self):
        if self.extract.backend == "sglang" and self.extract.device == "cpu":
            raise ConfigError("extract.backend sglang runs on GPUs: set extract.device to cuda (or auto)")
        self._check_evaluate()
        if self.regenerate.samples > 1 and self.regenerate.temperature == 0:
            raise ConfigError(
                "regenerate.samples > 1 needs regenerate.temperature > 0 (greedy repeats itself)"
            )
        names = [b.name for b in self.evaluate.baselines]
        reserved = {"trained", "untrained"}
        if len(set(names)) != len(names) or reserved & set(names):
            raise ConfigError(f"evaluate.baselines: names must be unique and not {sorted(reserved)}: {names}")
        if not self.data.inputs:
            raise ConfigError("data.inputs is empty: name at least one prompt file")
        self._check_inputs()

    def _check_inputs(self) -> None:
        paths = [(f"prompts.tool_files[{i}]", p) for i, p in enumerate(self.prompts.tool_files)]
        targets = [i for i, item in enumerate(self.data.inputs) if item.source == "target"]
        for i, item in enumerate(self.data.inputs):
            if (item.source == "file") != (item.path is not None):
                raise ConfigError(f"data.inputs[{i}].path: needed for source file, none for source target")
            if item.path is not None:
                paths.append((f"data.inputs[{i}].path", item.path))
        for key, path in paths:
            name = path.removeprefix(LLAMAFACTORY_PREFIX)
            if path.startswith(LLAMAFACTORY_PREFIX) and not re.fullmatch(ASSET_NAME_PATTERN, name):
                raise ConfigError(
                    f"{key}: {name!r} is not a file name of the llamafactory data folder "
                    f"(allowed: {ASSET_NAME_PATTERN})"
                )
        if len(targets) > 1:
            raise ConfigError(f"data.inputs: source target given {len(targets)} times (at most once)")
        if targets and not self.regenerate.enabled:
            raise ConfigError(
                f"data.inputs[{targets[0]}]: source target writes user turns only; their answers come "
                "from the regenerate stage: set regenerate.enabled true"
            )
        if targets and self.prompts.tool_share > 0 and not self.prompts.tool_files:
            raise ConfigError("prompts.tool_share > 0 needs prompts.tool_files")

    def _check_evaluate(self) -> None:
        ev = self.evaluate
        if not ev.sets:
            raise ConfigError("evaluate.sets is empty: name heldout, humaneval or a prompt file")
        names = ev.set_names
        for i, item in enumerate(ev.sets):
            if isinstance(item, PromptFileSet) and (
                item.name in ("heldout", "humaneval") or not re.fullmatch(ASSET_NAME_PATTERN, item.name)
            ):
                raise ConfigError(
                    f"evaluate.sets[{i}].name: {item.name!r} must match {ASSET_NAME_PATTERN} and not be "
                    "heldout or humaneval"
                )
        if len(set(names)) != len(names):
            raise ConfigError(f"evaluate.sets: names must be unique, got {names}")
        if not ev.num_draft_tokens:
            raise ConfigError("evaluate.num_draft_tokens is empty: name at least one k >= 1")
        if len(set(ev.num_draft_tokens)) != len(ev.num_draft_tokens):
            raise ConfigError(f"evaluate.num_draft_tokens: each k once, got {ev.num_draft_tokens}")
        if ev.backend != "hf" and ev.temperature != 0:
            raise ConfigError("evaluate.backend sglang measures greedy serving: set evaluate.temperature 0")

    @property
    def model_id(self) -> str:
        return self.model.model_id or self.model.source


# --------------------------------------------------------------------------- loading
# Keys that moved: the old spelling is refused with the new one named (a user's own config file
# still has it).
MOVED_KEYS = {
    "extract.sglang": "sglang (a top-level section now: the one SGLang engine configuration of "
    "extraction, regeneration and served evaluation; move the block out of `extract:`)",
}


def _refuse_moved_keys(values: dict) -> None:
    for old, new in MOVED_KEYS.items():
        node: Any = values
        for part in old.split("."):
            node = node.get(part, MOVED_KEYS) if isinstance(node, dict) else MOVED_KEYS
        if node is not MOVED_KEYS:
            raise ConfigError(f"config key {old} has moved: it is {new}")


def load_config(values: dict, command_line: dict | None = None) -> Config:
    """Validate a config mapping (as Snakemake's `config`) into a `Config`; errors name the key.

    `command_line` is the part of `values` that came from `snakemake --config` (Snakemake's
    `workflow.config_settings.config`): its strings are typed by the schema first (see above)."""
    if command_line:
        values = overlay(values, from_command_line(dict(command_line), Config))
    _refuse_moved_keys(values or {})
    return build(Config, values, "")


# --------------------------------------------------------------------------- local paths
HUB_ID_PATTERN = r"[\w.\-]+/[\w.\-]+"  # `org/name`: what a user who meant a hub repo id writes


def local_paths(config: Config) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The local paths the config names, as ([(key, file)], [(key, dir)]); fetched ones are left out."""
    files = [
        (f"data.inputs[{i}].path", item.path)
        for i, item in enumerate(config.data.inputs)
        if item.path is not None and not item.path.startswith(LLAMAFACTORY_PREFIX)
    ]
    if any(item.source == "target" for item in config.data.inputs):
        files += [
            (f"prompts.tool_files[{i}]", path)
            for i, path in enumerate(config.prompts.tool_files)
            if not path.startswith(LLAMAFACTORY_PREFIX)
        ]
    files += [
        (f"evaluate.sets[{i}].path", s.path)
        for i, s in enumerate(config.evaluate.sets)
        if isinstance(s, PromptFileSet)
    ]
    dirs = [(f"evaluate.baselines[{i}].path", b.path) for i, b in enumerate(config.evaluate.baselines)]
    if config.model.source != DEFAULT_MODEL_SOURCE:
        dirs.insert(0, ("model.source", config.model.source))
    return files, dirs


def check_local_paths(files: list[tuple[str, str]], dirs: list[tuple[str, str]] = ()) -> None:
    """Refuse, naming every key, config paths that are not an existing file / directory.

    Run when the workflow is parsed, before any job: a missing input is otherwise not an error on a
    finished run (its outputs exist, so Snakemake has nothing to do and the old data stay in use).
    Relative paths are read from the working directory (Snakemake's `--directory`)."""
    problems = []
    for key, path in files:
        if Path(path).is_dir() and any(Path(path).rglob("*.parquet")):
            continue  # a Parquet dataset directory (eyas.data.readers) reads as one input file
        if not Path(path).is_file():
            what = "is a directory, not a file" if Path(path).is_dir() else "does not exist"
            problems.append(f"{key}: {path} {what}")
    for key, path in dirs:
        if not Path(path).is_dir():
            what = "is a file, not a directory" if Path(path).exists() else "does not exist"
            hint = ""
            if key == "model.source" and what == "does not exist" and re.fullmatch(HUB_ID_PATTERN, path):
                hint = (
                    " (a hub id is never downloaded: fetch it first, e.g. `hf download ID --local-dir DIR`)"
                )
            problems.append(f"{key}: {path} {what}{hint}")
    if problems:
        raise ConfigError(
            "config paths not found (relative ones are read from "
            + f"{Path.cwd()}):\n  "
            + "\n  ".join(problems)
        )


def stage_settings(cls: type, values: dict):
    """A stage's settings from its rule's `params`: the section as plain values (`dataclasses.asdict`,
    which Snakemake's params rerun trigger can compare; it skips dataclass objects), checked and
    rebuilt into the dataclass `cls`, nested sections included."""
    return build(cls, values, cls.__name__)


def load_config_file(path: str | Path) -> Config:
    path = Path(path)
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    try:
        return load_config(values)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err
