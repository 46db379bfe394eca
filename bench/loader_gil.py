"""Do the training loader's reader threads slow the trainer's own thread? Their share of the GIL.

The trainer's step at the GPU recipe's drafter shape is launch-bound: its thread spends the step in
Python and in PyTorch's dispatch, where the loader's reader threads (the same process) also want the
GIL for their Python work between reads and decodes. In the pipeline the compiled 16k step took 175 ms
where the bench's, with no loader beside it, takes 85 ms (bench/results/epochs16k-sweep-h100-smollm2-
demo.json). This stands a fixed, dispatch-bound CPU "step" (`--ops` tiny in-place tensor ops, as many
small kernel launches) in for the trainer's and times it alone, then taking one loader batch before
each step with 1, 2, 4 readers (the pipeline's `train.loader_readers`) as threads and as worker
processes (`train.loader_processes`), then alone again:

    .venv/bin/python bench/loader_gil.py --out OUT.json [--readers 1 2 4] [--kinds threads processes] \
        [--tokens 600000] [--store RUN/results/hidden/train/shard-00000.zarr \
         --token-shard RUN/results/tokens/train/shard-00000.zarr]

Without `--store` it writes a synthetic fp8 store of the recipe's shape and layout (16 chunks a shard).
Reported per case: the step's median and mean ms, its ratio to the step alone (the first and last
alone runs' mean), and the seconds the loop waited for batches (not in the step's time). On a machine
with fewer cores than readers + 1 the readers also take cores from the step; the JSON names the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from loader_storage import write_pair

from eyas.train.loader import PairedLoader


def dispatch_step(ops: int, x: torch.Tensor) -> None:
    """`ops` tiny in-place ops: the thread's time goes to Python and PyTorch's dispatch, not to maths."""
    for _ in range(ops):
        x.add_(1.0)


def step_times(steps: int, ops: int, batches=None) -> dict:
    """The step's wall ms over `steps` steps, one batch taken (untimed) before each when given."""
    x, times, waited = torch.zeros(16), [], 0.0
    dispatch_step(ops, x)  # warm
    for _ in range(steps):
        if batches is not None:
            started = time.perf_counter()
            next(batches)
            waited += time.perf_counter() - started
        started = time.perf_counter()
        dispatch_step(ops, x)
        times.append(1000 * (time.perf_counter() - started))
    return {
        "median_ms": round(statistics.median(times), 2),
        "mean_ms": round(statistics.mean(times), 2),
        "waited_s": round(waited, 2),
    }


def beside_loader(
    tok: str, hid: str, readers: int, processes: bool, budget: int, steps: int, ops: int
) -> dict:
    loader = PairedLoader([tok], [hid], budget, 0, {}, readers=readers, processes=processes)
    plan = loader.plan(0)
    if processes:  # the workers' one-time start (a forkserver, imports, stores) is not the question
        next(loader.batches(plan[:1]))
    batches = loader.batches([plan[i % len(plan)] for i in range(steps + readers + 2)])
    try:
        kind = "processes" if processes else "threads"
        return {"readers": readers, "as": kind, **step_times(steps, ops, batches)}
    finally:
        batches.close()
        loader.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--readers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument(
        "--kinds",
        nargs="+",
        choices=["threads", "processes"],
        default=["threads", "processes"],
        help="readers as threads (the trainer's default) or worker processes (train.loader_processes)",
    )
    ap.add_argument("--tokens", type=int, default=600_000, help="tokens of the synthetic store")
    ap.add_argument("--budget", type=int, default=16384, help="train.token_budget")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ops", type=int, default=4000, help="tiny tensor ops a step")
    ap.add_argument("--store", help="a run's hidden store instead of a synthetic one")
    ap.add_argument("--token-shard", help="the token shard of --store")
    args = ap.parse_args()
    if bool(args.store) != bool(args.token_shard):
        ap.error("--store and --token-shard go together")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="eyas-loader-gil-") as tmp:
        if args.store:
            tok, hid = args.token_shard, args.store
        else:
            tok, hid = write_pair(Path(tmp), "fp8_e4m3", args.tokens, chunks_per_shard=16)
        first = step_times(args.steps, args.ops)
        cases = [
            beside_loader(tok, hid, r, kind == "processes", args.budget, args.steps, args.ops)
            for kind in args.kinds
            for r in args.readers
        ]
        last = step_times(args.steps, args.ops)
    alone = (first["mean_ms"] + last["mean_ms"]) / 2
    for case in cases:
        case["x_alone"] = round(case["mean_ms"] / alone, 2)
        print(json.dumps(case), flush=True)
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "what": "a dispatch-bound step's time alone and beside the training loader's reader threads",
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "torch": torch.__version__,
        "store": args.store or "synthetic fp8_e4m3, 16 chunks a shard",
        "alone": {"first": first, "last": last},
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
