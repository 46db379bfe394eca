"""One optimizer step: the forward and backward passes (`train_step`: the teacher on the device, the MLP
recompute decision, global loss normalisers, gradients summed over ranks), then clipping, the AdamW and
schedule steps and the step's log row (`OptimizerStep`), and each epoch's pace (`EpochPace`)."""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch

from eyas.config import TrainSettings
from eyas.model.drafter import mlp_recompute_needed
from eyas.train import distributed
from eyas.train.loss import step_counts, teacher_cache_fits, teacher_in_vocab
from eyas.train.parallel import Replicated, padding_batch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from eyas.train.checkpoint import Checkpointer
    from eyas.train.csvlog import TrainLog
    from eyas.train.loader import Batch
    from eyas.train.preemption import StopRequest
    from eyas.train.run_state import RunState

log = logging.getLogger("eyas.train")


class Teacher:
    """The target head on the training device: full [V, H] for the in-vocab argmax, [D, H] draft rows."""

    def __init__(
        self,
        head: torch.Tensor,
        d2t: torch.Tensor,
        t2d: torch.Tensor,
        device: torch.device,
        dtype: torch.dtype,
    ):
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
    spread: Replicated,
    teacher: Teacher,
    micro: list[Batch | None],
    settings: TrainSettings,
    amp: torch.dtype | None,
    device: torch.device,
    stop: bool = False,
) -> dict:
    """Forward/backward of this rank's micro-batches (None = an empty slot), gradients summed over ranks.

    Every part's loss is normalised by the step's global count of loss-carrying positions, so the
    summed gradient is that of the whole global batch. Returns global metrics (no optimizer step);
    `stop` (this rank was asked to stop) rides on the metrics' all-reduce: metrics["stop"] is true on
    every rank when any rank was asked.
    """
    steps = settings.ttt_steps
    prepared, counts = prepare_micro_batches(spread, teacher, micro, steps, device)
    counts = distributed.all_reduce_sum(counts, spread.world)  # global normalisers
    # sums: loss, tokens, then per step correct, cond_count, cond_correct
    sums = torch.zeros(2 + 3 * steps, dtype=torch.float64)
    for i, (batch, in_vocab, real) in enumerate(prepared):
        spread.gradient_sync(last_backward=i == len(prepared) - 1)
        loss, m = micro_backward(spread, teacher, batch, in_vocab, counts.tolist(), settings, amp, device)
        if real:
            part = [float(loss.detach()), batch.num_tokens, *m["correct"], *m["cond_count"]]
            sums += torch.tensor([*part, *m["cond_correct"]], dtype=torch.float64)
    spread.sum_gradients()
    return global_metrics(sums, counts.tolist(), stop, spread.world, steps)


def prepare_micro_batches(
    spread: Replicated, teacher: Teacher, micro: list[Batch | None], steps: int, device: torch.device
) -> tuple[list[tuple[Batch, torch.Tensor, bool]], torch.Tensor]:
    """(batch on the device, its in-vocab mask, real) per micro-batch to run, and this rank's [steps]
    counts of loss-carrying positions. An empty slot becomes an all-padding batch where the spread
    must run one (FSDP: every rank takes part in each collective), else it is skipped."""
    config = spread.drafter.config
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
    return prepared, counts


def micro_backward(
    spread: Replicated,
    teacher: Teacher,
    batch: Batch,
    in_vocab: torch.Tensor,
    counts: list[int],
    settings: TrainSettings,
    amp: torch.dtype | None,
    device: torch.device,
) -> tuple[torch.Tensor, dict]:
    """Forward (under autocast when `amp`) and backward of one micro-batch; returns its loss and metrics.
    `counts`: the step's global loss-carrying positions per TTT step (the loss's normalisers)."""
    autocast = torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext()
    with autocast:
        cached = cached_teacher_logits(batch, teacher)
        recompute = mlp_recompute_needed(
            batch.input_ids.numel(),
            spread.drafter.config.intermediate_size,
            settings.ttt_steps,
            2 if amp is not None else 4,
            activation_budget(device),
        )
        loss, m = spread.objective(
            batch,
            in_vocab,
            teacher.draft_head,
            steps=settings.ttt_steps,
            step_weight=settings.step_weight,
            counts=counts,
            teacher_logits=cached,
            recompute_mlp=recompute,
        )
    loss.backward()
    return loss, m


def cached_teacher_logits(batch: Batch, teacher: Teacher) -> torch.Tensor | None:
    """The teacher's draft logits [B, T, D], computed once and shared by every TTT step, when they fit
    in memory; else None (each step recomputes them)."""
    if not teacher_cache_fits(batch.final, len(teacher.draft_head), teacher.head.dtype):
        return None
    with torch.no_grad():
        return batch.final @ teacher.draft_head.T  # [B, T, D]


def global_metrics(
    sums: torch.Tensor, count: list[int], stop: bool, world: distributed.World, steps: int
) -> dict:
    """The step's metrics over all ranks from this rank's `sums` (loss, tokens, then per TTT step
    correct, cond_count, cond_correct) and the global `count`; the stop requests ride on the same
    all-reduce."""
    sums = torch.cat([sums, torch.tensor([float(stop)], dtype=torch.float64)])  # + the stop requests
    sums, stops = distributed.all_reduce_sum(sums, world).split([len(sums) - 1, 1])
    correct, cond_count, cond_correct = sums[2:].view(3, steps)
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


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient norm of a step is NaN or infinite: training stops before that step's
    update (see `OptimizerStep`)."""


class OptimizerStep:
    """One optimizer step: forward/backward of this rank's micro-batches (`step.train_step`), clipping,
    AdamW and schedule steps; it advances the run state and logs the step's row.

    The rule for a NaN or infinite loss or gradient norm: the step's update is not applied, nothing
    is logged or saved for it, and training stops with `NonFiniteLoss` naming the step and the last
    good checkpoint (never training on into garbage, never skipping steps silently). Both values are
    global (summed over ranks), so every rank stops at the same step."""

    def __init__(
        self, spread: Replicated, teacher: Teacher, optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler, settings: TrainSettings, amp: torch.dtype | None,
        device: torch.device, log: TrainLog, checkpointer: Checkpointer, stop: StopRequest,
    ):  # fmt: skip
        self.spread, self.teacher, self.optimizer, self.scheduler = spread, teacher, optimizer, scheduler
        self.settings, self.amp, self.device, self.log = settings, amp, device, log
        self.checkpointer, self.stop = checkpointer, stop
        # this process's step seconds by phase (not checkpointed), timed at the syncs the step has anyway:
        # `loader_wait` is the wait for the loader's batches,
        # `forward_backward` ends at the metrics' copy to the host, `clip` at the norm's, and `update`
        # (AdamW, schedule, log row) is host time, its kernels finishing inside the next step's phases.
        # The process's first step (train.compile's compilation, the loader's first batch) is kept apart.
        self.phase_seconds = dict.fromkeys(("loader_wait", "forward_backward", "clip", "update"), 0.0)
        self.first_step_seconds: dict[str, float] | None = None

    def __call__(self, run: RunState, batches: Iterator[Batch | None], share: list) -> dict:
        """Draw this rank's grad_accum micro-batches from `batches` (its `share` of the step group:
        sample rows per micro-batch, None for an empty slot). Returns the step's global metrics."""
        started = time.perf_counter()
        micro = [next(batches) for _ in range(self.settings.grad_accum)]
        fed = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        metrics = train_step(
            self.spread, self.teacher, micro, self.settings, self.amp, self.device, self.stop.requested
        )
        stepped = time.perf_counter()
        grad_norm = self.spread.clip_gradients(self.settings.grad_clip)
        clipped = time.perf_counter()
        if not (math.isfinite(metrics["loss"]) and math.isfinite(grad_norm)):
            raise NonFiniteLoss(self.non_finite_message(run, metrics["loss"], grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        for rows_of_batch in share:
            if rows_of_batch is not None:
                run.seen[torch.as_tensor(rows_of_batch)] += 1
        run.step, run.group_in_epoch = run.step + 1, run.group_in_epoch + 1
        run.tokens += metrics["tokens"]
        row = [run.step, run.epoch, lr, metrics["loss"], *metrics["acc"], run.tokens, grad_norm]
        run.log_rows.append(row)
        self.log.append(row)
        ended = time.perf_counter()
        run.seconds += ended - started
        seconds = (fed - started, stepped - fed, clipped - stepped, ended - clipped)
        phases = zip(self.phase_seconds, seconds, strict=True)
        if self.first_step_seconds is None:
            self.first_step_seconds = dict(phases)
        else:
            for phase, spent in phases:
                self.phase_seconds[phase] += spent
        return metrics

    @property
    def loader_waited(self) -> float:
        """Seconds this process waited for the loader's batches, its first step included."""
        return self.phase_seconds["loader_wait"] + (self.first_step_seconds or {}).get("loader_wait", 0.0)

    def non_finite_message(self, run: RunState, loss: float, grad_norm: float) -> str:
        last = self.checkpointer.last
        where = (
            f"last good checkpoint: {last[0]} (step {last[1]}); a rerun with the same settings resumes "
            "there and meets this step again, and a changed setting starts from step 0"
            if last is not None
            else f"no checkpoint written yet (train.checkpoint_every = {self.settings.checkpoint_every})"
        )
        return (
            f"train: loss {loss} / gradient norm {grad_norm} at step {run.step + 1} (epoch {run.epoch}): "
            f"stopped before applying it. Usual cause: train.lr too high (now {self.settings.lr}); {where}"
        )


class EpochPace:
    """Where an epoch's time went, logged at its end: steps, tokens/s, and the share spent waiting for
    batches (a loader that cannot keep up shows here, not as a slow GPU)."""

    def __init__(self, run: RunState, step: OptimizerStep):
        self.step = step
        self.started, self.waited = time.perf_counter(), step.loader_waited
        self.first_step, self.tokens = run.step, run.tokens

    def log(self, run: RunState) -> dict:
        """Logs the epoch's pace and returns it: {seconds, tokens_per_s, loader_wait_seconds} (the
        epoch's record in `run.epochs` keeps it, so a run's stats show an epoch that slowed)."""
        seconds = time.perf_counter() - self.started
        tokens = run.tokens - self.tokens
        rate, waited = tokens / max(seconds, 1e-9), self.step.loader_waited - self.waited
        log.info(
            "epoch %d: %d steps, %d tokens in %.1f s (%.0f tok/s); waited %.1f s for batches",
            run.epoch, run.step - self.first_step, tokens, seconds, rate, waited,
        )  # fmt: skip
        return {
            "seconds": round(seconds, 3),
            "tokens_per_s": round(rate),
            "loader_wait_seconds": round(waited, 3),
        }
