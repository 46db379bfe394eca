"""SGLang backend on the GPU: agreement with the HF backend and throughput against SGLang alone.

Three steps, each in the Python environment it needs (sglang pins its own transformers):

    python bench/sglang_extract.py hf      --model M --shard S --work W       # image's packages
    python bench/sglang_extract.py sglang  --model M --shard S --work W       # sglang's site first
    python bench/sglang_extract.py compare --work W --out bench/results/sglang-h200-smollm2.json

`hf` writes the HF backend's stores in bf16 and in fp32 compute (the reference); `sglang` writes the
eyas extract stage's store with `backend: sglang` twice, chunked prefill off (one forward per
sample) and on (chunks of `--chunk` tokens, so most samples arrive in pieces), and times the same
requests through a plain SGLang engine with capture off; `compare` measures every store against the
fp32 reference per tap (relative RMS error and max abs error) and writes the JSON with the commands.
The noise floor is HF-bf16's own distance to fp32.

    python bench/sglang_extract.py speed --model M --shard S --work W --out O [--dummy llama-8b]

`speed` splits the cost of capture on one workload (the shard's samples repeated to `--tokens`):
SGLang alone, SGLang with aux capture switched on but no eyas hook (what SGLang itself pays to keep
the taps), and the eyas extract stage (hook, device encode, copy, compression, disk). `--dummy
llama-8b` writes a Llama-3.1-8B config.json under W and starts SGLang with `load_format: dummy`
(random weights, through `sglang.engine_args`): the speed of a GPU-bound target without its
16 GB of weights.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

STEPS_FILE = "steps.json"  # each step's command line and stats, gathered by `compare`


def _record(work: Path, step: str, info: dict) -> None:
    path = work / STEPS_FILE
    steps = json.loads(path.read_text()) if path.exists() else {}
    steps[step] = {"command": shlex.join([sys.executable, *sys.argv]), **info}
    path.write_text(json.dumps(steps, indent=2))


def _layer_ids(model: str) -> list[int]:
    from eyas.core.layer_ids import resolve_aux_layer_ids
    from eyas.model.target import read_config

    return resolve_aux_layer_ids(read_config(model), None)


def step_hf(args) -> None:
    from eyas.extract.hf_backend import extract_shard

    info = {}
    taps = _layer_ids(args.model)
    runs = [("hf-fp32", "float32", taps), ("hf-bf16", "bfloat16", taps)]
    # the neighbouring layers in fp32: a capture one layer off would match one of these instead
    runs += [
        ("hf-fp32-prev", "float32", [v - 1 for v in taps]),
        ("hf-fp32-next", "float32", [v + 1 for v in taps]),
    ]
    for name, dtype, layer_ids in runs:
        stats = extract_shard(
            args.shard,
            str(args.work / f"{name}.zarr"),
            args.model,
            layer_ids=layer_ids,
            device="cuda",
            dtype=dtype,
            token_budget=args.budget,
            model_id="smollm2",
            progress=False,
            threads=16,
        )
        info[name] = {k: stats[k] for k in ("tokens", "tokens_per_s", "seconds")}
    _record(args.work, "hf", info)


def _plain_engine_seconds(args, requests: list[list[int]]) -> float:
    """The same prefill-only requests through SGLang with capture off (no hook, no aux layers)."""
    from sglang.srt.entrypoints.engine import Engine

    kwargs = dict(
        model_path=args.model,
        disable_radix_cache=True,
        skip_tokenizer_init=True,
        disable_cuda_graph=True,
        sampling_backend="pytorch",
        dtype="bfloat16",
        mem_fraction_static=0.7,
        chunked_prefill_size=args.budget,
        random_seed=0,
        log_level="warning",
        **({"attention_backend": args.attention} if args.attention else {}),
    )
    return _timed_engine(Engine, kwargs, requests, len(requests))


CAPTURE_ARGS = (
    "enable_return_aux_hidden_states",
    "speculative_algorithm",
    "return_aux_hidden_state_layer_ids",
    "enable_return_hidden_states",
)
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128009,
}


def _capture_only_scheduler(route: str, sglang_ids: list[int], *args, **kwargs):
    """Scheduler process with SGLang's aux capture on (as the extract stage turns it on) but no hook."""
    from eyas.extract import sglang_capture as capture

    if route == "scheduler":
        capture._enable_aux_capture(sglang_ids)
        capture._keep_final_state()
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)


def _timed_engine(engine_cls, kwargs: dict, requests: list[list[int]], per_call: int) -> float:
    """Seconds to prefill `requests` (after a 64-request warm-up), `per_call` requests per generate."""
    engine = engine_cls(**kwargs)
    try:
        engine.generate(input_ids=requests[:64], sampling_params={"max_new_tokens": 0})
        start = time.perf_counter()
        for lo in range(0, len(requests), per_call):
            engine.generate(input_ids=requests[lo : lo + per_call], sampling_params={"max_new_tokens": 0})
        return time.perf_counter() - start
    finally:
        engine.shutdown()


def step_speed(args) -> None:
    import functools

    import sglang
    from sglang.srt.entrypoints.engine import Engine

    from eyas.config import SglangSettings
    from eyas.core.layer_ids import sglang_layer_ids, text_model_type
    from eyas.extract.sglang_backend import capture_route, engine_args, extract_shard_sglang
    from eyas.model.target import read_config
    from eyas.store import read_token_shard

    model, extra = args.model, {}
    if args.dummy:
        model = args.work / f"{args.dummy}-config"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps(LLAMA_8B))
        extra = {"load_format": "dummy"}
    big = _repeated_shard(args.shard, args.work / "speed-tokens.zarr", args.tokens)
    shard = read_token_shard(big)
    requests = [shard.sample(i)[0].tolist() for i in range(shard.num_samples)]
    layer_ids = _layer_ids(str(model))
    route = capture_route(sglang.__version__)
    sglang_ids = sglang_layer_ids(text_model_type(read_config(str(model))), layer_ids)
    settings = SglangSettings(
        tp_size=1,
        mem_fraction_static=0.7,
        chunked_prefill_size=args.budget,
        attention_backend=args.attention,
        requests_per_call=4096,
        engine_args=extra,
    )
    capture = engine_args(route, sglang_ids, settings, str(model), "bfloat16", False)
    plain = {k: v for k, v in capture.items() if k not in CAPTURE_ARGS}
    tokens = int(shard.sample_offsets[-1])
    per_call = settings.requests_per_call
    info = {"sglang_version": sglang.__version__, "route": route, "model": str(model), "tokens": tokens}
    info["plain_seconds"] = _timed_engine(Engine, plain, requests, per_call)

    class CaptureOnly(Engine):
        run_scheduler_process_func = staticmethod(
            functools.partial(_capture_only_scheduler, route, sglang_ids)
        )

    info["capture_only_seconds"] = _timed_engine(CaptureOnly, capture, requests, per_call)
    info["eyas"] = extract_shard_sglang(
        big,
        str(args.work / "speed.zarr"),
        str(model),
        layer_ids=layer_ids,
        model_id=args.dummy or "smollm2",
        settings=settings,
        threads=args.threads,
    )
    rates = {
        "sglang_alone": tokens / info["plain_seconds"],
        "sglang_capture_on": tokens / info["capture_only_seconds"],
        "eyas": info["eyas"]["tokens_per_s"],
    }
    info["tokens_per_s"] = rates
    info["ratio_to_sglang_alone"] = {k: v / rates["sglang_alone"] for k, v in rates.items()}
    info["command"] = shlex.join([sys.executable, *sys.argv])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({"tokens_per_s": rates, "ratio": info["ratio_to_sglang_alone"]}))


def _repeated_shard(src: str, dst: Path, tokens: int) -> str:
    """The shard's non-empty samples repeated up to `tokens` tokens: a workload long enough to time."""
    from eyas.store import read_token_shard, write_token_shard

    shard = read_token_shard(src)
    samples = [shard.sample(i) for i in range(shard.num_samples) if len(shard.sample(i)[0])]
    out, total = [], 0
    while total < tokens:
        out.append(samples[len(out) % len(samples)])
        total += len(out[-1][0])
    write_token_shard(dst, out, [f"r{i}" for i in range(len(out))], dict(shard.attrs))
    return str(dst)


def step_sglang(args) -> None:
    import sglang

    from eyas.config import SglangSettings
    from eyas.extract.sglang_backend import extract_shard_sglang
    from eyas.store import read_token_shard

    big = _repeated_shard(args.shard, args.work / "big-tokens.zarr", args.tokens)
    shard = read_token_shard(big)
    requests = [shard.sample(i)[0].tolist() for i in range(shard.num_samples)]
    info = {"sglang_version": sglang.__version__, "big_tokens": int(shard.sample_offsets[-1])}
    info["plain_seconds"] = _plain_engine_seconds(args, requests)
    runs = [("sglang", args.budget, args.shard), ("sglang-chunked", args.chunk, args.shard)]
    runs.append(("sglang-big", args.budget, big))
    for name, chunk, source in runs:
        settings = SglangSettings(
            tp_size=1,
            mem_fraction_static=0.7,
            chunked_prefill_size=chunk,
            attention_backend=args.attention,
            requests_per_call=4096,
        )
        info[name] = extract_shard_sglang(
            source,
            str(args.work / f"{name}.zarr"),
            args.model,
            layer_ids=_layer_ids(args.model),
            model_id="smollm2",
            settings=settings,
            threads=16,
        )
    _record(args.work, "sglang", info)


def _tap_errors(store, reference, taps: int) -> list[dict]:
    """Per tap (aux taps then final): relative RMS error and max abs error against the reference."""
    sq = np.zeros(taps + 1)
    ref_sq = np.zeros(taps + 1)
    worst = np.zeros(taps + 1)
    for i in range(reference.num_samples):
        got = torch.cat(store.sample(i), dim=1).float()  # [T, (K+1)H]
        want = torch.cat(reference.sample(i), dim=1).float()
        n = got.shape[0]
        diff = (got - want).view(n, taps + 1, -1)
        sq += diff.pow(2).sum((0, 2)).double().numpy()
        ref_sq += want.view(n, taps + 1, -1).pow(2).sum((0, 2)).double().numpy()
        if n:
            worst = np.maximum(worst, diff.abs().amax((0, 2)).numpy())
    return [
        {"rel_rms": float(np.sqrt(s / r)), "max_abs": float(w)}
        for s, r, w in zip(sq, ref_sq, worst, strict=True)
    ]


def step_compare(args) -> None:
    from eyas.store import HiddenStore

    steps = json.loads((args.work / STEPS_FILE).read_text())
    reference = HiddenStore(args.work / "hf-fp32.zarr")
    taps = int(reference.attrs["num_taps"])
    result = {"steps": steps, "layer_ids": reference.attrs["layer_ids"], "stores": {}}
    neighbours = {n: HiddenStore(args.work / f"hf-fp32-{n}.zarr") for n in ("prev", "next")}
    for name in ("hf-bf16", "sglang", "sglang-chunked"):
        store = HiddenStore(args.work / f"{name}.zarr")
        result["stores"][name] = {
            "vs_fp32": _tap_errors(store, reference, taps),
            **{f"vs_fp32_{n}": _tap_errors(store, other, taps)[:taps] for n, other in neighbours.items()},
            "attrs": dict(store.attrs),
        }
    chunked = HiddenStore(args.work / "sglang-chunked.zarr")
    result["chunked_vs_unchunked"] = _tap_errors(chunked, HiddenStore(args.work / "sglang.zarr"), taps)
    sg = steps["sglang"]
    plain = sg["big_tokens"] / sg["plain_seconds"]
    result["throughput"] = {
        "tokens": sg["big_tokens"],
        "plain_sglang_tokens_per_s": plain,
        "eyas_sglang_tokens_per_s": sg["sglang-big"]["tokens_per_s"],
        "ratio": sg["sglang-big"]["tokens_per_s"] / plain,
        "eyas_chunked_small_shard_tokens_per_s": sg["sglang-chunked"]["tokens_per_s"],
        "hf_bf16_small_shard_tokens_per_s": steps["hf"]["hf-bf16"]["tokens_per_s"],
    }
    result["command"] = shlex.join([sys.executable, *sys.argv])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, entry in result["stores"].items():
        print(name, " ".join(f"{e['rel_rms']:.2e}/{e['max_abs']:.3f}" for e in entry["vs_fp32"]))
    print("throughput", json.dumps(result["throughput"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["hf", "sglang", "compare", "speed"])
    ap.add_argument("--model")
    ap.add_argument("--shard")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=16384, help="tokens per forward (HF budget, SGLang chunk)")
    ap.add_argument("--chunk", type=int, default=64, help="chunked-prefill size of the chunked run")
    ap.add_argument("--tokens", type=int, default=2_000_000, help="tokens of the throughput workload")
    ap.add_argument("--attention", default="triton", help="SGLang attention backend")
    ap.add_argument("--out", default="bench/results/sglang-h200-smollm2.json")
    ap.add_argument("--dummy", choices=["llama-8b"], help="speed: random weights of this shape")
    ap.add_argument("--threads", type=int, default=16, help="speed: the job's threads (writer pool)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    steps = {"hf": step_hf, "sglang": step_sglang, "compare": step_compare, "speed": step_speed}
    steps[args.step](args)


if __name__ == "__main__":
    main()
