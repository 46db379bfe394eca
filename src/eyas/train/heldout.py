"""Held-out drafter metrics on hidden stores: per-step and conditional accuracy, simulated and walked tau.

Training chooses its best epoch by them (validation.py); the evaluate stage reports them as the
"offline" metrics of every drafter.

The drafter runs its training-time test (`ttt_forward`, no grad) over whole held-out samples and the
metrics come from the training loss module (`eyas.train.loss.ttt_loss`), so offline numbers use exactly
the alignment, masks and teacher of training. Per-batch metrics are re-weighted by their position
counts, so the totals do not depend on how samples were batched.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import torch

from eyas.core.acceptance import ratio, simulated_tau, walked_counts
from eyas.model.target import load_embed_and_head
from eyas.store import ProvenanceError
from eyas.train.loader import PairedLoader, pad_multiple_for
from eyas.train.loss import target_trained, teacher_from_final, ttt_loss

if TYPE_CHECKING:
    from eyas.model.drafter import Eagle3Drafter

DEFAULT_TOKEN_BUDGET = 1024  # padded tokens per batch: step logits are [B, T, D] fp32 for every step


def _check_drafter_matches(drafter: Eagle3Drafter, store_attrs: list[dict], hidden_stores: list[str]) -> None:
    """The drafter must read the taps these stores hold, at the width they hold."""
    config = drafter.config
    for attrs, path in zip(store_attrs, hidden_stores, strict=True):
        for name, want in (("layer_ids", list(config.aux_layer_ids)), ("hidden_size", config.hidden_size)):
            have = attrs.get(name)
            if have != want:
                raise ProvenanceError(
                    f"{path}: provenance field {name!r} is {have!r}, but the drafter was built for {want!r}"
                )


@torch.no_grad()
def evaluate_offline(
    drafter: Eagle3Drafter,
    token_shards: list[str],
    hidden_stores: list[str],
    model_dir: str | os.PathLike,
    *,
    ttt_steps: int,
    expected_provenance: dict,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    device: str = "cpu",
) -> dict:
    """Metrics of `drafter` over held-out (token shard, hidden store) pairs.

    Returns per-step lists (index k = TTT step k): `count` (loss-carrying positions), `accuracy`
    (drafter argmax == teacher argmax), `cond_count` / `conditional_accuracy` (among positions whose
    earlier steps were all correct), `loss` (mean soft-CE), plus `simulated_tau` = 1 + sum_k prod_{j<=k}
    conditional_accuracy_j, and sample/token counts. A step without positions reports None (and
    contributes 0 to tau). By chain length k = 1..ttt_steps: `simulated_tau_by_k` (the same product
    cut at k) and `walked_tau_by_k`, the tau of decoding walked along the held-out responses
    (`walked_counts`): served decoding starts its chains where the last one ended, so it is the one
    to set beside a served tau at that k (the walk follows the stored responses, sampled ones too,
    where greedy serving would follow its own greedy text). The stores are checked against
    `expected_provenance` and the drafter's taps.
    """
    if ttt_steps < 1:
        raise ValueError(f"ttt_steps={ttt_steps} must be >= 1")
    loader = PairedLoader(
        token_shards, hidden_stores, token_budget, seed=0, expected=expected_provenance,
        pad_multiple=pad_multiple_for(device),
    )  # fmt: skip
    _check_drafter_matches(drafter, loader.store_attrs, hidden_stores)
    drafter = drafter.to(device).eval()
    dtype = next(p for p in drafter.parameters() if p.is_floating_point()).dtype
    head, draft_target_ids, t2d = _teacher_head(drafter, model_dir, device)

    sums = {name: [0.0] * ttt_steps for name in ("count", "correct", "cond_count", "cond_correct", "loss")}
    walked = {"emitted": [0] * ttt_steps, "passes": [0] * ttt_steps}
    tokens, batches = 0, 0
    start = time.perf_counter()
    for batch in loader.epoch(0):
        batch = batch.to(device)
        step_logits = drafter.ttt_forward(
            batch.aux.to(dtype), batch.input_ids, ttt_steps
        )  # steps x [B, T, D]
        teacher, in_vocab = teacher_from_final(batch.final, head, draft_target_ids, t2d)
        _, metrics = ttt_loss(step_logits, teacher, in_vocab, batch.loss_mask, batch.valid)
        _add_batch(sums, metrics)
        chain_start = target_trained(batch.loss_mask, batch.valid, 0)  # [B, T]: a draft chain may start at t
        _add_walks(walked, metrics["accept_run"].cpu().numpy(), chain_start.cpu().numpy())
        tokens += batch.num_tokens
        batches += 1
    return {
        "ttt_steps": ttt_steps,
        "num_samples": len(loader.samples),
        "num_tokens": tokens,
        "num_batches": batches,
        **_step_metrics(sums),
        "walked_tau_by_k": [ratio(e, p) for e, p in zip(walked["emitted"], walked["passes"], strict=True)],
        "seconds": time.perf_counter() - start,
    }


def _teacher_head(
    drafter: Eagle3Drafter, model_dir: str | os.PathLike, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher on `device`: the target's lm_head [V, H] fp32, the target id of each draft id [D],
    and the in-draft-vocab flag of each target id [V]."""
    _, head = load_embed_and_head(model_dir)  # [V, H] target lm_head: the teacher
    head = head.to(device, torch.float32)
    draft_target_ids = torch.arange(len(drafter.d2t), device=device) + drafter.d2t.to(device)  # [D]
    t2d = drafter.t2d.to(device)  # [V] bool
    return head, draft_target_ids, t2d


def _add_batch(sums: dict[str, list[float]], metrics: dict) -> None:
    """Add one batch's `ttt_loss` metrics to `sums`, re-weighted by its position counts."""
    for k in range(len(sums["count"])):
        count, cond_count = metrics["count"][k], metrics["cond_count"][k]
        sums["count"][k] += count
        sums["correct"][k] += metrics["acc"][k] * count
        sums["cond_count"][k] += cond_count
        sums["cond_correct"][k] += metrics["cond_acc"][k] * cond_count
        sums["loss"][k] += metrics["loss"][k] * count


def _add_walks(walked: dict[str, list[int]], accept_run, chain_start) -> None:
    """Add the walked decoding of every row ([B, T] arrays) at every chain length k to `walked`."""
    for run, start in zip(accept_run, chain_start, strict=True):
        for k in range(len(walked["emitted"])):
            emitted, passes = walked_counts(run, start, k + 1)
            walked["emitted"][k] += emitted
            walked["passes"][k] += passes


def _step_metrics(sums: dict[str, list[float]]) -> dict:
    """The per-step lists and simulated tau of `evaluate_offline` from the summed batch metrics."""
    count = [int(c) for c in sums["count"]]
    cond_count = [int(c) for c in sums["cond_count"]]
    # Counts are integers, correct sums are integers up to float rounding of acc * count.
    accuracy = [ratio(round(c), n) for c, n in zip(sums["correct"], count, strict=True)]
    conditional = [ratio(round(c), n) for c, n in zip(sums["cond_correct"], cond_count, strict=True)]
    loss = [ratio(s, n) for s, n in zip(sums["loss"], count, strict=True)]
    return {
        "count": count,
        "accuracy": accuracy,
        "cond_count": cond_count,
        "conditional_accuracy": conditional,
        "loss": loss,
        "simulated_tau": simulated_tau([a or 0.0 for a in conditional]),
        "simulated_tau_by_k": [
            simulated_tau([a or 0.0 for a in conditional[:k]]) for k in range(1, len(count) + 1)
        ],
    }
