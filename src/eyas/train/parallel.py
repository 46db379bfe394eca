"""How the drafter is spread over the data-parallel ranks (`train.parallel`).

`ddp`: every rank holds the whole drafter, its gradients and AdamW moments; after the step's backward
passes the gradients are summed in one flat all-reduce. `fsdp`: FSDP2 (`fully_shard`) keeps 1/W of
the weights, gradients and moments on each rank, gathers the full weights around each forward and
backward and reduce-scatters the gradients. That is for large hidden sizes: at H = 7168 the drafter
has ~1.1 B trainable parameters (docs/scale.md), 16 bytes each in fp32 weights, gradients and two
AdamW moments, plus its frozen fp32 copy of the target embedding; fsdp divides all of it by W between
steps (bench/parallel_memory.py counts it).

Both run the same step through `Objective`, the drafter and its TTT loss as one module: FSDP gathers
parameters around a module's forward, and the loss reads the drafter's norm and head. Both *sum*
gradients over ranks (each part's loss is already normalised by the step's global count), so the
updates are those of the whole global batch either way, up to float summation order.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from eyas.model.drafter import Eagle3Drafter
from eyas.train import distributed
from eyas.train.loader import Batch
from eyas.train.loss import ttt_loss_chunked

FSDP_PREFIX = "drafter."  # state-dict keys of the drafter inside Objective


class Objective(nn.Module):
    """The drafter's TTT loss on one micro-batch, as a module forward (see the module docstring)."""

    def __init__(self, drafter: Eagle3Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(
        self,
        batch: Batch,
        in_vocab: Tensor,
        draft_head: Tensor,
        *,
        steps: int,
        step_weight: float,
        counts: list[int],
        teacher_logits: Tensor | None,
        recompute_mlp: bool,
    ) -> tuple[Tensor, dict]:
        d = self.drafter
        hidden = d.ttt_hidden(batch.aux, batch.input_ids, steps, recompute_mlp)  # steps x [B, T, H]
        return ttt_loss_chunked(
            hidden,
            d.norm,
            d.lm_head.weight,
            batch.final,
            draft_head,
            in_vocab,
            batch.loss_mask,
            batch.valid,
            step_weight,
            counts=counts,
            teacher_logits=teacher_logits,
            compiled=d.compiled,
        )


class Replicated:
    """`ddp`: the whole drafter on every rank."""

    runs_padding = False  # an empty micro-batch (None) is skipped: no collective waits on it

    def __init__(self, drafter: Eagle3Drafter, world: distributed.World):
        self.drafter, self.world = drafter, world
        distributed.broadcast_parameters(drafter, world)
        self.objective = Objective(drafter)

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.objective.parameters() if p.requires_grad]

    def gradient_sync(self, last_backward: bool) -> None:
        """Called before each backward of a step; `last_backward` marks the step's last one."""

    def sum_gradients(self) -> None:
        distributed.sum_gradients(self.trainable(), self.world)

    def clip_gradients(self, max_norm: float) -> float:
        """Clip to a global norm; returns the norm before clipping (the same on every rank)."""
        return float(torch.nn.utils.clip_grad_norm_(self.trainable(), max_norm))

    def full_drafter(self) -> Eagle3Drafter | None:
        """The whole drafter with the current weights on rank 0 (None elsewhere). Collective."""
        return self.drafter if self.world.main else None

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """What a checkpoint stores of the optimizer (complete on rank 0). Collective."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)


class Sharded(Replicated):
    """`fsdp`: one FSDP2 unit over the whole drafter. The drafter has a single decoder layer, and its
    embedding, fc and head are used at every TTT step, so finer units would gather the same weights
    again without lowering the peak; what sharding saves is the persistent state (weights,
    gradients and moments), which one unit divides by W as well."""

    runs_padding = True  # every rank must join each forward/backward's all-gather and reduce-scatter

    def __init__(self, drafter: Eagle3Drafter, world: distributed.World, device: torch.device):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        super().__init__(drafter, world)  # same starting weights on every rank, then shard them
        mesh = init_device_mesh(device.type, (world.size,))
        fully_shard(self.objective, mesh=mesh)
        divide = getattr(self.objective, "set_gradient_divide_factor", None)  # older torch: the next name
        (divide or self.objective.set_reduce_scatter_divide_factor)(1.0)  # sum over ranks, as ddp does
        if device.type != "cuda":  # gloo has no pre-scaled sum (PREMUL_SUM), even by a factor of 1
            if not hasattr(self.objective, "set_force_sum_reduction_for_comms"):
                raise RuntimeError(
                    f"train.parallel: fsdp on CPU needs a torch with FSDP2's plain-sum reductions "
                    f"(set_force_sum_reduction_for_comms); this is torch {torch.__version__}"
                )
            self.objective.set_force_sum_reduction_for_comms(True)

    def gradient_sync(self, last_backward: bool) -> None:
        # Accumulate unsharded gradients over a step's micro-batches; reduce-scatter once, at the end.
        self.objective.set_requires_gradient_sync(last_backward)

    def sum_gradients(self) -> None:
        pass  # the last backward reduce-scattered them

    def clip_gradients(self, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.trainable(), max_norm)  # a DTensor: global norm
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _full_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.objective, options=options)  # complete on rank 0, {} elsewhere

    def full_drafter(self) -> Eagle3Drafter | None:
        state = self._full_state()
        if not self.world.main:
            return None
        with torch.device("meta"):
            plain = Eagle3Drafter(self.drafter.config)
        plain.load_state_dict({k.removeprefix(FSDP_PREFIX): v for k, v in state.items()}, assign=True)
        return plain.train(self.objective.training)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.objective, optimizer, options=options)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True)  # every rank read the same file
        set_optimizer_state_dict(self.objective, optimizer, state, options=options)


def spread_over_ranks(
    drafter: Eagle3Drafter, mode: str, world: distributed.World, device: torch.device
) -> Replicated:
    """The drafter (already on `device`, weights final or loaded) spread over the ranks by `mode`."""
    if mode == "fsdp" and world.active:
        return Sharded(drafter, world, device)
    return Replicated(drafter, world)


def padding_batch(hidden: int, taps: int, device: torch.device, dtype: torch.dtype) -> Batch:
    """A micro-batch that carries no loss and no tokens: what an FSDP rank runs for an empty slot, so
    it still joins the collectives. Its gradients are zeros (the loss is an empty sum)."""
    length = 4
    return Batch(
        aux=torch.zeros(1, length, taps * hidden, device=device, dtype=dtype),  # [1, 4, 3H]
        final=torch.zeros(1, length, hidden, device=device, dtype=dtype),  # [1, 4, H]
        input_ids=torch.zeros(1, length, dtype=torch.int64, device=device),
        loss_mask=torch.zeros(1, length, dtype=torch.int64, device=device),
        valid=torch.zeros(1, length, dtype=torch.bool, device=device),
        lengths=torch.zeros(1, dtype=torch.int64, device=device),
    )
