# Config validation and input helpers. All logic lives in src/eyas; this file only maps config to paths.
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from eyas.config import (  # noqa: E402
    ASSET_NAME_PATTERN,
    DEFAULT_MODEL_SOURCE,
    LLAMAFACTORY_PREFIX,
    check_local_paths,
    load_config,
    local_paths,
)
from eyas.core.model_dir import check_model_dir  # noqa: E402

EYAS = load_config(config, command_line=workflow.config_settings.config)  # --config values come as strings
check_local_paths(*local_paths(EYAS))  # before any job: a missing input is no error on a finished run
if EYAS.model.source != DEFAULT_MODEL_SOURCE:  # a local target dir (the default one is fetched by a job)
    check_model_dir(EYAS.model.source, EYAS.extract.backend, EYAS.model.trust_remote_code)
SPLITS = ("train", "eval")

# Snakemake reruns a `script:` rule when the script changes, not when the package code it calls
# changes (it tracks the script file, not its imports): bump a stage's version here when its logic or output format changes.
STAGE_VERSION = {
    "assets": 1,
    "prepare": 1,
    "tokenize": 1,
    "vocab": 2,
    "extract": 4,
    "train": 5,
    "evaluate": 3,
    "export": 2,
    "validate": 2,
    "regenerate": 3,
    "prompts": 1,
}


wildcard_constraints:
    split="train|eval",
    shard=r"\d{5}",
    name=ASSET_NAME_PATTERN,
    set=ASSET_NAME_PATTERN,


def model_dir():
    if EYAS.model.source == DEFAULT_MODEL_SOURCE:
        return "results/assets/model"
    return EYAS.model.source


TARGET_PROMPTS = "results/prompts/target.jsonl"  # the `target` data source, written by the prompts rule


def asset_path(path):
    """A config path: `llamafactory:<name>` is the fetched file, anything else a local file."""
    if path.startswith(LLAMAFACTORY_PREFIX):
        return f"results/assets/data/{path.removeprefix(LLAMAFACTORY_PREFIX)}"
    return path


def data_paths():
    return [TARGET_PROMPTS if item.source == "target" else asset_path(item.path) for item in EYAS.data.inputs]


def data_formats():
    """Each input's record format for prepare; the target's prompts await their answers."""
    return ["prompts" if item.source == "target" else item.format for item in EYAS.data.inputs]


def prompt_tool_files():
    return [asset_path(path) for path in EYAS.prompts.tool_files]


def num_shards(split):
    return EYAS.tokenize.train_shards if split == "train" else EYAS.tokenize.eval_shards


def num_shards_of(wildcards):
    return num_shards(wildcards.split)


def hidden_stores(split):
    return [f"results/hidden/{split}/shard-{i:05d}.zarr" for i in range(num_shards(split))]


def manifests(split):
    return [f"results/hidden/{split}/shard-{i:05d}.manifest.json" for i in range(num_shards(split))]


def all_cores():
    """`--cores` for rules that use every core; 1 where none is given (`snakemake --report`)."""
    from snakemake.exceptions import WorkflowError

    try:
        return workflow.cores
    except WorkflowError:
        return 1


def use_gpu(device):
    return 1 if device == "cuda" else 0


# Cores a GPU job takes per GPU: what feeds the GPU (the loader's Blosc decode, ~4 cores per GB/s,
# docs/scale.md; as the SLURM profile's 8), not every core, so CPU stages run beside GPU jobs.
GPU_JOB_CORES = 8


def job_threads(gpus, per_gpu=GPU_JOB_CORES):
    """A job's cores: on the CPU every core (the work itself runs there), on GPUs `per_gpu` each."""
    if gpus == 0:
        return all_cores()
    return max(1, min(all_cores(), per_gpu * gpus))


def extract_gpus():
    """GPUs per extraction job: the SGLang engine's tensor-parallel size, else one on CUDA."""
    if EYAS.extract.backend == "sglang":
        return EYAS.sglang.tp_size
    return use_gpu(EYAS.extract.device)


def extract_threads():
    """On GPUs the job's host compresses and writes the chunks, `GPU_JOB_CORES` a GPU: with 2 threads
    (one writer) SGLang extraction of SmolLM2 on an H100 ran at 102.7k tok/s, waiting 36 of its 88 s on
    the writer (bench/results/recipe-h100-smollm2-cut-engines4.json); with 16, 139.9k on an H200
    (bench/results/sglang-speed-smollm2.json). On the CPU 2: the forward and one writer."""
    gpus = extract_gpus()
    return job_threads(gpus) if gpus else 2


def regenerate_gpus():
    """GPUs of a regenerate job: the SGLang engine's tensor-parallel size, else one on CUDA."""
    if EYAS.regenerate.backend == "sglang":
        return EYAS.sglang.tp_size
    return use_gpu(EYAS.regenerate.device)


def prompt_gpus():
    """GPUs of the prompts job: as regenerate's, for the prompts backend and device."""
    if EYAS.prompts.backend == "sglang":
        return EYAS.sglang.tp_size
    return use_gpu(EYAS.prompts.device)


def specdec_threads():
    """One job per set, the cores split between them on the CPU: CPU decoding is memory-latency bound
    (SmolLM2-135M on the idle 2-core VM, bench/decode_parallel.py: 1 process decodes 17.9 tok/s with 1
    thread and with 2; two 1-thread processes side by side 17.4 tok/s each, 34.8 together). On a GPU,
    2 cores: the decode loop runs on the GPU."""
    if use_gpu(EYAS.evaluate.device):
        return job_threads(1, per_gpu=2)
    return max(1, all_cores() // len(EYAS.evaluate.sets))


# --------------------------------------------------------------------------- regenerate / evaluation inputs
def conversations_of(wildcards):
    """Tokenize's input: the prepared split, or its regenerated copy when regenerate.enabled."""
    stage = "regenerated" if EYAS.regenerate.enabled else "prepared"
    return f"results/{stage}/{wildcards.split}.jsonl"


EVAL_SET_FILES = {
    "heldout": "results/prepared/eval.jsonl",
    "humaneval": "results/assets/eval/humaneval.jsonl",
}


def eval_set_files():
    """{set name: prompt file} in config order: the built-in sets' files and the configured prompt files."""
    return {
        item if isinstance(item, str) else item.name: (
            EVAL_SET_FILES[item] if isinstance(item, str) else item.path
        )
        for item in EYAS.evaluate.sets
    }


def eval_set_formats():
    """{set name: record format} of the prompt-file sets (the built-in sets have readers of their own)."""
    return {item.name: item.format for item in EYAS.evaluate.sets if not isinstance(item, str)}


def eval_set_format(wildcards):
    """The record format of set `{set}` when it is a prompt file, else None (a built-in set)."""
    return eval_set_formats().get(wildcards.set)


def specdec_settings(wildcards):
    """The evaluate section as set `{set}`'s specdec job sees it: `sets` holds that set alone, so adding
    or removing another set leaves this job's params (a rerun trigger) as they were."""
    settings = dataclasses.asdict(EYAS.evaluate)
    names = EYAS.evaluate.set_names
    settings["sets"] = [s for s, name in zip(settings["sets"], names) if name == wildcards.set]
    return settings


def eval_set_path(wildcards):
    """The prompt file of evaluation set `{set}`."""
    return eval_set_files()[wildcards.set]


def uses_hf_evaluation():
    return EYAS.evaluate.backend in ("hf", "both")


def specdec_jsons():
    """Each configured evaluation set's HF speculative decoding result, in config order (none when
    only SGLang serves)."""
    if not uses_hf_evaluation():
        return []
    return [f"results/eval/specdec/{name}.json" for name in EYAS.evaluate.set_names]


def served_json():
    """The served evaluation's result when SGLang serves (`evaluate.backend` sglang or both)."""
    return ["results/eval/served.json"] if EYAS.evaluate.backend != "hf" else []


def benchmark_files():
    """The `benchmark:` file of every job the final outputs need, in pipeline order (the throughput
    table and figure: one row per stage)."""
    bench = "results/benchmarks"
    files = [f"{bench}/fetch_model.tsv"] if EYAS.model.source == DEFAULT_MODEL_SOURCE else []
    demo_files = [item.path for item in EYAS.data.inputs if item.source == "file"]
    if TARGET_PROMPTS in data_paths():
        demo_files += EYAS.prompts.tool_files
    files += [
        f"{bench}/fetch_data/{path.removeprefix(LLAMAFACTORY_PREFIX)}.tsv"
        for path in dict.fromkeys(demo_files)
        if path.startswith(LLAMAFACTORY_PREFIX)
    ]
    if "humaneval" in EYAS.evaluate.set_names:
        files.append(f"{bench}/fetch_humaneval.tsv")
    if TARGET_PROMPTS in data_paths():
        files.append(f"{bench}/prompts.tsv")
    files.append(f"{bench}/prepare.tsv")
    if EYAS.regenerate.enabled:
        files.append(f"{bench}/regenerate.tsv")  # one job for both splits
    files += [f"{bench}/tokenize/{split}.tsv" for split in SPLITS]
    files.append(f"{bench}/vocab.tsv")
    for stage in ("extract", "validate"):
        files += [f"{bench}/{stage}/{s}-{i:05d}.tsv" for s in SPLITS for i in range(num_shards(s))]
    files += [f"{bench}/train.tsv", f"{bench}/export_sglang.tsv"]
    if not mla_drafter():  # the MLA drafter has no speculators format
        files.append(f"{bench}/export_speculators.tsv")
    if uses_hf_evaluation():
        files += [f"{bench}/specdec/{name}.tsv" for name in EYAS.evaluate.set_names]
    if served_json():
        files.append(f"{bench}/served.tsv")
    files.append(f"{bench}/evaluate.tsv")
    return files


def mla_drafter():
    """Whether the drafter is the MLA layer (train.drafter), which has no speculators format."""
    if EYAS.train.drafter != "auto":
        return EYAS.train.drafter == "mla"
    config = Path(model_dir()) / "config.json"
    if not config.exists():  # the default model is SmolLM2 (no MLA), fetched later
        return False
    raw = json.loads(config.read_text())
    return bool((raw.get("text_config") or raw).get("kv_lora_rank"))


def get_final_output():
    return [
        "results/eval/summary.json",
        "results/eval/acceptance.png",
        "results/eval/tau.png",
        "results/export/sglang",
        *manifests("eval"),  # train manifests are train's inputs; eval stores are validated too
        *([] if mla_drafter() else ["results/export/speculators"]),
    ]


def print_report_location():
    print("\neyas: done.")
    print("  summary:  results/eval/summary.json  (tau, speedup, acceptance by position)")
    print("  plot:     results/eval/acceptance.png  |  tau per set: results/eval/tau.png")
    print("  report:   snakemake --report results/report.html  (tables and plots in one page)")
    print("  drafter:  results/train/drafter  |  SGLang export: results/export/sglang")
    if not mla_drafter():
        print("  vLLM speculators export: results/export/speculators")
