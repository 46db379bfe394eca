"""Train an EAGLE-3 drafter on stored hidden states: AdamW, warmup + cosine, clipping, exact resume,
data parallelism (`ddp` or `fsdp`: parallel.py), checkpoint choice by simulated tau on held-out stores.

`train` reads top to bottom; its parts are components of their own: the drafter and its provenance
(drafter_setup.py), the run state (run_state.py) and the `Checkpointer` (checkpoint.py: save, resume,
best epoch, final output), the `TrainLog` (csvlog.py: log.csv and epochs.csv), the `OptimizerStep`
(step.py) and the `EpochEnd` (validation.py: coverage check and held-out metrics). Resume is exact:
a run killed at any point and restarted writes the same log rows, bit for bit on CPU, as one that
never stopped. SIGTERM (a cluster's preemption) stops the run after the step in progress with a
checkpoint (`preemption.StopRequest`, `Preempted`); a NaN or infinite loss stops it before that step's
update (`step.OptimizerStep`, `step.NonFiniteLoss`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time

import torch
from torch import nn
from tqdm import tqdm

from eyas.config import TrainSettings
from eyas.model import target
from eyas.model.compiled import compile_counters
from eyas.train import distributed
from eyas.train.checkpoint import Checkpointer
from eyas.train.csvlog import TrainLog
from eyas.train.drafter_setup import build_drafter, provenance
from eyas.train.loader import PairedLoader, pad_multiple_for
from eyas.train.parallel import Replicated, spread_over_ranks
from eyas.train.preemption import Preempted, StopRequest
from eyas.train.run_state import RunState
from eyas.train.step import EpochPace, OptimizerStep
from eyas.train.validation import EpochEnd, HeldoutMetrics
from eyas.validate import check_manifests

log = logging.getLogger("eyas.train")


# --------------------------------------------------------------------------- pure helpers
def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """LR multiplier for the optimizer step with 0-based index `step`: linear warmup, cosine to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only (norm gains stay undecayed); the frozen embedding is excluded."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for _, p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for _, p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def training_device(name: str, world: distributed.World | None = None) -> torch.device:
    """The device this process trains on: `name` resolved (`target.resolve_device`); on CUDA, under
    torchrun, the rank's own GPU."""
    device = torch.device(target.resolve_device(name))
    if device.type == "cuda" and world is not None and world.active:
        return torch.device("cuda", world.local_rank)
    return device


def cpu_has_bf16() -> bool:
    """Native bf16 dot products (AVX512-BF16 or AMX): there bf16 autocast speeds CPU matmuls up;
    elsewhere oneDNN emulates them and fp32 is faster."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def resolve_amp(dtype: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype, or None for plain fp32. Master weights are always fp32."""
    if dtype == "bfloat16":
        return torch.bfloat16
    if dtype == "auto" and (device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16())):
        return torch.bfloat16
    return None


# --------------------------------------------------------------------------- setup
def loader_readers(device: torch.device, threads: int | None, asked: int | None = None) -> int:
    """Reader threads of the loader: `asked` (train.loader_readers) if set; else one on CPU, where the
    step needs every core, and on a GPU host half the job's threads, up to 4. On the H200 host 4
    readers fed the 8B-shape trainer 2.4x its rate, 8 only 2.0x (bench/README.md, trainer section)."""
    if asked is not None:
        return asked
    if device.type != "cuda":
        return 1
    return max(1, min(4, (threads or os.cpu_count() or 2) // 2))


def make_loader(
    settings: TrainSettings,
    token_shards: list[str],
    hidden_stores: list[str],
    expected_provenance: dict,
    device: torch.device,
    threads: int | None,
) -> PairedLoader:
    """The streaming loader over the (token shard, hidden store) pairs, its readers sized to the device."""
    return PairedLoader(
        token_shards,
        hidden_stores,
        settings.token_budget,
        settings.seed,
        expected_provenance,
        pin_memory=device.type == "cuda",
        readers=loader_readers(device, threads, settings.loader_readers),
        processes=settings.loader_processes,
        fraction=settings.data_fraction,
        pad_multiple=pad_multiple_for(device),
    )


def total_steps(settings: TrainSettings, loader: PairedLoader, world_size: int) -> int:
    """Optimizer steps of the run: every epoch's step groups, capped by max_steps."""
    per_epoch = [
        len(distributed.step_groups(loader.plan(e), world_size, settings.grad_accum))
        for e in range(settings.epochs)
    ]
    return sum(per_epoch) if settings.max_steps is None else min(settings.max_steps, sum(per_epoch))


def optimizer_and_schedule(
    spread: Replicated, settings: TrainSettings, total: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over the trainable weights and its warmup + cosine schedule over `total` steps."""
    optimizer = torch.optim.AdamW(param_groups(spread.objective, settings.weight_decay), lr=settings.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, settings.warmup_steps, total)
    )
    return optimizer, scheduler


# --------------------------------------------------------------------------- training
@dataclasses.dataclass
class Session:
    """Everything the epoch loop works with, built once by `start_session` (resumed when a
    checkpoint of the same run exists)."""

    settings: TrainSettings
    world: distributed.World
    loader: PairedLoader
    run: RunState
    total: int
    spread: Replicated
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    checkpointer: Checkpointer
    step: OptimizerStep
    end_epoch: EpochEnd
    train_log: TrainLog
    stop: StopRequest


def train(
    settings: TrainSettings,
    *,
    token_shards: list[str],
    hidden_stores: list[str],
    vocab_path: str,
    model_dir: str,
    out_dir: str,
    log_path: str,
    expected_provenance: dict,
    heldout: dict | None = None,
    manifests: list[str] | None = None,
    threads: int | None = None,
) -> dict:
    """Train a drafter; write it to `out_dir`, the CSV log to `log_path` and per-epoch metrics to
    `epochs.csv` beside it. heldout: {"token_shards", "hidden_stores"} for checkpoint choice by
    simulated tau (required when settings.select_by_tau). `manifests` (the validate rule's, one per
    store): each store must have a passing, current one. `threads`: CPU threads of this process
    (the rule's share per process). Returns run statistics (on every rank)."""
    if manifests is not None:
        check_manifests(hidden_stores, manifests)
    if settings.select_by_tau and not heldout:
        raise ValueError("train.select_by_tau needs held-out stores (heldout=...)")
    began, compiled_before = time.perf_counter(), compile_counters()
    if threads:
        torch.set_num_threads(threads)
    s = start_session(
        settings, token_shards, hidden_stores, vocab_path, model_dir, out_dir, log_path,
        expected_provenance, heldout, threads,
    )  # fmt: skip
    resumed_from = s.run.step
    log.info(
        "train: %d samples, %d steps from step %d on %s; set up in %.1f s",
        len(s.loader.samples), s.total, s.run.step, s.step.device, time.perf_counter() - began,
    )  # fmt: skip
    bar = tqdm(
        total=s.total, initial=s.run.step, disable=not (settings.progress and s.world.main),
        desc="train", unit="step",
    )  # fmt: skip
    try:
        s.stop.__enter__()
        metrics = run_epochs(s, bar)
    finally:
        s.stop.__exit__()
        bar.close()
        s.train_log.close()
        s.loader.close()

    stats = run_stats(s.run, resumed_from, s.world.size, settings.grad_accum, metrics)
    stats.update(samples=len(s.loader.samples), samples_skipped_by_fraction=s.loader.skipped_by_fraction)
    # this process's step seconds by phase (a resumed run's earlier processes not counted): where the
    # loop outruns the bench's step time (bench/train_profile.py), they tell the loader from the step;
    # its first step (compilation, the first batch) apart
    first = s.step.first_step_seconds or {}
    stats["phase_seconds"] = {phase: round(t, 3) for phase, t in s.step.phase_seconds.items()}
    stats["first_step_seconds"] = {phase: round(t, 3) for phase, t in first.items()}
    if settings.compile:  # recompiles past dynamo's limit fall back to eager silently: the stats say so
        stats["compile"] = compile_counters(since=compiled_before)  # this run alone: a sweep trains several
    whole = s.checkpointer.save(s.run, s.spread, s.optimizer, s.scheduler)  # final weights, gathered once
    if s.world.main:
        s.checkpointer.write_output(whole, stats, best=bool(s.run.best))
        s.train_log.finish(s.run.log_rows, s.run.epochs)
        s.checkpointer.remove()
    distributed.barrier(s.world)
    return stats


def start_session(
    settings: TrainSettings, token_shards: list[str], hidden_stores: list[str], vocab_path: str,
    model_dir: str, out_dir: str, log_path: str, expected_provenance: dict, heldout: dict | None,
    threads: int | None,
) -> Session:  # fmt: skip
    """Loader, drafter, optimizer and schedule, resumed from this run's checkpoint when one exists."""
    world = distributed.current_world()
    device = training_device(settings.device, world)
    amp = resolve_amp(settings.dtype, device)
    loader = make_loader(settings, token_shards, hidden_stores, expected_provenance, device, threads)
    model, teacher, attrs = build_drafter(settings, loader, hidden_stores, vocab_path, model_dir, device, amp)
    total = total_steps(settings, loader, world.size)
    extra, fp = provenance(settings, loader, attrs, vocab_path, world)

    run = RunState(seen=torch.zeros(len(loader.samples), dtype=torch.int32))
    checkpointer = Checkpointer(out_dir, fp, extra, world)
    found = checkpointer.find()
    checkpointer.check_disk(model)
    if found is not None:  # weights before they are spread over the ranks
        checkpointer.load_weights(model, found, device)
    spread = spread_over_ranks(model, settings.parallel, world, device)
    optimizer, scheduler = optimizer_and_schedule(spread, settings, total)
    if found is not None:
        checkpointer.restore(found, run, spread, optimizer, scheduler)
    heldout_metrics = None
    if settings.select_by_tau:
        heldout_metrics = HeldoutMetrics(heldout, model_dir, expected_provenance, settings.ttt_steps, device)
    train_log = TrainLog(log_path, settings.ttt_steps, world.main)
    train_log.start(run.log_rows)
    stop = StopRequest()
    step = OptimizerStep(
        spread, teacher, optimizer, scheduler, settings, amp, device, train_log, checkpointer, stop
    )
    end_epoch = EpochEnd(spread, checkpointer, heldout_metrics)
    return Session(
        settings, world, loader, run, total, spread, optimizer, scheduler, checkpointer, step,
        end_epoch, train_log, stop,
    )  # fmt: skip


def run_epochs(s: Session, bar: tqdm) -> dict:
    """Optimizer steps until `total` or the last epoch; returns the last step's metrics."""
    settings, run, world = s.settings, s.run, s.world
    metrics: dict = {"acc": [], "loss": None}
    while run.step < s.total and run.epoch < settings.epochs:
        pace = EpochPace(run, s.step)
        groups = distributed.step_groups(s.loader.plan(run.epoch), world.size, settings.grad_accum)
        mine = [distributed.rank_share(g, world.rank, settings.grad_accum) for g in groups]
        batches = s.loader.batches([mb for share in mine[run.group_in_epoch :] for mb in share])
        stopped = False
        for g in range(run.group_in_epoch, len(groups)):
            metrics = s.step(run, batches, mine[g])
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc0=f"{metrics['acc'][0]:.3f}")
            if run.step >= s.total:
                stopped = g + 1 < len(groups)
                break
            if metrics["stop"] or (settings.checkpoint_every and run.step % settings.checkpoint_every == 0):
                s.checkpointer.save(run, s.spread, s.optimizer, s.scheduler)
            if metrics["stop"]:  # every rank sees it at the same step (train_step's all-reduce)
                batches.close()
                raise Preempted(
                    f"train: stopped on SIGTERM after step {run.step} of {s.total}; checkpoint "
                    f"{s.checkpointer.dir} saved, and rerunning the job resumes from it"
                )
        batches.close()
        paced = pace.log(run)
        padded = padded_slots(s.loader, run.epoch, world.size, settings)
        s.end_epoch(run, complete=not stopped, padded=padded, pace=paced)
        if stopped:
            break
        run.epoch, run.group_in_epoch = run.epoch + 1, 0
    return metrics


def padded_slots(loader: PairedLoader, epoch: int, world_size: int, settings: TrainSettings) -> int:
    """Empty micro-batch slots of an epoch (its batches do not fill every rank's last step group)."""
    return distributed.padded_slots(len(loader.plan(epoch)), world_size, settings.grad_accum)


def run_stats(run: RunState, resumed_from: int, world_size: int, grad_accum: int, metrics: dict) -> dict:
    """What `train` returns (and the drafter's config records as `train_stats`)."""
    return {
        "steps": run.step,
        "resumed_from_step": resumed_from,
        "world_size": world_size,
        "grad_accum": grad_accum,
        "tokens": run.tokens,
        "final_loss": run.log_rows[-1][3] if run.log_rows else None,
        "final_acc": list(metrics["acc"]),
        "seconds": run.seconds,
        "tokens_per_s": run.tokens / run.seconds if run.seconds else 0.0,
        "epochs": run.epochs,
        "padded_microbatches": sum(e["padded_microbatches"] for e in run.epochs),
        "selected": run.best or None,
    }
