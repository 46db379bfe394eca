"""Data parallelism: which micro-batches a rank reads, gradient and metric reductions (the torchrun
launcher: launch.py).

One optimizer step consumes a *group* of `world * accum` consecutive micro-batches of the epoch plan;
rank r reads micro-batches `r*accum .. r*accum + accum - 1` of each group, so ranks read disjoint
samples and a run on W ranks with accum=1 sees the same global batch as one process with accum=W.
The last group of an epoch is padded with empty micro-batches (None) instead of dropping the tail:
every sample is used exactly once per epoch and the padding is counted. Losses are normalised by the
step's *global* count of loss-carrying positions and gradients are summed over ranks, so the update
equals that of the whole global batch in one process (up to float summation order).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1


def current_world() -> World:
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return World()


# --------------------------------------------------------------------------- planning (pure)
def step_groups(plan: list[np.ndarray], world_size: int, accum: int) -> list[list[np.ndarray | None]]:
    """Split an epoch plan into optimizer steps of `world_size * accum` micro-batches, the last padded
    with None. Every micro-batch of `plan` appears exactly once."""
    per_step = world_size * accum
    groups = []
    for lo in range(0, len(plan), per_step):
        group: list[np.ndarray | None] = list(plan[lo : lo + per_step])
        groups.append(group + [None] * (per_step - len(group)))
    return groups


def rank_share(group: list, rank: int, accum: int) -> list:
    """The micro-batches rank `rank` reads from one step group."""
    return group[rank * accum : (rank + 1) * accum]


def padded_slots(num_batches: int, world_size: int, accum: int) -> int:
    """Empty micro-batches an epoch of `num_batches` needs (reported, never silently dropped)."""
    per_step = world_size * accum
    return math.ceil(num_batches / per_step) * per_step - num_batches


# --------------------------------------------------------------------------- reductions
def all_reduce_sum(x: torch.Tensor, world: World) -> torch.Tensor:
    if world.active:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def sum_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """Sum gradients over ranks in one flat all-reduce (parameters without a gradient count as 0)."""
    if not world.active:
        return
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(reduced)


def broadcast_parameters(model: torch.nn.Module, world: World) -> None:
    """Start every rank from rank 0's weights (they are seeded alike; this makes it a guarantee)."""
    if world.active:
        for t in model.state_dict().values():
            dist.broadcast(t, src=0)


def barrier(world: World) -> None:
    if world.active:
        dist.barrier()


# --------------------------------------------------------------------------- launch
def init_from_env(device_type: str) -> World:
    """Join the torchrun process group (gloo on CPU, NCCL on CUDA) when WORLD_SIZE > 1."""
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    return current_world()
