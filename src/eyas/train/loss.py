"""TTT loss and accuracy metrics (pure functions; alignment exactly as in docs/design.md).

Step k at index t predicts token t+2+k. Its teacher is the target distribution at index t+1+k
(target lm_head of the stored final state there), restricted to the draft vocab. The position carries
loss iff loss_mask[t+2+k] == 1, t+2+k lies inside the sample, and the target's greedy token at
t+1+k (argmax over the FULL vocab) is in the draft vocab. Avoided peer bugs (SpecForge's issues): the mask is
shifted together with the teacher (SpecForge #885), the loss is averaged over loss-carrying positions
only, and the full-vocab logits are never materialised for a whole sequence (#580).
"""

from __future__ import annotations

import torch
from torch import Tensor

from eyas.model.compiled import compiled_if

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


def target_trained(loss_mask: Tensor, valid: Tensor, k: int) -> Tensor:
    """[B, T] bool: token t+2+k, the one step k at index t predicts, is trained and real."""
    return shift_left(loss_mask.bool() & valid.bool(), 2 + k, False)


def step_loss_mask(loss_mask: Tensor, valid: Tensor, in_vocab: Tensor, k: int) -> Tensor:
    """[B, T] bool: step k at index t carries loss (see module docstring)."""
    target_ok = target_trained(loss_mask, valid, k)
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
    `cond_count`/`cond_acc` [same, among positions where every earlier step was correct]; and one
    tensor, `accept_run` [B, T] int64: the leading correct steps at each index (a chain drafted there
    would have that many drafts accepted; `walked_counts` walks it).
    """
    teacher_top = teacher_logits.argmax(-1)  # [B, T]
    total = teacher_logits.new_zeros((), dtype=torch.float32)
    chain_ok = torch.ones_like(valid, dtype=torch.bool)  # all earlier steps correct at index t
    accept_run = torch.zeros_like(valid, dtype=torch.long)  # [B, T]
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
            accept_run += chain_ok
    metrics["accept_run"] = accept_run
    return total, metrics


# --------------------------------------------------------------------------- chunked training loss
ROW_CHUNK = 1024  # loss rows per block: [1024, D] fp32 logits/teacher/grad at a time (128 MB at D = 32k)


def soft_ce_block(x: Tensor, weight: Tensor, teacher_in: Tensor, teacher_weight: Tensor | None):
    """One block of `_LinearSoftCE`: x [C, H] drafter rows, weight [D, H] its head; teacher_in [C, D]
    teacher logits, or [C, H] teacher states when teacher_weight [D, H] is given. Returns (soft-CE summed
    over the rows, fp32 scalar; correct [C] bool; d loss / d x [C, H] in x's dtype; d loss / d weight
    [D, H]). The matmuls run in the autocast dtype when autocast is on, the softmaxes in fp32."""
    logits = (x @ weight.T).float()  # [C, D]
    teacher = (teacher_in if teacher_weight is None else teacher_in @ teacher_weight.T).float()  # [C, D]
    p = teacher.softmax(-1)
    logp = logits.log_softmax(-1)
    loss = -(p * logp).sum()
    correct = logits.argmax(-1) == teacher.argmax(-1)
    g = logp.exp() - p  # [C, D] d loss / d logits
    return loss, correct, (g @ weight.to(g.dtype)).to(x.dtype), g.T @ x.to(g.dtype)


class _LinearSoftCE(torch.autograd.Function):
    """sum_rows soft-CE(softmax(tx @ tw.T) || log_softmax(x @ w.T)), never holding [N, D] at once.

    Gradients w.r.t. x and w are computed in the forward pass block by block (d loss / d logits =
    softmax(logits) - p), so backward only scales them: only [N, H] + [D, H] are kept, not [N, D].
    With tw None, tx already holds the teacher logits [N, D] (cached by the caller). `block`: the
    function of one block (`soft_ce_block`, or its compiled form: train.compile fuses the softmaxes,
    the product and the gradient of a [C, D] block into a few kernels instead of ~10 passes over it).
    Returns (loss_sum fp32 scalar, correct [N] bool = drafter argmax == teacher argmax).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, tx: Tensor, tw: Tensor | None, chunk: int, block):
        n = x.shape[0]
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        correct = torch.zeros(n, dtype=torch.bool, device=x.device)
        grad_x = torch.zeros_like(x)  # [N, H]
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # [D, H]
        for lo in range(0, n, chunk):
            part, right, gx, gw = block(x[lo : lo + chunk], weight, tx[lo : lo + chunk], tw)
            loss += part
            correct[lo : lo + chunk] = right
            grad_x[lo : lo + chunk] = gx
            grad_w += gw
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_correct):
        grad_x, grad_w = ctx.saved_tensors
        return grad_loss * grad_x, (grad_loss * grad_w).to(ctx.weight_dtype), None, None, None, None


TEACHER_CACHE_BYTES = 1 << 30  # cache [B, T, D] teacher logits up to 1 GiB (the CPU default: ~32 MB)


def teacher_cache_fits(final: Tensor, draft_size: int, dtype: torch.dtype) -> bool:
    """Whether [B, T, D] teacher logits of this batch are cheap enough to keep for all TTT steps."""
    b, t, _ = final.shape
    return b * t * draft_size * torch.finfo(dtype).bits // 8 <= TEACHER_CACHE_BYTES


def teacher_in_vocab(final: Tensor, head: Tensor, t2d: Tensor, chunk: int = ARGMAX_CHUNK) -> Tensor:
    """[B, T] bool: the target's greedy token (full-vocab argmax of lm_head(final)) is in the draft vocab.

    final [B, T, H], head [V, H], t2d [V] bool. Only [chunk, V] logits exist at a time.
    """
    b, t, h = final.shape
    flat = final.reshape(b * t, h)
    greedy = torch.empty(b * t, dtype=torch.long, device=final.device)
    with torch.no_grad():
        for lo in range(0, b * t, chunk):
            greedy[lo : lo + chunk] = (flat[lo : lo + chunk] @ head.T).argmax(-1)  # [chunk, V] -> [chunk]
    return t2d[greedy].view(b, t)


def step_counts(loss_mask: Tensor, valid: Tensor, in_vocab: Tensor, steps: int) -> list[int]:
    """Loss-carrying positions of each TTT step (the normalisers of `ttt_loss_chunked`)."""
    masks = [step_loss_mask(loss_mask, valid, in_vocab, k).sum() for k in range(steps)]
    return [int(n) for n in torch.stack(masks).tolist()]  # one device-to-host copy, not one per step


def ttt_loss_chunked(
    step_hidden: list[Tensor],
    norm: torch.nn.Module,
    lm_head_weight: Tensor,
    final: Tensor,
    draft_head: Tensor,
    in_vocab: Tensor,
    loss_mask: Tensor,
    valid: Tensor,
    step_weight: float = 0.8,
    counts: list[int] | None = None,
    chunk: int = ROW_CHUNK,
    teacher_logits: Tensor | None = None,
    compiled: bool = False,
) -> tuple[Tensor, dict]:
    """`ttt_loss` without [B, T, D] tensors: logits and the teacher are built per block of loss rows.

    step_hidden: per-step pre-norm drafter hidden [B, T, H] (`Eagle3Drafter.ttt_hidden`); norm and
    lm_head_weight [D, H]: the drafter's final norm and head; final [B, T, H]: stored target states;
    draft_head [D, H]: target lm_head rows of the draft vocab (the teacher restricted to it);
    in_vocab [B, T] from `teacher_in_vocab`. counts: per-step normalisers; None = this batch's own
    counts (pass global counts when a step's batch is split over micro-batches or ranks, so the sum
    of the parts' losses and gradients is the loss of the whole).
    compiled: the blocks' `torch.compile`d form (`eyas.model.compiled`).
    Returns (loss, metrics) with the keys of `ttt_loss` plus integer `correct` / `cond_correct`.
    """
    block = compiled_if(soft_ce_block, compiled)
    total = final.new_zeros((), dtype=torch.float32)
    chain_ok = torch.ones_like(valid, dtype=torch.bool)
    counts_here, sums = [], []  # per step: positions (known on the host), [loss, correct, cond, cond_correct]
    for k, hidden in enumerate(step_hidden):
        mask = step_loss_mask(loss_mask, valid, in_vocab, k)  # [B, T]
        rows, cols = mask.nonzero(as_tuple=True)
        count = int(rows.numel())
        norm_count = counts[k] if counts is not None else count
        x = norm(hidden[rows, cols])  # [N, H]
        if teacher_logits is None:
            tx, tw = final[rows, cols + 1 + k], draft_head  # [N, H] teacher states at t+1+k
        else:
            tx, tw = teacher_logits[rows, cols + 1 + k], None  # [N, D]
        loss_sum, row_correct = _LinearSoftCE.apply(x, lm_head_weight, tx, tw, chunk, block)
        step = loss_sum / max(norm_count, 1)
        total = total + step_weight**k * step
        with torch.no_grad():
            correct = torch.zeros_like(mask)
            correct[rows, cols] = row_correct
            cond = mask & chain_ok
            parts = [step.detach(), row_correct.sum(), cond.sum(), (correct & cond).sum()]
            sums.append(torch.stack([p.double() for p in parts]))
            counts_here.append(count)
            chain_ok = chain_ok & correct
    # one device-to-host copy for every step's figures: a read per figure would stall the GPU's queue
    # (the host waits for it, then launches the next kernels to an idle GPU) ~30 times a micro-batch
    table = torch.stack(sums).tolist() if sums else []
    metrics: dict[str, list] = {"loss": [row[0] for row in table], "count": counts_here}
    metrics["correct"] = [int(row[1]) for row in table]
    metrics["cond_count"] = [int(row[2]) for row in table]
    metrics["cond_correct"] = [int(row[3]) for row in table]
    metrics["acc"] = [c / n if n else 0.0 for c, n in zip(metrics["correct"], counts_here, strict=True)]
    metrics["cond_acc"] = [
        c / n if n else 0.0 for c, n in zip(metrics["cond_correct"], metrics["cond_count"], strict=True)
    ]
    return total, metrics
