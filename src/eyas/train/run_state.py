"""Where a run stands: the run state (`RunState`) and the process's RNG states (`rng_state`), the parts
of a checkpoint's train state besides the weights, optimizer and scheduler (checkpoint.py saves them).

Both hold only tensors and plain Python values, so a checkpoint loads with
`torch.load(weights_only=True)`; numpy's RNG state is a tensor for that reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class RunState:
    """Where a run stands: with the weights, optimizer, scheduler and RNG states, the checkpoint.

    A run restored from it continues as if it had never stopped (same log rows, same weights)."""

    seen: torch.Tensor
    """[num_samples] int32: uses of each sample this epoch by this rank (the checkpoint holds the sum
    over ranks; on resume rank 0 takes it and the other ranks start from zero)."""
    step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """The epoch in progress (0-based)."""
    group_in_epoch: int = 0
    """Step groups of this epoch already taken (where a resumed epoch picks up)."""
    tokens: int = 0
    """Loss-carrying tokens trained on, all ranks."""
    seconds: float = 0.0
    """Time spent in optimizer steps (throughput; not part of the result)."""
    log_rows: list[list] = field(default_factory=list)
    """Every row of the step log so far (`TrainLog` writes them)."""
    epochs: list[dict] = field(default_factory=list)
    """One record per finished epoch: coverage, padding, held-out metrics."""
    best: dict = field(default_factory=dict)
    """The epoch whose weights are kept ({epoch, step, simulated_tau}); empty without selection."""


def rng_state() -> dict:
    """Every RNG a training step could draw from (torch CPU, CUDA, numpy, Python)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Every RNG back to what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
