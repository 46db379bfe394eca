"""Trainer steps over batches whose shapes change every step, as real data gives them, by SDPA kernel set.

`bench/train.py` times steps on one fixed [rows, length] batch; the pipeline's batches differ in rows and
longest sample every step (`eyas.train.loader.plan_batches` over the sample lengths), and every new shape
can cost host-side set-up in a kernel library (cuDNN's attention builds an execution graph per shape).
Each case runs in a fresh interpreter: `passes` passes over the same `batches` shapes; pass 0 meets every
shape for the first time, pass 1 finds whatever was cached.

    python bench/train_shapes.py --out bench/results/train-shapes-h200.json

Sample lengths: `--lengths` (a JSON list, e.g. a real token shard's lengths), else a log-normal draw
around 370 tokens clipped to [16, 2048] (the GPU recipe's 7,486 samples average 373 tokens).
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

sys.path.insert(0, str(Path(__file__).parent))
from child import run_in_child  # noqa: E402
from train import SHAPES, TRAINED_SHARE, _drafter, synthetic_teacher  # noqa: E402 - bench/train.py

CASES = {  # name -> (eyas.model.drafter.ATTENTION_BACKENDS, rows padded to a multiple of)
    "eyas": ("default", 1),  # the kernels the package ships
    "torch-default": (None, 1),  # torch's own priority order
    "cudnn-only": (["CUDNN_ATTENTION"], 1),
    "efficient-only": (["EFFICIENT_ATTENTION"], 1),
    "eyas-pad64": ("default", 64),  # as the trainer loads on a GPU (loader.GPU_PAD_MULTIPLE)
}


def lengths_of(args) -> np.ndarray:
    if args.lengths:
        return np.array(json.loads(Path(args.lengths).read_text()), dtype=np.int64)
    rng = np.random.default_rng(0)
    return np.clip(np.exp(rng.normal(np.log(300), 0.7, args.samples)), 16, 2048).astype(np.int64)


def case(
    backends,
    pad: int,
    lengths: list[int],
    budget: int,
    batches: int,
    passes: int,
    draft: int,
    new_plans: bool,
) -> dict:
    """Child: `passes` x `batches` train steps on a plan's first batches (epoch 0's plan every pass, or
    epoch p's in pass p with `new_plans`: new shapes, as real epochs bring); per-pass seconds."""
    from torch.nn.attention import SDPBackend

    import eyas.model.drafter as drafter_module
    from eyas.config import TrainSettings
    from eyas.train.distributed import World
    from eyas.train.loader import Batch, plan_batches
    from eyas.train.parallel import spread_over_ranks
    from eyas.train.step import Teacher, train_step
    from eyas.train.trainer import param_groups, resolve_amp

    if backends != "default":
        drafter_module.ATTENTION_BACKENDS = (
            None if backends is None else [getattr(SDPBackend, b) for b in backends]
        )
    device = torch.device("cuda")
    shape = {**SHAPES["smollm2"], "draft": draft}
    lengths = np.array(lengths)
    amp = resolve_amp("auto", device)
    model = _drafter(shape, device)
    g = torch.Generator().manual_seed(1)
    head, d2t, t2d = synthetic_teacher(shape)  # its greedy tokens in the draft vocab, as real ones are
    teacher = Teacher(head, d2t, t2d, device, amp)
    spread = spread_over_ranks(model, "ddp", World(), device)
    optimizer = torch.optim.AdamW(param_groups(spread.objective, 0.0), lr=1e-4)
    settings = TrainSettings(ttt_steps=7, select_by_tau=False)
    h = shape["hidden"]

    def batch_of(rows: np.ndarray) -> Batch:
        lens = torch.as_tensor(lengths[rows])
        b, t = len(rows), -(-int(lens.max()) // pad) * pad
        valid = torch.arange(t)[None, :] < lens[:, None]
        # each row's last TRAINED_SHARE trained (the response), as in real batches
        trained = valid & (torch.arange(t)[None, :] >= (lens[:, None] * (1 - TRAINED_SHARE)).round())
        return Batch(
            aux=(torch.randn(b, t, 3 * h, generator=g) * valid[..., None]).bfloat16().pin_memory(),
            final=(torch.randn(b, t, h, generator=g) * valid[..., None]).bfloat16().pin_memory(),
            input_ids=(torch.randint(0, shape["vocab"], (b, t), generator=g) * valid).pin_memory(),
            loss_mask=trained.long().pin_memory(),
            valid=valid.pin_memory(),
            lengths=lens,
        )

    plans = [
        plan_batches(lengths, budget, seed=0, epoch=p if new_plans else 0)[:batches] for p in range(passes)
    ]
    out = {"batches": batches}
    for p in range(passes):
        data = [batch_of(rows) for rows in plans[p]]
        tokens = sum(b.num_tokens for b in data)
        out[f"pass{p}_tokens"] = tokens
        out[f"pass{p}_distinct_shapes"] = len({tuple(b.aux.shape[:2]) for b in data})
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in data:
            optimizer.zero_grad(set_to_none=True)
            train_step(spread, teacher, [batch], settings, amp, device)
            optimizer.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        out[f"pass{p}_seconds"] = seconds
        out[f"pass{p}_tokens_per_s"] = tokens / seconds
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def run_child(name: str, **kwargs) -> dict:
    backends, pad = CASES[name]
    result = run_in_child("train_shapes", "case", {"backends": backends, "pad": pad, **kwargs})
    return {"case": name, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", help="JSON list of sample lengths (default: a log-normal draw)")
    ap.add_argument("--samples", type=int, default=7486)
    ap.add_argument("--budget", type=int, default=8192, help="train.token_budget")
    ap.add_argument("--batches", type=int, default=24, help="steps per pass")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--draft", type=int, default=16384, help="draft vocab size")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ",".join(CASES))
    ap.add_argument("--new-plans", action="store_true", help="pass p steps through epoch p's plan")
    args = ap.parse_args()
    lengths = lengths_of(args).tolist()
    results = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "budget": args.budget,
        "mean_sample_tokens": float(np.mean(lengths)),
        "cases": [],
    }
    for name in args.cases.split(","):
        results["cases"].append(
            run_child(name, lengths=lengths, budget=args.budget, batches=args.batches, passes=args.passes,
                      draft=args.draft, new_plans=args.new_plans)
        )  # fmt: skip
        print(json.dumps(results["cases"][-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
