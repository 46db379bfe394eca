"""Served evaluation on a GPU: the drafters inside SGLang (EAGLE-3), the same code as `rule served`.

    python3 bench/served.py --model /root/smollm2 --drafter results/train/drafter \
        --export results/export/sglang --set heldout=results/prepared/eval.jsonl \
        --set humaneval=results/assets/eval/humaneval.jsonl --k 3 4 5 --num-prompts 20 \
        --max-new-tokens 96 --concurrency 8 --attention-backend triton --out bench/results/served.json

Writes `run_served`'s JSON (accept length per set, drafter and k, per-position acceptance, tokens/s at
batch size 1 and at --concurrency against the plain engine, greedy equality with margins) with this
command line, the device and the versions added, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
from pathlib import Path

import torch

from eyas.config import EvaluateSettings, SglangSettings
from eyas.evaluate.stage_served import run_served


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="target HF model dir")
    parser.add_argument("--drafter", required=True, help="trained drafter dir (results/train/drafter)")
    parser.add_argument("--export", required=True, help="its SGLang export (results/export/sglang)")
    parser.add_argument("--set", action="append", required=True, help="NAME=PATH (heldout, humaneval)")
    parser.add_argument("--k", type=int, nargs="+", default=[3, 4, 5])
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument(
        "--engine-arg", action="append", default=[], help="KEY=JSON, an SGLang ServerArgs field"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--record", type=Path, help="write the first set's raw engine outputs here (test data)"
    )
    args = parser.parse_args()
    settings = EvaluateSettings(
        backend="sglang",
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.k,
        concurrency=args.concurrency,
    )
    extra = {key: json.loads(value) for key, _, value in (item.partition("=") for item in args.engine_arg)}
    engine = SglangSettings(attention_backend=args.attention_backend, engine_args=extra)
    sets = dict(item.partition("=")[::2] for item in args.set)
    record = {} if args.record else None
    result = run_served(
        record=record,
        set_paths=sets,
        set_formats={},
        drafter_dir=args.drafter,
        export_dir=args.export,
        model_dir=args.model,
        out_json=str(args.out),
        settings=settings,
        engine_settings=engine,
    )
    result["command"] = shlex.join([sys.executable, *sys.argv])
    result["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    result["torch"] = torch.__version__
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.record:
        args.record.write_text(json.dumps(record | {"command": result["command"]}) + "\n")
    print(
        f"{'set':<10} {'drafter':<10} {'k':>2} {'tau':>6} {'tau_sgl':>7} {'tok/s bs1':>9} {'x plain':>7} "
        f"{'tok/s C':>8} {'x plain':>7} {'equal':>6}"
    )
    for set_name, drafters in result["sets"].items():
        plain = result["plain"][set_name]
        print(
            f"{set_name:<10} {'plain':<10} {'':>2} {'':>6} {'':>7} {plain['tokens_per_s_bs1']:>9.0f} {'':>7} "
            f"{plain['tokens_per_s_batched']:>8.0f}"
        )
        for drafter, by_k in drafters.items():
            for k, r in by_k.items():
                eq = r["greedy_equal"]
                print(
                    f"{set_name:<10} {drafter:<10} {k:>2} {r['tau']:>6.3f} {r['tau_sglang']:>7.3f} "
                    f"{r['tokens_per_s_bs1']:>9.0f} {r['speedup_bs1']:>7.2f} "
                    f"{r['tokens_per_s_batched']:>8.0f} "
                    f"{r['speedup_batched']:>7.2f} {eq['equal']:>3}/{eq['prompts']}"
                )
    print("swap check:", json.dumps(result["swap_check"]), "timings:", json.dumps(result["timings"]))


if __name__ == "__main__":
    main()
