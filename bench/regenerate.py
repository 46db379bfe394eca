"""Regeneration on a GPU: the same conversations through SGLang and through Hugging Face `generate`.

    python3 bench/regenerate.py --model /root/smollm2 --conversations results/prepared/all.jsonl \
        --max-new-tokens 128 --hf-batch-size 64 --attention-backend triton --out bench/results/regenerate.json

Runs `regenerate_split` (the stage's code) once per backend on the same file, greedy, and reports
each run's counts, new tokens, wall seconds and new tokens/s (the SGLang engine's start-up is timed
apart), plus how many regenerated responses the two backends wrote identically (bf16 in both, so
near ties may differ).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from eyas.config import SglangSettings
from eyas.engine.sglang import start_engine
from eyas.engine.sglang_args import base_engine_args, generation_engine_args
from eyas.model.target import load_target, load_tokenizer
from eyas.regenerate.responses import HFGenerator, SglangGenerator, regenerate_split


def timed(fn) -> tuple[dict, float]:
    start = time.perf_counter()
    stats = fn()
    return stats, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--conversations", required=True, help="a prepared split (JSONL)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-length", type=int, default=896)
    parser.add_argument("--hf-batch-size", type=int, default=64)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--sampling-backend", default=None, help="SGLang sampling_backend, e.g. pytorch")
    parser.add_argument("--turns", default="last")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    run = dict(max_prompt_length=args.max_prompt_length, turns=args.turns)
    work = Path(tempfile.mkdtemp(prefix="eyas-regen-bench-"))
    results = {"command": shlex.join([sys.executable, *sys.argv]), "device": torch.cuda.get_device_name()}

    start = time.perf_counter()
    base = base_engine_args(
        SglangSettings(attention_backend=args.attention_backend), args.model, "bfloat16", False
    )
    engine = start_engine(generation_engine_args(base, 0), speculative=False, stage="bench regenerate")
    results["sglang_start_seconds"] = time.perf_counter() - start
    try:
        generate = SglangGenerator(
            engine,
            eos_token_ids={tokenizer.eos_token_id},
            max_new_tokens=args.max_new_tokens,
            temperature=0.0,
        )
        stats, seconds = timed(
            lambda: regenerate_split(args.conversations, work / "sglang.jsonl", generate, tokenizer, **run)
        )
    finally:
        engine.shutdown()
    results["sglang"] = stats | {"seconds": seconds, "new_tokens_per_s": stats["new_tokens"] / seconds}

    model = load_target(args.model, device="cuda", dtype=torch.bfloat16)
    generate = HFGenerator(
        model, tokenizer, batch_size=args.hf_batch_size, max_new_tokens=args.max_new_tokens, temperature=0.0
    )
    stats, seconds = timed(
        lambda: regenerate_split(args.conversations, work / "hf.jsonl", generate, tokenizer, **run)
    )
    results["hf"] = stats | {
        "seconds": seconds,
        "new_tokens_per_s": stats["new_tokens"] / seconds,
        "batch_size": args.hf_batch_size,
    }
    a = [json.loads(line) for line in (work / "sglang.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (work / "hf.jsonl").read_text().splitlines()]
    results["identical_responses"] = sum(x["messages"] == y["messages"] for x, y in zip(a, b, strict=True))
    results["records"] = len(a)
    results["sglang_over_hf"] = results["sglang"]["new_tokens_per_s"] / results["hf"]["new_tokens_per_s"]
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name in ("sglang", "hf"):
        r = results[name]
        print(
            f"{name:7} read {r['read']} regenerated {r['regenerated']} new tokens {r['new_tokens']} "
            f"{r['seconds']:.1f} s {r['new_tokens_per_s']:.0f} tok/s"
        )
    print(
        f"sglang / hf: {results['sglang_over_hf']:.2f}x; identical {results['identical_responses']}/{len(a)}"
    )


if __name__ == "__main__":
    main()
