"""Train an EAGLE-3 drafter on stored hidden states: AdamW, warmup + cosine, clipping, checkpoints.

Checkpoints live in a sibling `<out_dir>-checkpoint/` (model.safetensors, config.json, train_state.pt),
outside Snakemake's output so a failed job's rerun resumes from it. A checkpoint is used only if its
fingerprint (settings that change the result + input identities) matches this run. The final drafter
appears at `out_dir` atomically, the CSV log at `log_path` atomically; while training, rows are
appended to `<log_path>.partial` for watching.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from eyas import target
from eyas.atomic import atomic_dir, atomic_file
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.provenance import DRAFTER_PROVENANCE, sha256_file
from eyas.store import ProvenanceError, check_provenance
from eyas.target import load_embed_and_head, load_target_tensor, read_config
from eyas.train.loader import PairedLoader
from eyas.train.loss import teacher_from_final, ttt_loss
from eyas.validate import check_manifests
from eyas.vocab import load_draft_vocab

log = logging.getLogger("eyas.train")

STORE_IDENTITY = ("model_id", "model_hash", "layer_ids", "layer_id_convention", "hidden_size", "num_taps")
NOT_FINGERPRINTED = ("progress", "threads", "checkpoint_every", "device")  # do not change the maths


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


def resolve_device(name: str) -> torch.device:
    return torch.device(target.resolve_device(name))


def resolve_amp(dtype: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype, or None for plain fp32. Master weights are always fp32."""
    if dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def checkpoint_dir(out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    return out.with_name(out.name + "-checkpoint")


def fingerprint(settings, inputs: dict) -> str:
    relevant = {k: v for k, v in dataclasses.asdict(settings).items() if k not in NOT_FINGERPRINTED}
    return hashlib.sha256(json.dumps([relevant, inputs], sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: Path, model: Eagle3Drafter, extra_config: dict, state: dict) -> None:
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, extra_config=extra_config)
        torch.save(state, tmp / "train_state.pt")


def load_train_state(path: Path) -> dict | None:
    state_path = path / "train_state.pt"
    if not state_path.exists():
        return None
    return torch.load(state_path, map_location="cpu", weights_only=True)


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
    manifests: list[str] | None = None,
) -> dict:
    """Train a drafter; write it to `out_dir` and the CSV log to `log_path`. Returns run statistics.

    `manifests` (the validate rule's, one per store): each store must have a passing, current one.
    """
    if manifests is not None:
        check_manifests(hidden_stores, manifests)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = resolve_device(settings.device)
    amp = resolve_amp(settings.dtype, device)
    loader = PairedLoader(
        token_shards, hidden_stores, settings.token_budget, settings.seed, expected_provenance
    )
    d2t, t2d, vocab_meta = load_draft_vocab(vocab_path)
    attrs = _check_inputs(loader, hidden_stores, vocab_meta, settings)
    model, head = _build_model(model_dir, attrs, d2t, t2d, settings.seed, settings.init_head_from_target)
    model.to(device).train()
    head = head.to(device, amp or torch.float32)  # teacher matmuls run in the autocast dtype
    draft_ids = (torch.arange(len(d2t)) + d2t).to(device)
    t2d_dev = t2d.to(device)

    per_epoch = [loader.num_batches(e) for e in range(settings.epochs)]
    total = sum(per_epoch) if settings.max_steps is None else min(settings.max_steps, sum(per_epoch))
    optimizer = torch.optim.AdamW(param_groups(model, settings.weight_decay), lr=settings.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, settings.warmup_steps, total)
    )
    vocab_hash = sha256_file(vocab_path)
    extra = {k: attrs.get(k) for k in DRAFTER_PROVENANCE}
    extra.update({"draft_vocab_hash": vocab_hash, "train_settings": dataclasses.asdict(settings)})
    fp = fingerprint(
        settings,
        {"stores": [a.get("tokens_checksum") for a in loader.store_attrs], "vocab": vocab_hash, **extra},
    )

    ckpt = checkpoint_dir(out_dir)
    step, epoch, in_epoch, tokens, seconds, rows = 0, 0, 0, 0, 0.0, []
    state = load_train_state(ckpt)
    if state is not None and state["fingerprint"] != fp:
        log.warning("%s: checkpoint is from different settings or inputs; starting fresh", ckpt)
        state = None
    if state is not None:
        model.load_state_dict(Eagle3Drafter.from_pretrained(ckpt).state_dict())
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        step, epoch, in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        tokens, seconds, rows = state["tokens"], state["seconds"], state["log_rows"]
        log.info("resuming from %s at step %d (epoch %d, batch %d)", ckpt, step, epoch, in_epoch)
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
    partial.parent.mkdir(parents=True, exist_ok=True)
    with open(partial, "w", newline="") as fh:
        csv.writer(fh).writerows([columns, *rows])

    def snapshot() -> dict:
        return {
            "fingerprint": fp,
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": in_epoch,
            "tokens": tokens,
            "seconds": seconds,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "log_rows": rows,
        }

    from tqdm import tqdm

    bar = tqdm(total=total, initial=step, disable=not settings.progress, desc="train", unit="step")
    metrics: dict = {"acc": [], "loss": []}
    with open(partial, "a", newline="") as log_fh:
        writer = csv.writer(log_fh)
        while step < total and epoch < settings.epochs:
            for batch in loader.epoch(epoch, skip=in_epoch):
                started = time.perf_counter()
                batch = batch.to(device)
                with torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext():
                    step_logits = model.ttt_forward(batch.aux, batch.input_ids, settings.ttt_steps)
                    teacher, in_vocab = teacher_from_final(
                        batch.final.to(head.dtype), head, draft_ids, t2d_dev
                    )
                loss, metrics = ttt_loss(
                    step_logits, teacher, in_vocab, batch.loss_mask, batch.valid, settings.step_weight
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip))
                lr = optimizer.param_groups[0]["lr"]
                optimizer.step()
                scheduler.step()
                step, in_epoch = step + 1, in_epoch + 1
                tokens += batch.num_tokens
                seconds += time.perf_counter() - started
                row = [step, epoch, lr, float(loss.detach()), *metrics["acc"], tokens, grad_norm]
                rows.append(row)
                writer.writerow(row)
                log_fh.flush()
                bar.update(1)
                bar.set_postfix(loss=f"{row[3]:.3f}", acc0=f"{metrics['acc'][0]:.3f}")
                _after_step(step)
                if step >= total:
                    break
                if settings.checkpoint_every and step % settings.checkpoint_every == 0:
                    save_checkpoint(ckpt, model, extra, snapshot())
            else:  # epoch exhausted
                epoch, in_epoch = epoch + 1, 0
    bar.close()

    stats = {
        "steps": step,
        "resumed_from_step": resumed_from,
        "tokens": tokens,
        "final_loss": rows[-1][3] if rows else None,
        "final_acc": list(metrics["acc"]),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
    }
    save_checkpoint(ckpt, model, extra, snapshot())
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, extra_config={**extra, "train_stats": stats})
        shutil.copy(ckpt / "train_state.pt", tmp / "train_state.pt")
    with atomic_file(log_path) as fh:
        csv.writer(fh).writerows([columns, *rows])
    partial.unlink(missing_ok=True)
    shutil.rmtree(ckpt, ignore_errors=True)  # the final dir holds the same state
    return stats


def _after_step(step: int) -> None:
    """Hook called after every optimizer step (tests use it to simulate a crash)."""
