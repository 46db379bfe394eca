"""Hugging Face regeneration speed by batch size: the regenerate stage's own code (`regenerate_split` with
`HFGenerator`) on the first N prepared conversations, new tokens per second for each `batch_size`.

    python bench/regenerate_batch.py --conversations results/prepared/train.jsonl --model MODEL_DIR \\
        --out bench/results/regenerate-batch-cpu.json [--first 64] [--batch-sizes 8,32,64] [--threads 2]

Greedy, `max_new_tokens` 256 and `turns: last` as the default job's regenerate settings. Each batch runs
until its longest response ends, so larger batches trade padding for fewer per-step overheads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from eyas.model.target import load_target, load_tokenizer
from eyas.regenerate.responses import HFGenerator, regenerate_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", required=True, help="a prepared split (results/prepared/*.jsonl)")
    ap.add_argument("--model", required=True, help="the target's model dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--first", type=int, default=64, help="conversations measured")
    ap.add_argument("--batch-sizes", default="8,32,64")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=1024, help="tokenize.max_length")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    model = load_target(args.model)
    results = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": f"{platform.processor() or platform.machine()}, {args.threads} torch threads",
        "torch": torch.__version__,
        "cases": [],
    }
    with tempfile.TemporaryDirectory(prefix="eyas-regen-bench-") as tmp:
        subset = Path(tmp) / "subset.jsonl"
        with open(args.conversations) as src:
            subset.write_text("".join(itertools.islice(src, args.first)))
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            generate = HFGenerator(
                model, tokenizer, batch_size=batch_size, max_new_tokens=args.max_new_tokens, temperature=0.0
            )
            start = time.perf_counter()
            stats = regenerate_split(subset, Path(tmp) / f"out-{batch_size}.jsonl", generate, tokenizer,
                                     max_prompt_length=args.max_length - args.max_new_tokens)  # fmt: skip
            seconds = time.perf_counter() - start
            case = {
                "batch_size": batch_size,
                "seconds": seconds,
                "new_tokens": stats["new_tokens"],
                "new_tokens_per_s": stats["new_tokens"] / seconds,
                "regenerated": stats["regenerated"],
            }
            results["cases"].append(case)
            print(json.dumps(case), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
