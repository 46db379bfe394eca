"""Where one trainer step's time goes: launches against device time, at the GPU recipe's drafter shape.

The pipeline's trainer ran at 60k tok/s (bench/results/recipe-h100-smollm2-cut-engines4.json) where
bench/train.py's fixed batches reach 196k-257k, and its step time fits ~63 ms a step plus ~5.3 us a padded
token: a fixed cost that suggests the host's kernel launches, not the GPU, set the pace at SmolLM2's
size. Each case is one `step.train_step` plus the AdamW step (as bench/train.py times them) on ROWS x
LENGTH tokens, profiled after warm-up in a fresh interpreter. It reports:

- the median wall time of three unprofiled steps;
- the kernels one step launches (CUDA) or its aten op calls (CPU);
- on CUDA the kernels' summed device time and its share of the wall time (well under 1: the launches
  set the pace);
- the ops with the most calls and with the most self time.

`--attention masked lse` runs every shape with each of `train.tree_attention`'s implementations (steps a
second against rows a step: the trade between batch size and optimizer steps), `--compile off on` with
`train.compile` off and on (`first_step_seconds`: the compilation's wait).

    python bench/train_profile.py --device cuda --shapes 16x1024 4x1024 --attention masked lse \
        --compile off on --out OUT/train-profile.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from child import run_in_child
from train import SHAPES, sync, trainer_step

RECIPE_DRAFT_VOCAB = 16384  # config/gpu-smollm2.yaml vocab.draft_vocab_size


def case_profile(
    rows: int,
    length: int,
    device_name: str,
    ttt: int = 7,
    attention: str = "masked",
    compiled: bool = False,
    draft_vocab: int = RECIPE_DRAFT_VOCAB,
) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device_name)
    shape = SHAPES["smollm2"] | {"draft": draft_vocab}
    step = trainer_step(shape, rows, length, device, ttt, attention, compiled)
    walls = []
    for _ in range(5):  # two warm-up steps (allocator, kernel caches), three timed
        sync(device)
        began = time.perf_counter()
        step()
        sync(device)
        walls.append(time.perf_counter() - began)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    ops = prof.key_averages()
    wall = statistics.median(walls[2:])
    result = {
        "tokens_per_step": rows * length,
        "seconds_per_step": wall,
        "tokens_per_s": rows * length / wall,
        "steps_per_s": 1 / wall,
        "first_step_seconds": walls[0],  # with train.compile: the compilation's wait
    }
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6  # kernel durations, us -> s
        result |= {
            "kernels_per_step": len(kernels),
            "device_seconds": busy,
            "device_share_of_wall": busy / wall,
        }
        by_time = sorted(ops, key=lambda e: -e.self_device_time_total)
        result["top_by_self_device_ms"] = [
            [e.key, e.self_device_time_total / 1e3, e.count] for e in by_time[:12]
        ]
    else:
        result["aten_calls_per_step"] = sum(e.count for e in ops if e.key.startswith("aten::"))
        by_time = sorted(ops, key=lambda e: -e.self_cpu_time_total)
        result["top_by_self_cpu_ms"] = [[e.key, e.self_cpu_time_total / 1e3, e.count] for e in by_time[:12]]
    result["top_by_calls"] = [[e.key, e.count] for e in sorted(ops, key=lambda e: -e.count)[:12]]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--shapes", nargs="+", default=["16x1024", "4x1024"], help="ROWSxLENGTH batches")
    ap.add_argument("--ttt", type=int, default=7, help="TTT steps (the recipe's train.ttt_steps)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per case")
    ap.add_argument("--draft-vocab", type=int, default=RECIPE_DRAFT_VOCAB, help="vocab.draft_vocab_size")
    ap.add_argument(
        "--attention", nargs="+", default=["masked"], choices=["masked", "lse"], help="train.tree_attention"
    )
    ap.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on"], help="train.compile")
    args = ap.parse_args()
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cases = []
    for shape in args.shapes:
        rows, length = (int(x) for x in shape.split("x"))
        for attention, compiled in itertools.product(args.attention, args.compile):
            kwargs = {
                "rows": rows, "length": length, "device_name": device, "ttt": args.ttt,
                "draft_vocab": args.draft_vocab, "attention": attention, "compiled": compiled == "on",
            }  # fmt: skip
            result = run_in_child("train_profile", "case_profile", kwargs, args.threads)
            case = {"rows": rows, "length": length, "attention": attention, "compile": compiled}
            cases.append(case | result)
            print(json.dumps(cases[-1])[:400])
    results = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu x{args.threads} threads",
        "torch": torch.__version__,
        "draft_vocab": args.draft_vocab,
        "cases": cases,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
