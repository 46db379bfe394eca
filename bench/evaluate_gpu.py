"""Real speculative decoding of a trained drafter on the GPU: tau, acceptance by position, speed.

    .venv/bin/python bench/evaluate_gpu.py --model results/assets/model --drafter results/train/drafter \
        --set heldout=results/prepared/eval.jsonl --set humaneval=results/assets/eval/humaneval.jsonl \
        --num-prompts 32 --max-new-tokens 128 --k 3 5 --out bench/results/evaluate_gpu.json

For each set, k and drafter (trained, untrained): `evaluate_specdec` on the device (fp32: greedy
equality holds there, bf16 does not), which also times plain decoding of the same prompts for the
speedup and checks the outputs token for token at temperature 0. Prints a table and writes JSON
(with this command line, device name and versions) to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from eyas.core.acceptance import max_prompt_tokens
from eyas.core.atomic import atomic_file
from eyas.evaluate.drafters import untrained_like
from eyas.evaluate.sets import load_prompt_set
from eyas.evaluate.specdec import evaluate_specdec
from eyas.model.drafter import Eagle3Drafter
from eyas.model.target import load_tokenizer, resolve_device


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="target HF model dir")
    parser.add_argument("--drafter", required=True, help="trained drafter dir")
    parser.add_argument("--set", action="append", required=True, help="NAME=PATH (heldout or humaneval)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, nargs="+", default=[3, 5], help="drafts per verify pass")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-untrained", action="store_true", help="skip the untrained baseline")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    command = shlex.join([sys.executable, *sys.argv])
    device = resolve_device(args.device)
    tokenizer = load_tokenizer(args.model)
    trained = Eagle3Drafter.from_pretrained(args.drafter).eval()
    drafters = {"trained": trained}
    if not args.no_untrained:
        drafters["untrained"] = untrained_like(trained, args.model)
    max_prompt = max_prompt_tokens(trained.config.max_position_embeddings, args.max_new_tokens, args.k)
    results = []
    for item in args.set:
        name, _, path = item.partition("=")
        prompts = load_prompt_set(name, path, tokenizer, args.num_prompts, max_prompt).prompts
        for k in args.k:
            for label, drafter in drafters.items():
                started = time.perf_counter()
                report = evaluate_specdec(
                    args.model, drafter, prompts,
                    max_new_tokens=args.max_new_tokens, num_draft_tokens=k,
                    eos_token_ids={tokenizer.eos_token_id}, aux_layer_ids=trained.config.aux_layer_ids,
                    device=device, dtype=torch.float32, temperature=args.temperature,
                )  # fmt: skip
                report.pop("per_prompt")
                seconds = time.perf_counter() - started
                results.append({"set": name, "k": k, "drafter": label, "bench_seconds": seconds, **report})
                print(f"done {name} k={k} {label}: tau {report['tau']:.3f}", flush=True)
    print(f"\n{'set':<10} {'k':>2} {'drafter':<10} {'tau':>6} {'spec tok/s':>10} {'plain tok/s':>11} "
          f"{'speedup':>7} {'equal':>6}  acceptance by position")  # fmt: skip
    for r in results:
        eq = r["greedy_equal"]
        equal = f"{eq['equal_prompts']}/{r['num_prompts']}" if eq["checked"] else "n/a"
        acc = " ".join("n/a" if a is None else f"{a:.2f}" for a in r["acceptance_by_position"])
        row = (
            f"{r['set']:<10} {r['k']:>2} {r['drafter']:<10} {r['tau']:>6.3f} {r['spec_tokens_per_s']:>10.1f} "
        )
        print(row + f"{r['greedy_tokens_per_s']:>11.1f} {r['speedup']:>7.3f} {equal:>6}  {acc}")
    meta = {
        "command": command,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "model": args.model,
        "drafter": args.drafter,
        "temperature": args.temperature,
    }
    with atomic_file(args.out) as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=2)
    print(f"\nwrote {args.out}\ncommand: {command}")


if __name__ == "__main__":
    main()
