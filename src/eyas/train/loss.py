"""TTT loss and accuracy metrics (pure functions; alignment exactly as in docs/design.md).

Step k at index t predicts token t+2+k. Its teacher is the target distribution at index t+1+k
(target lm_head of the stored final state there), restricted to the draft vocab. The position carries
loss iff loss_mask[t+2+k] == 1, t+2+k lies inside the sample, and the target's greedy token at
t+1+k (argmax over the FULL vocab) is in the draft vocab. Avoided peer bugs (FACTS §1): the mask is
shifted together with the teacher (SpecForge #885), the loss is averaged over loss-carrying positions
only, and the full-vocab logits are never materialised for a whole sequence (#580).
"""

from __future__ import annotations

import torch
from torch import Tensor

ARGMAX_CHUNK = 256  # rows per full-vocab argmax block: [256, V] fp32 is 128 MB at V = 128k


@torch.no_grad()
def teacher_from_final(
    final: Tensor, head: Tensor, draft_target_ids: Tensor, t2d: Tensor, chunk: int = ARGMAX_CHUNK
) -> tuple[Tensor, Tensor]:
    """Teacher logits over the draft vocab and whether the target's greedy token is drafted.

    final [B, T, H] post-norm target states; head [V, H] target lm_head; draft_target_ids [D] ascending
    target ids of the draft vocab; t2d [V] bool. Returns (teacher_logits [B, T, D] fp32,
    in_vocab [B, T] bool). Only [chunk, V] of full-vocab logits exists at a time.
    """
    b, t, h = final.shape
    flat = final.reshape(b * t, h)
    teacher = (flat @ head[draft_target_ids].T).float()  # [B*T, D]
    greedy = torch.empty(b * t, dtype=torch.long, device=final.device)
    for lo in range(0, b * t, chunk):
        greedy[lo : lo + chunk] = (flat[lo : lo + chunk] @ head.T).argmax(-1)  # [chunk, V] -> [chunk]
    return teacher.view(b, t, -1), t2d[greedy].view(b, t)


def shift_left(x: Tensor, n: int, fill: float | bool = 0) -> Tensor:
    """x [B, T, ...] -> y with y[:, t] = x[:, t + n] and `fill` past the end."""
    pad = x.new_full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)


def step_loss_mask(loss_mask: Tensor, valid: Tensor, in_vocab: Tensor, k: int) -> Tensor:
    """[B, T] bool: step k at index t carries loss (see module docstring)."""
    target_ok = shift_left(loss_mask.bool() & valid.bool(), 2 + k, False)  # token t+2+k is trained & real
    return target_ok & shift_left(in_vocab.bool(), 1 + k, False)  # teacher at t+1+k greedy in draft vocab


def ttt_loss(
    step_logits: list[Tensor],
    teacher_logits: Tensor,
    in_vocab: Tensor,
    loss_mask: Tensor,
    valid: Tensor,
    step_weight: float = 0.8,
) -> tuple[Tensor, dict]:
    """Weighted soft cross-entropy over TTT steps, plus per-step metrics.

    step_logits: per-step drafter logits, each [B, T, D] (from `Eagle3Drafter.ttt_forward`).
    teacher_logits [B, T, D]: target logits over the draft vocab at each index (unshifted: index u
        holds lm_head(f_u)); in_vocab [B, T] bool: target greedy token at u is in the draft vocab.
    loss_mask [B, T]: 1 on tokens the drafter is trained to predict; valid [B, T] bool: real tokens
        of each right-padded single-sample row (a prefix of the row).
    Returns (loss, metrics) with loss = sum_k step_weight**k * mean soft-CE over the loss-carrying
    positions of step k (a step without any contributes 0), and metrics as Python numbers:
    `loss` [per step], `count` [positions per step], `acc` [drafter argmax == teacher argmax],
    `cond_count`/`cond_acc` [same, among positions where every earlier step was correct].
    """
    teacher_top = teacher_logits.argmax(-1)  # [B, T]
    total = teacher_logits.new_zeros((), dtype=torch.float32)
    chain_ok = torch.ones_like(valid, dtype=torch.bool)  # all earlier steps correct at index t
    metrics: dict[str, list] = {"loss": [], "count": [], "acc": [], "cond_count": [], "cond_acc": []}
    for k, logits in enumerate(step_logits):
        mask = step_loss_mask(loss_mask, valid, in_vocab, k)  # [B, T]
        count = int(mask.sum())
        # Gather only the loss-carrying rows: [N, D] instead of [B, T, D] fp32 temporaries. A mask
        # entry at t implies t+2+k < T, so the teacher row t+1+k exists.
        rows, cols = mask.nonzero(as_tuple=True)
        rows_logp = logits[rows, cols].float().log_softmax(-1)  # [N, D]
        rows_p = teacher_logits[rows, cols + 1 + k].float().softmax(-1)  # [N, D]
        step = -(rows_p * rows_logp).sum(-1).sum() / max(count, 1)
        total = total + step_weight**k * step
        with torch.no_grad():
            correct = (logits.argmax(-1) == shift_left(teacher_top, 1 + k)) & mask  # [B, T]
            cond = mask & chain_ok
            metrics["loss"].append(float(step.detach()))
            metrics["count"].append(count)
            metrics["acc"].append(float(correct.sum()) / count if count else 0.0)
            metrics["cond_count"].append(int(cond.sum()))
            metrics["cond_acc"].append(float((correct & cond).sum()) / int(cond.sum()) if cond.any() else 0.0)
            chain_ok = chain_ok & correct
    return total, metrics


def simulated_tau(conditional_acc: list[float]) -> float:
    """Expected accepted length of a chain draft: 1 + sum_k prod_{j<=k} acc_j (FACTS §1)."""
    tau, prod = 1.0, 1.0
    for acc in conditional_acc:
        prod *= acc
        tau += prod
    return tau
