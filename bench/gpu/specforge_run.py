"""Run SpecForge 0.2.0's own trainer (`specforge train --config RUN_YAML`) in this process and measure it.

    python bench/gpu/specforge_run.py --config run.yaml --out metrics.json [--cpu-reference-loss]

With one process SpecForge's launcher runs the worker in the calling process (specforge/launch_plan.py
`build_launch_plan`: a world size of 1 gives a "worker" plan, no torchrun), so `specforge.cli.main` is
called here and the process's own CUDA allocator statistics are SpecForge's. Nothing in SpecForge's
math is changed; two wrappers only observe:
  - `Eagle3TrainStrategy.forward_loss` (specforge/training/strategies/base.py): counts the tokens and
    loss positions of each batch and stamps the time of each optimizer step (the next call starts it;
    on CUDA after a synchronize, which costs nothing extra: SpecForge's own per-step metrics call
    `.item()`, specforge/training/controller.py);
  - the run's console logger (`specforge.training.assembly._logger`): keeps every logged step's metrics
    (per-TTT-step losses and accuracies, lr, SpecForge's own perf/ figures).

--cpu-reference-loss (CPU smoke runs only): SpecForge's soft cross-entropy is a Triton kernel
(specforge/core/loss.py `LogSoftmaxLoss`, launched with a CUDA grid), the one part of the offline
EAGLE-3 path that needs a GPU. This flag swaps in the same function in plain torch, the file's own
reference `_compute_loss` (-sum_v p * log_softmax(logits) over masked rows, mean over B*T rows).

Writes --out: wall time, steps, tokens, tokens/s (whole run, and from the end of the first step, which
carries torch.compile's warm-up), peak CUDA memory (max_memory_allocated / max_memory_reserved) and the
logged metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def reference_loss(logits, target_p, position_mask):
    """specforge/core/loss.py `_compute_loss` without torch.compile: the Triton kernel's function."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=2)
    return -torch.sum(position_mask * (target_p * logp), 2).mean()


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        try:
            return [float(v) for v in value]
        except (TypeError, ValueError):
            return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the SpecForge run.yaml (eyas specforge-prepare)")
    parser.add_argument("--out", required=True, help="JSON with timing, memory and the logged metrics")
    parser.add_argument("--cpu-reference-loss", action="store_true", help="plain-torch loss (CPU only)")
    args = parser.parse_args(argv)

    import specforge.cli
    import specforge.training.assembly as assembly
    import torch
    from specforge.training.strategies.base import Eagle3TrainStrategy

    if args.cpu_reference_loss:
        from specforge.core import loss

        loss.LogSoftmaxLoss.apply = staticmethod(reference_loss)

    cuda = torch.cuda.is_available()
    calls: list[dict] = []  # one per forward_loss call: start time, tokens, loss positions
    logged: list[dict] = []
    forward_loss = Eagle3TrainStrategy.forward_loss

    def counted_forward_loss(self, batch, ctx=None):
        if cuda:
            torch.cuda.synchronize()  # the previous step's kernels end before its time is taken
        t = batch.tensors
        calls.append(
            {
                "start": time.perf_counter(),
                "tokens": int(t["attention_mask"].sum()),
                "loss_positions": int((t["loss_mask"] != 0).sum()),
            }
        )
        return forward_loss(self, batch, ctx)

    Eagle3TrainStrategy.forward_loss = counted_forward_loss
    console = assembly._logger

    def keeping_logger(metrics, step):
        logged.append({"step": step, **{k: _number(v) for k, v in metrics.items()}})
        console(metrics, step)

    assembly._logger = keeping_logger

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    rc = specforge.cli.main(["train", "--config", args.config])
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    tokens = sum(c["tokens"] for c in calls)
    after_first = sum(c["tokens"] for c in calls[1:])
    # steps 2..N-1: from the start of the second step to the start of the last (no warm-up, no save)
    steady = (calls[-1]["start"] - calls[1]["start"]) if len(calls) > 2 else None
    steady_tokens = sum(c["tokens"] for c in calls[1:-1])
    result = {
        "rc": rc,
        "config": os.path.abspath(args.config),
        "cpu_reference_loss": args.cpu_reference_loss,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "wall_s": wall,
        "steps": len(calls),
        "tokens": tokens,
        "loss_positions": sum(c["loss_positions"] for c in calls),
        "tokens_per_s": tokens / wall if wall else None,
        "tokens_after_first_step": after_first,
        "steady_tokens_per_s": steady_tokens / steady if steady else None,
        "first_step_start_s": calls[0]["start"] - start if calls else None,
        "peak_cuda_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_cuda_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "logged": logged,
        "argv": sys.argv,
    }
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "logged"}, indent=1))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
