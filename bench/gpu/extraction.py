"""The extract stage's SGLang capture path against the same engine's bare prefill, on the same batches.

    python bench/gpu/extraction.py --config config/gpu-smollm2.yaml --model /root/smollm2 \
        --shard RUN/results/tokens/train/shard-00000.zarr --out OUT [--tokens N] [--variant ...] [--dry]

`bare`: the capture engine's own args (`eyas.extract.sglang_backend.engine_args`, from the config's
`sglang` section) without the capture switches, no hook, the shard's samples sent `requests_per_call` at
a time with `max_new_tokens` 0 after the same warm-up the stage sends (its first samples). `eyas`: the
stage's `extract_shard_sglang` on the same shard (hook, device encode, pinned copy, writer threads,
`extract.storage` of the config), once per variant (NAME=JSON: `extract` keys over the config's, e.g.
`{"writer_threads": 4}`, `{"storage": "bf16"}`, and `{"sglang": {"requests_per_call": 4096}}` for the
top-level `sglang` section). `{"discard_writes": true}` (bench only) keeps the capture up to the pinned
copy and drops the writer's work (no encoding, no files): what the writers cost the scheduler at most
(the writer threads only). `{"writer_process": true}` writes the store from a child of the scheduler
process instead (`eyas.extract.writer_process`), e.g.
`--variant 'w7-proc={"writer_threads": 7, "chunks_per_shard": 16, "writer_process": true}'` beside
`w7-s16` and `w7-s16-drop`: how much of the writers' cost the process takes away. Each run in a fresh
process. `--profile`: cProfile of the eyas variants' scheduler process (its main thread) from the first
capture forward (with `writer_process`, the first warm-up forward, where the row sink starts) to the
store's end, the top functions in the JSON. Reported: tokens a second after the engine is up (the
stage's own `seconds`, which leave out start-up and warm-up) and end to end (the child's whole
process), and eyas / bare for both. The bare engine runs first and again after the variants; a
variant's `ratio_to_bare` is against the faster of the two (`ratio_to_each_bare`: against each).
`--tokens N` repeats the shard's samples up to N tokens (a small shard is over before it is timed).
Writes OUT/extraction.json with the command; `--dry` checks config and shard and writes the plan only.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
from gpubench import parse_variants, run_child, run_or_child, write_json  # noqa: E402

VARIANTS = {"recipe": {}}  # the config's extract section as it is
CAPTURE_ARGS = (
    "enable_return_aux_hidden_states",
    "speculative_algorithm",
    "return_aux_hidden_state_layer_ids",
    "enable_return_hidden_states",
)


def extract_settings(config: str, overrides: dict):
    """The config with `overrides` on top: `extract` keys, and an `sglang` mapping merged key by key into
    the top-level `sglang` section (the engine's)."""
    import yaml

    from eyas.config import load_config

    values = yaml.safe_load(Path(config).read_text())
    values["extract"] = {
        **(values.get("extract") or {}),
        **{k: v for k, v in overrides.items() if k != "sglang"},
    }
    values["sglang"] = {**(values.get("sglang") or {}), **overrides.get("sglang", {})}
    return load_config(values)


def workload(shard: str, work: Path, tokens: int | None) -> str:
    """The shard, or its non-empty samples repeated up to `tokens` tokens (a new token shard)."""
    from eyas.store import read_token_shard, write_token_shard

    source = read_token_shard(shard)
    if tokens is None:
        return shard
    samples = [source.sample(i) for i in range(source.num_samples) if len(source.sample(i)[0])]
    if not samples:
        raise SystemExit(f"{shard}: no non-empty sample")
    out, total = [], 0
    while total < tokens:
        out.append(samples[len(out) % len(samples)])
        total += len(out[-1][0])
    dst = work / "workload.zarr"
    write_token_shard(dst, out, [f"r{i}" for i in range(len(out))], dict(source.attrs))
    return str(dst)


def _layer_ids(cfg, model: str) -> list[int]:
    from eyas.core.layer_ids import resolve_aux_layer_ids
    from eyas.model.target import read_config

    return resolve_aux_layer_ids(read_config(model), cfg.model.aux_layer_ids)


# --------------------------------------------------------------------------- child processes
def child_bare(args) -> None:
    began = time.perf_counter()
    import sglang
    from sglang.srt.entrypoints.engine import Engine

    from eyas.core.layer_ids import sglang_layer_ids, text_model_type
    from eyas.engine.sglang_args import server_arg_names
    from eyas.engine.sglang_models import only_needed_models
    from eyas.extract.sglang_backend import WARMUP_REQUESTS, capture_route, engine_args
    from eyas.model.target import read_config
    from eyas.store import read_token_shard

    cfg = extract_settings(args.config, {})
    settings = cfg.sglang
    route = capture_route(sglang.__version__)
    ids = sglang_layer_ids(text_model_type(read_config(args.model)), _layer_ids(cfg, args.model))
    kwargs = engine_args(route, ids, settings, args.model, "bfloat16", cfg.model.trust_remote_code,
                         server_arg_names())  # fmt: skip
    kwargs = {k: v for k, v in kwargs.items() if k not in CAPTURE_ARGS}
    shard = read_token_shard(args.workload)
    requests = [shard.sample(i)[0].tolist() for i in range(shard.num_samples)]
    requests = [r for r in requests if r]
    start = time.perf_counter()
    with only_needed_models([args.model]):  # as the stage starts its engine
        engine = Engine(**kwargs)
    try:
        engine.generate(input_ids=requests[:WARMUP_REQUESTS], sampling_params={"max_new_tokens": 0})
        load_seconds = time.perf_counter() - start
        timed = time.perf_counter()
        step = settings.requests_per_call
        for lo in range(0, len(requests), step):
            engine.generate(input_ids=requests[lo : lo + step], sampling_params={"max_new_tokens": 0})
        seconds = time.perf_counter() - timed
    finally:
        engine.shutdown()
    tokens = sum(map(len, requests))
    result = {"tokens": tokens, "seconds": seconds, "load_seconds": load_seconds,
              "tokens_per_s": tokens / seconds, "in_process_seconds": time.perf_counter() - began,
              "engine_args": kwargs}  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


def profiled_scheduler_process(profile_path: str, spec, *args, **kwargs):
    """The capture engine's scheduler process with cProfile on its main thread from the first capture
    forward (the row sink's creation) to the store's end (its `close`); stats to `profile_path`."""
    import cProfile

    from eyas.extract import sglang_capture, sglang_sink

    profiler = cProfile.Profile()
    init, close = sglang_sink.RowSink.__init__, sglang_sink.RowSink.close

    def init_and_start(self, *a, **k):
        init(self, *a, **k)
        profiler.enable()

    def close_and_dump(self):
        try:
            return close(self)
        finally:
            profiler.disable()
            profiler.dump_stats(profile_path)

    sglang_sink.RowSink.__init__, sglang_sink.RowSink.close = init_and_start, close_and_dump
    return sglang_capture.scheduler_process(spec, *args, **kwargs)


def drop_writes() -> None:
    """This process's extract writers keep nothing: a staged batch is waited for (its pinned copy, as a
    real write waits) and released unwritten, and the store is not checked for completeness at its end.
    Bench only (`discard_writes`): the store it leaves has no chunk files."""
    from eyas.extract.writer import BatchWriter
    from eyas.store.writer import HiddenStoreWriter

    def wait_only(self, item) -> None:
        if item.ready is not None:
            item.ready.synchronize()

    BatchWriter.write = wait_only
    HiddenStoreWriter.finish = lambda self, extra_attrs=None: None


def discarding_scheduler_process(spec, *args, **kwargs):
    """The capture engine's scheduler process with `drop_writes` in force."""
    from eyas.extract import sglang_capture

    drop_writes()
    return sglang_capture.scheduler_process(spec, *args, **kwargs)


def profile_top(path: Path, count: int = 40) -> dict:
    """The profile's functions with the most own time and the most time below them."""
    import pstats

    stats = pstats.Stats(str(path))
    rows = [(f"{func[0].split('site-packages/')[-1]}:{func[1]}({func[2]})", calls, own, below)
            for func, (_, calls, own, below, _) in stats.stats.items()]  # fmt: skip
    own = sorted(rows, key=lambda r: -r[2])[:count]
    below = sorted(rows, key=lambda r: -r[3])[:count]
    keys = ("function", "calls", "own_seconds", "cumulative_seconds")
    return {"total_seconds": stats.total_tt,
            "by_own_time": [dict(zip(keys, r, strict=True)) for r in own],
            "by_cumulative_time": [dict(zip(keys, r, strict=True)) for r in below]}  # fmt: skip


def child_eyas(args) -> None:
    began = time.perf_counter()
    import dataclasses

    import zarr

    from eyas.extract import sglang_backend
    from eyas.extract.sglang_backend import extract_shard_sglang

    overrides = json.loads(args.variant_json)
    discard = overrides.pop("discard_writes", False)
    if discard and args.profile_out:
        raise SystemExit("extraction bench: discard_writes and --profile do not combine")
    if discard and overrides.get("writer_process"):  # its child process would write all the same
        raise SystemExit("extraction bench: discard_writes drops the writer threads' work, not a process's")
    if args.profile_out:
        sglang_backend.scheduler_process = functools.partial(profiled_scheduler_process, args.profile_out)
    if discard:
        sglang_backend.scheduler_process = discarding_scheduler_process

    cfg = extract_settings(args.config, overrides)
    ex = cfg.extract
    stats = extract_shard_sglang(
        args.workload, str(Path(args.work) / "store.zarr"), args.model,
        layer_ids=_layer_ids(cfg, args.model), model_id=cfg.model_id,
        settings=cfg.sglang, trust_remote_code=cfg.model.trust_remote_code,
        storage=ex.storage, chunk_tokens=ex.chunk_tokens, chunks_per_shard=ex.chunks_per_shard,
        compression=ex.compression, writer_threads=ex.writer_threads, writer_process=ex.writer_process,
        threads=args.threads,
    )  # fmt: skip
    settings = {"extract": dataclasses.asdict(ex), "sglang": dataclasses.asdict(cfg.sglang)}
    # what the store itself records: a setting the call above dropped shows here (the 2026-12-06 run's
    # `compression: none` variant wrote zstd, the same bytes as its zstd twin)
    written = (
        dict(zarr.open_group(str(Path(args.work) / "store.zarr"), mode="r").attrs) if not discard else {}
    )
    store = {key: written.get(key) for key in ("storage", "chunk_tokens", "chunks_per_shard", "compression")}
    result = stats | {"in_process_seconds": time.perf_counter() - began, "store_attrs": store, **settings}
    result["discard_writes"] = discard
    Path(args.result).write_text(json.dumps(result, default=str))


# --------------------------------------------------------------------------- the parent
def rates(entry: dict) -> dict:
    return {
        "after_engine_start": entry["tokens_per_s"],
        "end_to_end": entry["tokens"] / entry["process_seconds"],
    }


def run_bare(args, common: list, work: Path, name: str) -> dict:
    """One bare-prefill child (its log OUT/NAME.log), with its rates."""
    entry = run_child(
        ["_bare", *common, "--result", str(work / f"{name}.json")], args.out / f"{name}.log", args.timeout
    )
    if "tokens" in entry:
        entry["tokens_per_s_by"] = rates(entry)
    return entry


def run_variant(args, common: list, work: Path, name: str, overrides: dict) -> dict:
    """One eyas child on the variant's `extract` overrides (its log OUT/eyas-NAME.log), with its rates."""
    child_work = work / name
    child_work.mkdir(parents=True, exist_ok=True)
    child = ["_eyas", *common, "--variant-json", json.dumps(overrides), "--work", str(child_work),
             "--result", str(child_work / "result.json")]  # fmt: skip
    profile = args.out / f"profile-{name}.prof"
    if args.profile:
        profile.unlink(missing_ok=True)
        child += ["--profile-out", str(profile)]
    entry = run_child(child, args.out / f"eyas-{name}.log", args.timeout) | {"overrides": overrides}
    if args.profile and profile.exists():
        entry["scheduler_profile"] = profile_top(profile)
    if "tokens" in entry:
        entry["tokens_per_s_by"] = rates(entry)
    return entry


def add_ratios(result: dict) -> None:
    """Each variant's `ratio_to_bare` (by rate kind) against the faster of the two bare runs, the
    ceiling the capture is held to, and `ratio_to_each_bare` against both."""
    bares = [result[k]["tokens_per_s_by"] for k in ("bare_prefill", "bare_prefill_last")
             if "tokens_per_s_by" in result.get(k, {})]  # fmt: skip
    if not bares:
        return
    for entry in result["variants"].values():
        if "tokens_per_s_by" not in entry:
            continue
        rate = entry["tokens_per_s_by"]
        entry["ratio_to_bare"] = {k: rate[k] / max(b[k] for b in bares) for k in rate}
        entry["ratio_to_each_bare"] = [{k: rate[k] / b[k] for k in rate} for b in bares]


def run(args) -> None:
    import dataclasses

    from eyas.store import read_token_shard

    variants = parse_variants(args.variant, VARIANTS)
    cfg = extract_settings(args.config, {})
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    load = workload(args.shard, work, args.tokens) if not args.dry else args.shard
    shard = read_token_shard(load)
    result = {
        "workload": {
            "shard": args.shard,
            "samples": shard.num_samples,
            "tokens": int(shard.sample_offsets[-1]),
        },
        "extract": {"storage": cfg.extract.storage},
        "sglang": dataclasses.asdict(cfg.sglang),
        "variants": variants if args.dry else {},
    }
    if args.dry:
        write_json(args.out / "extraction.json", result)
        return
    common = [
        "--config",
        args.config,
        "--model",
        args.model,
        "--workload",
        load,
        "--threads",
        str(args.threads),
    ]
    # The bare engine runs first and again last: a machine's first engine (cold kernels and caches) once
    # ran at 0.59x of the same bench's bare on another machine where its eyas variants ran at 0.76x
    # (bench/results/extraction-shards-h100-smollm2.json), so one bare run can flatter the ratio.
    result["bare_prefill"] = run_bare(args, common, work, "bare")
    for name, overrides in variants.items():
        result["variants"][name] = run_variant(args, common, work, name, overrides)
        write_json(args.out / "extraction.json", result)
    result["bare_prefill_last"] = run_bare(args, common, work, "bare-last")
    add_ratios(result)
    write_json(args.out / "extraction.json", result)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/gpu-smollm2.yaml")
    ap.add_argument("--model", required=True, help="the target's HF dir")
    ap.add_argument("--shard", help="a token shard of a recipe run (results/tokens/<split>/shard-*.zarr)")
    ap.add_argument("--out", type=Path, help="folder for extraction.json, logs, work files")
    ap.add_argument("--tokens", type=int, help="repeat the shard's samples up to this many tokens")
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON extract overrides; repeat")
    ap.add_argument("--threads", type=int, default=16, help="the job's threads (writer pool)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per child run")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the capture engine's scheduler process while it captures")  # fmt: skip
    ap.add_argument("--dry", action="store_true", help="plan only: config and shard checked")
    children = {"_bare": child_bare, "_eyas": child_eyas}
    child_flags = ("--variant-json", "--work", "--result", "--workload", "--profile-out")
    run_or_child(ap, argv, run, children, child_flags, required=("shard", "out"))


if __name__ == "__main__":
    main()
