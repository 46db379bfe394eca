"""The regenerate stage's generation against SGLang's own offline benchmark, on the recipe's own prompts.

    python bench/gpu/generation.py --config config/gpu-smollm2.yaml --prepared RUN/results/prepared \
        --model /root/smollm2 --out OUT [--variant NAME | NAME=JSON ...] [--limit N] [--dry]

Each variant is a `regenerate.engine` setting (config/config.yaml); each runs `run_regenerate` (the
stage's own function: one job for both splits, the recipe's samples, temperature, turns and token limit)
in a fresh process, timed from outside, so imports, engine start-up and writing count as in a pipeline
job: `new_tokens / process_seconds` is the end-to-end rate; its generate calls are also timed alone
(`while_generating`). The first variant also records the prompts the stage sent in each turn round
(pipelined turns too: each prompt under its turn's index); then SGLang's own offline benchmark
(`throughput_test_once` of `sglang.benchmark.offline_throughput`, sglang 0.5.17, the function its
`python -m sglang.bench_offline_throughput` calls) runs those prompts, round by round, on an `Engine`
built with the same engine args (the tokenizer on: its benchmark sends text) and the same sampling
(temperature, `max_new_tokens`, stop at end-of-turn: `disable_ignore_eos`), also in a fresh process.
Its warm-up is skipped (it samples ShareGPT, which needs the network); eyas's stage has none either.

Writes OUT/generation.json (every variant, SGLang's, the ratios, the command) and OUT/best.json (the
`regenerate.engine` overrides of the variant that would make `--project-tokens` new tokens soonest:
its time outside generation plus those tokens at its rate after start-up; for `tools/gpu/run_recipe.sh
start --engine-from`).
`--dry` loads config and prompts and writes the plan only (no engine; runs on a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
from gpubench import parse_variants, run_child, run_or_child, write_json  # noqa: E402

SPLITS = ("train", "eval")
# regenerate.engine variants (bench defaults): SGLang's own admission and graphs; every batch in decode
# graphs (88.7k vs 57.2k tok/s on a fixed load, H200); the same without prefill-graph capture; 2 and 4
# engines (the scheduler process, not the GPU, was the bottleneck); 4 engines with pipelined turns, and
# 4 engines started together.
GRAPHS_1024 = {"max_running_requests": 1024, "cuda_graph_max_bs": 1024}
NO_PREFILL = {"prefill_cuda_graph": False}
ENGINES_4 = {"max_running_requests": 512, "cuda_graph_max_bs": 512, "engines": 4} | NO_PREFILL
VARIANTS = {
    "sglang-defaults": {},
    "graphs-1024": GRAPHS_1024,
    "graphs-1024-noprefill": GRAPHS_1024 | NO_PREFILL,
    "engines-2": GRAPHS_1024 | NO_PREFILL | {"engines": 2},
    "engines-4": ENGINES_4,
    # the same with each conversation's next turn sent when its last is back, not per turn round
    "engines-4-pipelined": ENGINES_4 | {"pipeline_turns": True},
    # the same with the engines started at once, their GPU work in turns
    "engines-4-together": ENGINES_4 | {"start_together": True},
}


def load_settings(config: str, overrides: dict):
    """The recipe's config with `regenerate.engine` overridden: (Config, RegenerateSettings)."""
    import yaml

    from eyas.config import load_config

    values = yaml.safe_load(Path(config).read_text())
    values.setdefault("regenerate", {})
    values["regenerate"]["engine"] = {**values["regenerate"].get("engine", {}), **overrides}
    cfg = load_config(values)
    return cfg, cfg.regenerate


def limited_splits(prepared: Path, work: Path, limit: int | None) -> list[Path]:
    """The prepared splits, or their first `limit` conversations each (copied under `work`)."""
    paths = [prepared / f"{split}.jsonl" for split in SPLITS]
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{path}: no prepared split (run the recipe's prepare rule first)")
    if limit is None:
        return paths
    work.mkdir(parents=True, exist_ok=True)
    out = []
    for path in paths:
        lines = [line for line in path.read_text().splitlines() if line.strip()][:limit]
        (work / path.name).write_text("".join(line + "\n" for line in lines))
        out.append(work / path.name)
    return out


def plan(args) -> dict:
    """Prompt counts of round 0 (conversations x samples) per split, from the stage's own reader."""
    from eyas.model.target import load_tokenizer
    from eyas.regenerate.responses import prepare_split

    cfg, settings = load_settings(args.config, {})
    tokenizer = load_tokenizer(args.model)
    limit = cfg.tokenize.max_length - settings.max_new_tokens
    counts = {}
    for path in limited_splits(args.prepared, args.out / "work", args.limit):
        state = prepare_split(
            path, tokenizer, max_prompt_length=limit, samples=settings.samples, turns=settings.turns
        )
        prompt_tokens = sum(len(s["first"]) for s in state["streams"])
        counts[path.stem] = {"conversations": state["stats"]["read"], "round0_prompts": len(state["streams"]),
                             "round0_prompt_tokens": prompt_tokens}  # fmt: skip
    return {"regenerate": dataclasses.asdict(settings), "prompts": counts}


# --------------------------------------------------------------------------- child processes
def child_eyas(args) -> None:
    """One variant through the stage's `run_regenerate`: the prompts of each turn round recorded (for
    SGLang's benchmark, which sends them round by round) and its generate calls timed."""
    began = time.perf_counter()
    from eyas.engine import generation
    from eyas.regenerate import responses

    cfg, settings = load_settings(args.config, json.loads(args.variant_json))
    rounds: dict[int, list] = {}
    generate_seconds, starts = [], []

    def timed(function, seconds: list):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                seconds.append(time.perf_counter() - t)

        return run

    def recorded(function):
        def prompt(state, stream, round_index, *a):
            ids = function(state, stream, round_index, *a)
            if ids is not None:
                rounds.setdefault(round_index, []).append(list(ids))
            return ids

        return prompt

    def recorded_round(function):
        def prompts(states, round_index, *a):
            todo = function(states, round_index, *a)
            rounds.setdefault(round_index, []).extend(list(ids) for _, _, ids in todo)
            return todo

        return prompts

    # a round's generate call, or the whole pipelined generation (generation alone, as SGLang's is
    # timed); the engines' start; every turn's prompt as it is sent
    responses.SglangGenerator.__call__ = timed(responses.SglangGenerator.__call__, generate_seconds)
    responses.regenerate_pipelined = timed(responses.regenerate_pipelined, generate_seconds)
    generation.GenerationEngines.__init__ = timed(generation.GenerationEngines.__init__, starts)
    responses._turn_prompt = recorded(responses._turn_prompt)  # pipelined turns
    responses._round_prompts = recorded_round(responses._round_prompts)  # a turn round's prompts at once
    work = Path(args.work)
    splits = [(p, work / f"{p.stem}.jsonl", work / f"{p.stem}.stats.json") for p in map(Path, args.splits)]
    stage_began = time.perf_counter()
    stats = responses.run_regenerate(
        splits, args.model, settings=settings, engine_settings=cfg.sglang,
        max_length=cfg.tokenize.max_length,
    )  # fmt: skip
    done = time.perf_counter()
    by_round = [rounds[i] for i in sorted(rounds)]
    if args.record_prompts:
        Path(args.record_prompts).write_text(json.dumps(by_round))
    result = {
        "new_tokens": sum(s["new_tokens"] for s in stats), "stats": stats,
        "in_process_seconds": done - began, "stage_seconds": done - stage_began,
        "generate_seconds": sum(generate_seconds), "generate_call_seconds": generate_seconds,
        "engine_start_seconds": starts, "round_prompts": [len(r) for r in by_round],
        "pipeline_turns": settings.engine.pipeline_turns,
        "engine_args": _engine_args(cfg, settings, args.model),
    }  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


def _engine_args(cfg, settings, model: str) -> dict:
    from eyas.engine.generation import generation_args

    return generation_args(
        cfg.sglang, settings.engine, model_dir=model, seed=settings.seed,
        trust_remote_code=cfg.model.trust_remote_code,
    )  # fmt: skip


def import_sglang_benchmark():
    """(DatasetRow, throughput_test_once) of SGLang's offline benchmark. Its package imports every
    dataset loader, MMMU's `from datasets import load_dataset` among them (sglang 0.5.17 and 0.5.23,
    `benchmark/datasets/mmmu.py`); where Hugging Face `datasets` is not installed (the GPU image, the
    sglang test venv) a stand-in module lets the package import. This benchmark loads no dataset: it
    sends the recorded prompts, and a loader that downloads could not run offline anyway."""
    import importlib.util
    import types

    if importlib.util.find_spec("datasets") is None and "datasets" not in sys.modules:
        stand_in = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise RuntimeError("Hugging Face `datasets` is not installed (bench/gpu/generation.py stand-in)")

        stand_in.load_dataset = load_dataset
        sys.modules["datasets"] = stand_in
    from sglang.benchmark.datasets.common import DatasetRow
    from sglang.benchmark.offline_throughput import throughput_test_once

    return DatasetRow, throughput_test_once


def child_sglang(args) -> None:
    """SGLang's own offline benchmark on the recorded prompts, one `throughput_test_once` per round."""
    began = time.perf_counter()
    DatasetRow, throughput_test_once = import_sglang_benchmark()  # noqa: N806 (classes)
    from sglang.srt.entrypoints.engine import Engine

    from eyas.model.target import load_tokenizer

    cfg, settings = load_settings(args.config, json.loads(args.variant_json))
    engine_args = _engine_args(cfg, settings, args.model) | {"skip_tokenizer_init": False}
    tokenizer = load_tokenizer(args.model)
    rounds = json.loads(Path(args.record_prompts).read_text())
    t = time.perf_counter()
    engine = Engine(**engine_args)
    start_seconds = time.perf_counter() - t
    results = []
    try:
        for prompts in rounds:
            out_len = settings.max_new_tokens
            rows = [DatasetRow(prompt=tokenizer.decode(p), prompt_len=len(p), output_len=out_len)
                    for p in prompts]  # fmt: skip
            results.append(throughput_test_once(
                backend_name="engine", backend=engine, reqs=rows, ignore_eos=False,
                extra_request_body={"temperature": settings.temperature}, profile=False,
            ))  # fmt: skip
    finally:
        engine.shutdown()
    result = {
        "new_tokens": sum(r["total_output_tokens"] for r in results),
        "benchmark_seconds": sum(r["total_latency"] for r in results),
        "engine_start_seconds": [start_seconds], "in_process_seconds": time.perf_counter() - began,
        "rounds": results, "engine_args": engine_args,
    }  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


# --------------------------------------------------------------------------- the parent
def rates(entry: dict) -> dict:
    """New tokens a second: end to end (the child's whole process: imports, start-up, generation,
    writing), after its engines started (eyas: the stage's seconds less engine start-up; SGLang: its
    benchmark's own timed calls) and while generating (the generate calls alone, on both sides)."""
    tokens = entry["new_tokens"]
    after = entry.get("benchmark_seconds") or entry["stage_seconds"] - sum(entry["engine_start_seconds"])
    generating = entry.get("benchmark_seconds") or entry.get("generate_seconds")
    out = {"end_to_end": tokens / entry["process_seconds"], "after_engine_start": tokens / after}
    return out | ({"while_generating": tokens / generating} if generating else {})


def projected_seconds(entry: dict, tokens: float) -> float:
    """Seconds to generate `tokens` new tokens: this run's time outside generation (process start,
    imports, engine start-up, writing) plus `tokens` at its rate after the engines started."""
    rate = entry["new_tokens_per_s"]["after_engine_start"]
    outside = entry["process_seconds"] - entry["new_tokens"] / rate
    return outside + tokens / rate


def run(args) -> None:
    variants = parse_variants(args.variant, VARIANTS)
    result = {"plan": plan(args), "variants": {}, "sglang_offline_benchmark": None}
    if args.dry:
        result["variants"] = variants
        write_json(args.out / "generation.json", result)
        return
    splits = [str(p) for p in limited_splits(args.prepared, args.out / "work", args.limit)]
    prompts = args.out / "prompts-by-round.json"
    common = ["--config", args.config, "--model", args.model, "--splits", *splits]
    first = next(iter(variants))
    for name, overrides in variants.items():
        work = args.out / "work" / name
        work.mkdir(parents=True, exist_ok=True)
        child = ["_eyas", *common, "--variant-json", json.dumps(overrides), "--work", str(work),
                 "--result", str(work / "result.json")]  # fmt: skip
        if name == first:
            child += ["--record-prompts", str(prompts)]
        entry = run_child(child, args.out / f"eyas-{name}.log", args.timeout) | {"overrides": overrides}
        if "new_tokens" in entry:
            entry["new_tokens_per_s"] = rates(entry)
        result["variants"][name] = entry
        write_json(args.out / "generation.json", result)  # what finished survives a budget that ends
    if not args.no_sglang and prompts.exists():
        overrides = variants[args.sglang_variant or first]
        result_path = str(args.out / "work" / "sglang.json")
        child = ["_sglang", *common, "--variant-json", json.dumps(overrides),
                 "--record-prompts", str(prompts), "--result", result_path]  # fmt: skip
        entry = run_child(child, args.out / "sglang-offline.log", args.timeout) | {"overrides": overrides}
        if "new_tokens" in entry:
            entry["new_tokens_per_s"] = rates(entry)
            theirs = entry["new_tokens_per_s"]
            result["ratio_to_sglang"] = {
                name: {k: v["new_tokens_per_s"][k] / theirs[k] for k in theirs if k in v["new_tokens_per_s"]}
                for name, v in result["variants"].items() if "new_tokens_per_s" in v
            }  # fmt: skip
        result["sglang_offline_benchmark"] = entry
    done = {n: v for n, v in result["variants"].items() if "new_tokens_per_s" in v}
    if done:
        # a short bench is mostly start-up: rank by the seconds the recipe's whole generation would take
        for entry in done.values():
            entry["projected_seconds"] = projected_seconds(entry, args.project_tokens)
        best = min(done, key=lambda n: done[n]["projected_seconds"])
        result["best"] = best
        result["project_tokens"] = args.project_tokens
        write_json(args.out / "best.json", {"variant": best, "engine": done[best]["overrides"]})
    write_json(args.out / "generation.json", result)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/gpu-smollm2.yaml")
    ap.add_argument("--model", required=True, help="the target's HF dir (the recipe's results/assets/model)")
    ap.add_argument("--prepared", type=Path, help="a recipe run's results/prepared (train.jsonl, eval.jsonl)")
    ap.add_argument("--out", type=Path, help="folder for generation.json, best.json, logs, work files")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help=f"NAME ({', '.join(VARIANTS)}) or NAME=JSON regenerate.engine overrides; repeat",
    )
    ap.add_argument("--limit", type=int, help="first N conversations of each split (default: all)")
    ap.add_argument("--sglang-variant", help="the variant whose engine args SGLang's benchmark uses (first)")
    ap.add_argument("--no-sglang", action="store_true", help="skip SGLang's own offline benchmark")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child run")
    ap.add_argument("--project-tokens", type=float, default=18e6,
                    help="best.json: the variant that would generate this many new tokens soonest "
                    "(the recipe's ~18M)")  # fmt: skip
    ap.add_argument("--dry", action="store_true", help="plan only: config, prompt counts, variants")
    ap.add_argument("--splits", nargs="+", help=argparse.SUPPRESS)  # child-only
    children = {"_eyas": child_eyas, "_sglang": child_sglang}
    child_flags = ("--variant-json", "--work", "--result", "--record-prompts")
    run_or_child(ap, argv, run, children, child_flags, required=("prepared", "out"))


if __name__ == "__main__":
    main()
