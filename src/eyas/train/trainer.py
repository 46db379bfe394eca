"""Train an EAGLE-3 drafter on stored hidden states: AdamW, warmup + cosine, clipping, exact resume,
data parallelism (`ddp` or `fsdp`: parallel.py), checkpoint choice by simulated tau on held-out stores.

Checkpoints live in a sibling `<out_dir>-checkpoint/` (see `checkpoint.py`), outside Snakemake's output
so a failed job's rerun resumes from it; it is used only if its fingerprint (settings that change the
result + input identities) matches this run. Resume is exact: a run killed at any point and restarted
writes the same log rows, bit for bit on CPU, as one that never stopped. With `select_by_tau`, the
weights of the epoch with the best simulated tau on the held-out stores are the output; per-epoch
metrics go to `epochs.csv` beside the log. The final drafter appears at `out_dir` atomically, the
CSV log at `log_path` atomically; while training, rows are appended to `<log_path>.partial`.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
import shutil
import time
from pathlib import Path

import torch
from torch import nn

from eyas import target
from eyas.atomic import atomic_dir, atomic_file
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.provenance import DRAFTER_PROVENANCE, sha256_file
from eyas.store import ProvenanceError, check_provenance
from eyas.target import load_embed_and_head, load_target_tensor, read_config
from eyas.train import distributed as ddp
from eyas.train.checkpoint import (
    checkpoint_dir,
    fingerprint,
    load_checkpoint,
    remove_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from eyas.train.loader import PairedLoader
from eyas.train.parallel import spread_over_ranks
from eyas.train.step import Teacher, train_step
from eyas.validate import check_manifests
from eyas.vocab import load_draft_vocab

log = logging.getLogger("eyas.train")

STORE_IDENTITY = ("model_id", "model_hash", "layer_ids", "layer_id_convention", "hidden_size", "num_taps")
EPOCH_COLUMNS = ("epoch", "step", "complete", "samples", "padded_microbatches", "simulated_tau")


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


def resolve_device(name: str, world: ddp.World | None = None) -> torch.device:
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
def _check_inputs(loader: PairedLoader, hidden_stores: list[str], vocab_meta: dict, settings) -> dict:
    """Stores must agree with each other and with the draft vocab; returns the first store's attrs."""
    first = loader.store_attrs[0]
    for attrs, path in zip(loader.store_attrs[1:], hidden_stores[1:], strict=True):
        check_provenance(attrs, {k: first.get(k) for k in STORE_IDENTITY}, path)
    if first.get("num_taps") != 3:
        raise ProvenanceError(
            f"{hidden_stores[0]}: provenance field 'num_taps' is {first.get('num_taps')!r}, expected 3"
        )
    if vocab_meta["tokenizer_hash"] != first.get("tokenizer_hash"):
        raise ProvenanceError(
            f"draft vocab: field 'tokenizer_hash' is {vocab_meta['tokenizer_hash']!r}, "
            f"the hidden stores have {first.get('tokenizer_hash')!r}"
        )
    if vocab_meta["draft_vocab_size"] != settings.draft_vocab_size:
        raise ValueError(
            f"draft vocab has {vocab_meta['draft_vocab_size']} entries, train.draft_vocab_size is "
            f"{settings.draft_vocab_size}"
        )
    return first


def _build_model(
    model_dir: str, attrs: dict, d2t: torch.Tensor, t2d: torch.Tensor, seed: int, init_head: bool
) -> tuple:
    config = DrafterConfig.from_target_config(read_config(model_dir), len(d2t), attrs["layer_ids"])
    if config.hidden_size != attrs["hidden_size"]:
        raise ProvenanceError(f"target hidden_size {config.hidden_size} != stores' {attrs['hidden_size']}")
    torch.manual_seed(seed)
    model = Eagle3Drafter(config)
    embed, head = load_embed_and_head(model_dir)
    model.set_target_embedding(embed.float())
    model.set_vocab(d2t, t2d)
    if init_head:
        draft_target_ids = torch.arange(len(d2t)) + d2t  # [D] target id of each draft id
        with torch.no_grad():
            model.lm_head.weight.copy_(head[draft_target_ids].float())  # [D, H]
            model.norm.weight.copy_(load_target_tensor(model_dir, "model.norm.weight").float())
    return model, head


def stores_summary(store_attrs: list[dict]) -> dict:
    """What the drafter was trained on, beyond the identity fields every store shares: how the states
    were computed and stored (a drafter trained on fp8 stores says so in its config)."""

    def values(field: str, default=None) -> list[str]:
        return sorted({str(v) for a in store_attrs if (v := a.get(field, default)) is not None})

    return {
        "count": len(store_attrs),
        "tokens": sum(int(a.get("num_tokens", 0)) for a in store_attrs),
        "storage": values("storage", "bf16"),  # stores before the fp8 option are bf16
        "backend": values("backend"),
        "compute_dtype": values("compute_dtype"),
    }


def loader_readers(device: torch.device, threads: int | None) -> int:
    """Reader threads of the loader: one on CPU, where the step needs every core; on a GPU host
    half the job's threads, up to 4. On the H200 host 4 readers fed the 8B-shape trainer 2.4x its
    rate, 8 only 2.0x (bench/README.md, trainer section)."""
    if device.type != "cuda":
        return 1
    return max(1, min(4, (threads or os.cpu_count() or 2) // 2))


def heldout_metrics(model, settings, heldout: dict, model_dir: str, expected: dict, device) -> dict:
    """Offline metrics (evaluate/offline.py) of the current weights on the held-out stores."""
    from eyas.evaluate.offline import evaluate_offline

    metrics = evaluate_offline(
        model,
        heldout["token_shards"],
        heldout["hidden_stores"],
        model_dir,
        ttt_steps=settings.ttt_steps,
        expected_provenance=expected,
        device=str(device),
    )
    model.train()
    return metrics


# --------------------------------------------------------------------------- training
def train(
    settings,
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
) -> dict:
    """Train a drafter; write it to `out_dir`, the CSV log to `log_path` and per-epoch metrics to
    `epochs.csv` beside it. heldout: {"token_shards", "hidden_stores"} for checkpoint choice by
    simulated tau (required when settings.select_by_tau). `manifests` (the validate rule's, one per
    store): each store must have a passing, current one. Returns run statistics (on every rank)."""
    if manifests is not None:
        check_manifests(hidden_stores, manifests)
    world = ddp.current_world()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    if settings.select_by_tau and not heldout:
        raise ValueError("train.select_by_tau needs held-out stores (heldout=...)")
    device = resolve_device(settings.device, world)
    amp = resolve_amp(settings.dtype, device)
    accum = settings.grad_accum
    loader = PairedLoader(
        token_shards,
        hidden_stores,
        settings.token_budget,
        settings.seed,
        expected_provenance,
        pin_memory=device.type == "cuda",
        readers=loader_readers(device, settings.threads),
    )
    d2t, t2d, vocab_meta = load_draft_vocab(vocab_path)
    attrs = _check_inputs(loader, hidden_stores, vocab_meta, settings)
    model, head = _build_model(model_dir, attrs, d2t, t2d, settings.seed, settings.init_head_from_target)
    model.to(device).train()
    teacher = Teacher(head, d2t, t2d, device, amp or torch.float32)
    del head
    per_epoch = [len(ddp.step_groups(loader.plan(e), world.size, accum)) for e in range(settings.epochs)]
    total = sum(per_epoch) if settings.max_steps is None else min(settings.max_steps, sum(per_epoch))
    vocab_hash = sha256_file(vocab_path)
    extra = {k: attrs.get(k) for k in DRAFTER_PROVENANCE}
    extra.update(
        {
            "draft_vocab_hash": vocab_hash,
            "train_settings": dataclasses.asdict(settings),
            "train_stores": stores_summary(loader.store_attrs),
        }
    )
    fp = fingerprint(
        settings,
        {
            "stores": [a.get("tokens_checksum") for a in loader.store_attrs],
            "vocab": vocab_hash,
            "world_size": world.size,
            **extra,
        },
    )

    ckpt = checkpoint_dir(out_dir)
    best_dir = Path(out_dir).with_name(Path(out_dir).name + "-best")
    step, epoch, in_epoch, seconds, rows, epochs = 0, 0, 0, 0.0, [], []
    tokens = 0
    seen = torch.zeros(len(loader.samples), dtype=torch.int32)  # per-sample uses this epoch (all ranks)
    best: dict = {}
    found = load_checkpoint(ckpt)
    if found is not None and found[1]["fingerprint"] != fp:
        log.warning("%s: checkpoint is from different settings or inputs; starting fresh", ckpt)
        found = None
    if found is not None:  # weights before they are spread over the ranks
        model.load_state_dict(Eagle3Drafter.from_pretrained(found[0], map_location=device).state_dict())
    spread = spread_over_ranks(model, settings.parallel, world, device)
    optimizer = torch.optim.AdamW(param_groups(spread.objective, settings.weight_decay), lr=settings.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, settings.warmup_steps, total)
    )
    if found is not None:
        path, state = found
        spread.load_optimizer_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        step, epoch, in_epoch = state["step"], state["epoch"], state["group_in_epoch"]
        tokens, seconds, rows, epochs = state["tokens"], state["seconds"], state["log_rows"], state["epochs"]
        best = state["best"]
        if world.main:  # the checkpoint holds the all-rank count; other ranks add their own from here
            seen = state["seen"].clone()
        log.info("resuming from %s at step %d (epoch %d, step group %d)", path, step, epoch, in_epoch)
    resumed_from = step

    columns = [
        "step",
        "epoch",
        "lr",
        "loss",
        *(f"acc_{k}" for k in range(settings.ttt_steps)),
        "tokens",
        "grad_norm",
    ]
    partial = Path(str(log_path) + ".partial")
    if world.main:
        partial.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "w", newline="") as fh:
            csv.writer(fh).writerows([columns, *rows])

    def snapshot() -> dict:
        return {
            "fingerprint": fp,
            "step": step,
            "epoch": epoch,
            "group_in_epoch": in_epoch,
            "tokens": tokens,
            "seconds": seconds,
            "optimizer": spread.optimizer_state(optimizer),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "seen": ddp.all_reduce_sum(seen.clone(), world),
            "log_rows": rows,
            "epochs": epochs,
            "best": best,
        }

    def checkpoint_now() -> Eagle3Drafter | None:
        """Save a checkpoint; returns the gathered drafter it saved (rank 0; None elsewhere)."""
        state = snapshot()  # collectives (seen, sharded optimizer state): every rank takes part
        whole = spread.full_drafter()
        if world.main:
            save_checkpoint(ckpt, whole, extra, state)
        ddp.barrier(world)
        return whole

    def finish_epoch(complete: bool) -> None:
        """Coverage check (every sample exactly once per complete epoch), held-out tau, best weights."""
        nonlocal seen, best
        counts = ddp.all_reduce_sum(seen.clone(), world)
        record = {
            "epoch": epoch,
            "step": step,
            "complete": complete,
            "samples": int((counts > 0).sum()),
            "padded_microbatches": ddp.padded_slots(len(loader.plan(epoch)), world.size, accum),
        }
        if complete and not bool((counts == 1).all()):
            raise RuntimeError(
                f"epoch {epoch}: {int((counts == 0).sum())} samples unseen, "
                f"{int((counts > 1).sum())} seen more than once"
            )
        if settings.select_by_tau:
            whole = spread.full_drafter()
            if world.main:
                metrics = heldout_metrics(whole, settings, heldout, model_dir, expected_provenance, device)
                record["simulated_tau"] = metrics["simulated_tau"]
                record["conditional_accuracy"] = metrics["conditional_accuracy"]
                record["accuracy"] = metrics["accuracy"]
                if not best or record["simulated_tau"] > best["simulated_tau"]:
                    best = {"epoch": epoch, "step": step, "simulated_tau": record["simulated_tau"]}
                    whole.save_pretrained(best_dir, extra_config=extra)
                log.info("epoch %d: held-out simulated tau %.4f", epoch, record["simulated_tau"])
            ddp.barrier(world)
        epochs.append(record)
        seen = torch.zeros_like(seen)

    from tqdm import tqdm

    bar = tqdm(
        total=total, initial=step, disable=not (settings.progress and world.main), desc="train", unit="step"
    )
    metrics: dict = {"acc": [], "loss": None}
    log_fh = open(partial, "a", newline="") if world.main else None  # noqa: SIM115 - closed below
    writer = csv.writer(log_fh) if log_fh else None
    try:
        while step < total and epoch < settings.epochs:
            groups = ddp.step_groups(loader.plan(epoch), world.size, accum)
            mine = [ddp.rank_share(g, world.rank, accum) for g in groups]
            batches = loader.batches([mb for share in mine[in_epoch:] for mb in share])
            stopped = False
            for g in range(in_epoch, len(groups)):
                started = time.perf_counter()
                micro = [next(batches) for _ in range(accum)]
                lr = optimizer.param_groups[0]["lr"]
                optimizer.zero_grad(set_to_none=True)
                metrics = train_step(spread, teacher, micro, settings, amp, device)
                grad_norm = spread.clip_gradients(settings.grad_clip)
                optimizer.step()
                scheduler.step()
                for rows_of_batch in mine[g]:
                    if rows_of_batch is not None:
                        seen[torch.as_tensor(rows_of_batch)] += 1
                step, in_epoch = step + 1, g + 1
                tokens += metrics["tokens"]
                seconds += time.perf_counter() - started
                row = [step, epoch, lr, metrics["loss"], *metrics["acc"], tokens, grad_norm]
                rows.append(row)
                if writer:
                    writer.writerow(row)
                    log_fh.flush()
                bar.update(1)
                bar.set_postfix(loss=f"{row[3]:.3f}", acc0=f"{metrics['acc'][0]:.3f}")
                _after_step(step)
                if step >= total:
                    stopped = g + 1 < len(groups)
                    break
                if settings.checkpoint_every and step % settings.checkpoint_every == 0:
                    checkpoint_now()
            batches.close()
            finish_epoch(complete=not stopped)
            if stopped:
                break
            epoch, in_epoch = epoch + 1, 0
    finally:
        bar.close()
        if log_fh:
            log_fh.close()

    stats = {
        "steps": step,
        "resumed_from_step": resumed_from,
        "world_size": world.size,
        "grad_accum": accum,
        "tokens": tokens,
        "final_loss": rows[-1][3] if rows else None,
        "final_acc": list(metrics["acc"]),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "epochs": epochs,
        "padded_microbatches": sum(e["padded_microbatches"] for e in epochs),
        "selected": best or None,
    }
    whole = checkpoint_now()  # the final weights, gathered once for the checkpoint and the output
    if world.main:
        source = best_dir if best else None
        with atomic_dir(out_dir) as tmp:
            whole.save_pretrained(tmp, extra_config={**extra, "train_stats": stats})
            if source is not None:  # the chosen epoch's weights replace the last ones
                shutil.copy(source / "model.safetensors", tmp / "model.safetensors")
            shutil.copy(ckpt / "train_state.pt", tmp / "train_state.pt")
        with atomic_file(log_path) as fh:
            csv.writer(fh).writerows([columns, *rows])
        _write_epochs(Path(log_path).with_name("epochs.csv"), epochs, settings.ttt_steps)
        partial.unlink(missing_ok=True)
        remove_checkpoint(ckpt)  # the final dir holds the same state
        shutil.rmtree(best_dir, ignore_errors=True)
    ddp.barrier(world)
    return stats


def _write_epochs(path: Path, epochs: list[dict], steps: int) -> None:
    """One row per finished epoch: coverage, padding and held-out metrics (empty when not measured)."""
    columns = [*EPOCH_COLUMNS, *(f"cond_acc_{k}" for k in range(steps)), *(f"acc_{k}" for k in range(steps))]
    with atomic_file(path) as fh:
        out = csv.writer(fh)
        out.writerow(columns)
        for e in epochs:
            cond = e.get("conditional_accuracy") or [None] * steps
            acc = e.get("accuracy") or [None] * steps
            out.writerow([*(e.get(c) for c in EPOCH_COLUMNS), *cond, *acc])


def _after_step(step: int) -> None:
    """Hook called after every optimizer step (tests use it to simulate a crash)."""
