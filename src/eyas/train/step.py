"""One optimizer step's forward and backward passes: the teacher on the device, the MLP recompute
decision, global loss normalisers, gradients summed over ranks."""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from eyas.model.drafter import mlp_recompute_needed
from eyas.train import distributed
from eyas.train.loss import step_counts, teacher_cache_fits, teacher_in_vocab
from eyas.train.parallel import Replicated, padding_batch


class Teacher:
    """The target head on the training device: full [V, H] for the in-vocab argmax, [D, H] draft rows."""

    def __init__(self, head: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor, device, dtype):
        self.head = head.to(device, dtype)  # [V, H] teacher matmuls run in the autocast dtype
        self.draft_head = self.head[(torch.arange(len(d2t)) + d2t).to(device)]  # [D, H]
        self.t2d = t2d.to(device)  # [V] bool


def activation_budget(device: torch.device) -> float:
    """Bytes of MLP activations a step may keep before they are recomputed instead: a quarter of
    the GPU's memory (on an H200 at the 8B shape, 4 x 4096-token batches keep theirs, 13 GB, and a
    64k-token sample, 53 GB, recomputes); unbounded on CPU, where host memory is rarely the limit."""
    if device.type != "cuda":
        return math.inf
    return torch.cuda.get_device_properties(device).total_memory / 4


def train_step(
    spread: Replicated, teacher: Teacher, micro, settings, amp, device, stop: bool = False
) -> dict:
    """Forward/backward of this rank's micro-batches (None = an empty slot), gradients summed over ranks.

    Every part's loss is normalised by the step's global count of loss-carrying positions, so the
    summed gradient is that of the whole global batch. Returns global metrics (no optimizer step);
    `stop` (this rank was asked to stop) rides on the metrics' all-reduce: metrics["stop"] is true on
    every rank when any rank was asked.
    """
    world: distributed.World = spread.world
    config = spread.drafter.config
    steps = settings.ttt_steps
    autocast = (lambda: torch.autocast(device.type, dtype=amp)) if amp is not None else nullcontext
    prepared = []
    counts = torch.zeros(steps, dtype=torch.int64)
    for batch in micro:
        if batch is None:
            if spread.runs_padding:
                taps = len(config.aux_layer_ids)
                pad = padding_batch(config.hidden_size, taps, device, teacher.head.dtype)
                prepared.append((pad, torch.zeros_like(pad.valid), False))
            continue
        # Hidden states in the teacher's dtype (the autocast dtype, else float32): under autocast
        # the drafter's fc would round float32 taps to it anyway.
        batch = batch.to(device, teacher.head.dtype)
        in_vocab = teacher_in_vocab(batch.final, teacher.head, teacher.t2d)  # [B, T] bool
        counts += torch.tensor(step_counts(batch.loss_mask, batch.valid, in_vocab, steps))
        prepared.append((batch, in_vocab, True))
    counts = distributed.all_reduce_sum(counts, world)  # global normalisers
    # sums: loss, tokens, then per step correct, cond_count, cond_correct
    sums = torch.zeros(2 + 3 * steps, dtype=torch.float64)
    for i, (batch, in_vocab, real) in enumerate(prepared):
        spread.gradient_sync(last_backward=i == len(prepared) - 1)
        with autocast():
            cached = None
            if teacher_cache_fits(batch.final, len(teacher.draft_head), teacher.head.dtype):
                with torch.no_grad():
                    cached = batch.final @ teacher.draft_head.T  # [B, T, D] once, shared by every step
            recompute = mlp_recompute_needed(
                batch.input_ids.numel(),
                config.intermediate_size,
                steps,
                2 if amp is not None else 4,
                activation_budget(device),
            )
            loss, m = spread.objective(
                batch,
                in_vocab,
                teacher.draft_head,
                steps=steps,
                step_weight=settings.step_weight,
                counts=counts.tolist(),
                teacher_logits=cached,
                recompute_mlp=recompute,
            )
        loss.backward()
        if real:
            part = [float(loss.detach()), batch.num_tokens, *m["correct"], *m["cond_count"]]
            sums += torch.tensor([*part, *m["cond_correct"]], dtype=torch.float64)
    spread.sum_gradients()
    sums = torch.cat([sums, torch.tensor([float(stop)], dtype=torch.float64)])  # + the stop requests
    sums, stops = distributed.all_reduce_sum(sums, world).split([len(sums) - 1, 1])
    correct, cond_count, cond_correct = sums[2:].view(3, steps)
    count = counts.tolist()
    return {
        "stop": bool(stops[0] > 0),
        "loss": float(sums[0]),
        "tokens": int(sums[1]),
        "count": count,
        "acc": [float(c) / n if n else 0.0 for c, n in zip(correct, count, strict=True)],
        "cond_acc": [
            float(c) / float(n) if n else 0.0 for c, n in zip(cond_correct, cond_count, strict=True)
        ],
    }
