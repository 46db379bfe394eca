"""How much of each training batch is real tokens, by token budget: the trainer's batch plan
(`eyas.train.loader.plan_batches`) with its sort windows of 64 samples (before) and of WINDOW_BATCHES
budgets (now), over a real token shard's sample lengths. No model, no GPU: the plan depends only on the
lengths.

    python bench/loader_padding.py --tokens RUN/results/tokens/train --out loader-padding.json

The GPU step costs a fixed ~63 ms plus ~5.3 us a padded token (SmolLM2 drafter, 7 TTT steps, H100/H200:
the two pipeline runs of bench/results/recipe-h100-smollm2-cut-engines4.json and issue 26, 8k and 32k
budgets); `step_model` applies that line to each plan, a forecast to be checked on the GPU.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from eyas.store import read_token_shard
from eyas.train import loader

STEP_FIXED_S, STEP_PER_PADDED_TOKEN_S = 0.063, 5.3e-6  # fitted to the two GPU runs (docstring)


def shard_lengths(tokens_dir: Path) -> np.ndarray:
    shards = sorted(tokens_dir.glob("shard-*.zarr"))
    if not shards:
        raise SystemExit(f"{tokens_dir}: no token shards (shard-*.zarr)")
    return np.concatenate([np.diff(np.asarray(read_token_shard(s).sample_offsets)) for s in shards])


def measure(lengths: np.ndarray, budget: int, pad_multiple: int, window_batches: int) -> dict:
    """One epoch's plan at `budget` with sort windows of max(64, window_batches budgets) samples."""
    saved = loader.WINDOW_BATCHES
    loader.WINDOW_BATCHES = window_batches
    try:
        plan = loader.plan_batches(lengths, budget, seed=0, epoch=0)
        window = loader.sort_window(lengths, budget)
    finally:
        loader.WINDOW_BATCHES = saved
    real = sum(int(lengths[rows].sum()) for rows in plan)
    padded = sum(len(rows) * -(-int(lengths[rows].max()) // pad_multiple) * pad_multiple for rows in plan)
    seconds = len(plan) * STEP_FIXED_S + padded * STEP_PER_PADDED_TOKEN_S
    return {
        "sort_window_samples": window,
        "steps": len(plan),
        "real_tokens_per_step": real / len(plan),
        "real_share_of_padded": real / padded,
        "step_model_real_tokens_per_s": real / seconds,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=Path, required=True, help="a tokenize output folder (shard-*.zarr)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[512, 8192, 16384, 32768])
    ap.add_argument("--pad-multiple", type=int, default=loader.GPU_PAD_MULTIPLE)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    lengths = shard_lengths(args.tokens)
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "samples": len(lengths),
        "mean_length": float(lengths.mean()),
        "length_percentiles_10_50_90_99": np.percentile(lengths, [10, 50, 90, 99]).tolist(),
        "pad_multiple": args.pad_multiple,
        "step_model": {"fixed_s": STEP_FIXED_S, "per_padded_token_s": STEP_PER_PADDED_TOKEN_S},
        "budgets": {
            str(b): {
                "window_64": measure(lengths, b, args.pad_multiple, 0),
                f"window_{loader.WINDOW_BATCHES}_budgets": measure(lengths, b, args.pad_multiple,
                                                                   loader.WINDOW_BATCHES),
            }
            for b in args.budgets
        },
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["budgets"], indent=1))


if __name__ == "__main__":
    main()
