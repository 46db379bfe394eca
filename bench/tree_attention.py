"""A TTT step's attention, masked against the log-sum-exp form (`train.tree_attention`), side by side.

    python bench/tree_attention.py --device cpu --threads 1 --out bench/results/tree-attention-cpu.json
    python bench/tree_attention.py --device cuda --rows 16 --out OUT/tree-attention.json   # the GPU kit

Forward and backward of `eyas.model.drafter.tree_attention` over every step of a TTT unroll (the
recipe's SmolLM2 drafter: 9 heads of 64, 7 steps) at each length, in both forms on the same inputs;
the best of `--repeats` runs each, and the largest difference of output and gradients between them
(relative to each tensor's largest value).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time

import torch

from eyas.core.atomic import atomic_file
from eyas.model.drafter import tree_attention


def unroll(impl: str, inputs: list[torch.Tensor], steps: int) -> tuple[float, list[torch.Tensor]]:
    """Seconds of the attention's forward and backward over `steps` TTT steps; the output and grads."""
    q, k0, v0, kd_all, vd_all = inputs
    for t in inputs:
        t.grad = None
    if q.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = []
    for k in range(steps):
        out = tree_attention(q[k], k0, v0, kd_all[:, :, :, :k], vd_all[:, :, :, :k], impl=impl)
        outs.append(out)
    torch.stack(outs).float().square().sum().backward()
    if q.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return seconds, [torch.stack(outs).detach().float()] + [t.grad.float() for t in inputs]


def relative_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Each tensor's largest difference over its largest value, the largest of them (the output, then
    the grads of q, k0, v0, k_diag, v_diag)."""
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want, strict=True))


def case(rows: int, length: int, steps: int, dtype: torch.dtype, device: str, repeats: int) -> dict:
    torch.manual_seed(0)
    heads, head = 9, 64
    shape = (rows, heads, length, head)
    inputs = [
        torch.randn(steps, *shape, dtype=dtype, device=device),  # one query set per step
        torch.randn(*shape, dtype=dtype, device=device),
        torch.randn(*shape, dtype=dtype, device=device),
        torch.randn(rows, heads, length, steps, head, dtype=dtype, device=device),
        torch.randn(rows, heads, length, steps, head, dtype=dtype, device=device),
    ]
    inputs = [t.requires_grad_() for t in inputs]
    result, tensors = {}, {}
    for impl in ("masked", "lse"):
        times = []
        for _ in range(repeats):
            seconds, tensors[impl] = unroll(impl, inputs, steps)
            times.append(seconds)
        result[f"{impl}_seconds"] = round(min(times), 4)
    result["masked_over_lse"] = round(result["masked_seconds"] / result["lse_seconds"], 3)
    result["max_relative_difference"] = relative_difference(tensors["lse"], tensors["masked"])
    if dtype != torch.float32:  # how far each form's rounding is from the float32 result
        exact = unroll("masked", [t.detach().float().requires_grad_() for t in inputs], steps)[1]
        for impl in ("masked", "lse"):
            result[f"{impl}_relative_difference_to_float32"] = relative_difference(tensors[impl], exact)
    return {
        "rows": rows,
        "length": length,
        "steps": steps,
        "dtype": str(dtype).removeprefix("torch."),
        **result,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--steps", type=int, default=7, help="TTT steps (the recipe's train.ttt_steps)")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = [
        case(args.rows, length, args.steps, getattr(torch, dtype), args.device, args.repeats)
        for length in args.lengths
        for dtype in args.dtypes
    ]
    device = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"{platform.processor()} ({args.threads} threads)"
    )
    command = shlex.join([sys.executable, *sys.argv])
    report = {"command": command, "device": device, "torch": torch.__version__, "cases": cases}
    with atomic_file(args.out) as fh:
        fh.write(json.dumps(report, indent=2) + "\n")
    for c in cases:
        print(c)


if __name__ == "__main__":
    main()
