"""The tree-of-steps attention of a TTT step as causal flash attention plus a log-sum-exp merge.

Step k's query at index t attends the step-0 keys causally and, at index t only, the keys of steps
1..k (`eyas.model.drafter.tree_attention`, docs/design.md). The masked form hands SDPA a boolean mask
over [causal keys ; k*T diagonal keys], which rules out the flash kernel and computes every masked
block. Here the causal part runs as plain causal flash attention, which also returns its log-sum-exp
L [B, h, T], and the k diagonal scores per query are a small [B, h, T, k] product; the two parts merge
by their weights softmax([L, d_1..d_k]) — exactly the masked softmax, regrouped.

L must carry gradient too, which SDPA's public call does not return. `CausalWithLse` calls the flash
kernel's forward and backward ops itself (`aten::_scaled_dot_product_flash_attention` and its
backward on CUDA, `..._for_cpu` on CPU) and folds L's gradient g into the backward's D = rowsum(dO * O)
term: the kernel's dS = P * (dP - D) becomes P * (dP - D + g), the gradient of O and L together, when it
is handed one extra value column that is 0 in V, 1 in O and -g in dO (padded to 8 columns, the kernels'
head-size step; zero columns in Q and K leave the scores unchanged). The backward reads O only for D
(FlashAttention-2's `dot_do_o`; the CPU kernel alike): tests/test_causal_lse.py checks every gradient
against the masked attention's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from eyas.model.compiled import compiled_if

HEAD_STEP = 8  # the flash kernels take head sizes in multiples of 8


def supported(q: Tensor, v: Tensor) -> bool:
    """Whether this path serves these tensors: equal q/v head sizes (not MLA's), a flash kernel's dtype."""
    if q.shape[-1] != v.shape[-1] or q.shape[-1] % HEAD_STEP:
        return False
    if q.device.type == "cuda":
        return q.dtype in (torch.float16, torch.bfloat16)
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16)


def _forward(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor, tuple]:
    """(out [B, h, T, hd], lse [B, h, T] float32, what the backward op needs besides them)."""
    if q.device.type == "cuda":
        flash = torch.ops.aten._scaled_dot_product_flash_attention
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = flash(q, k, v, 0.0, True, False, scale=scale)
        return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    return out, lse, ()


def _backward(grad, q, k, v, out, lse, extra: tuple, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    if q.device.type == "cuda":
        cum_q, cum_k, max_q, max_k, seed, offset = extra
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True, seed, offset, scale=scale
        )
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, True, scale=scale
    )


class CausalWithLse(torch.autograd.Function):
    """(out, lse) of causal attention, differentiable in both. q, k, v [B, h, T, hd], contiguous."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float):
        out, lse, extra = _forward(q, k, v, scale)
        ctx.set_materialize_grads(False)  # an unused lse (step 0) then gets None, not zeros
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.extra, ctx.scale = extra, scale
        return out, lse

    @staticmethod
    def backward(ctx, grad_out: Tensor | None, grad_lse: Tensor | None):
        q, k, v, out, lse = ctx.saved_tensors
        hd = q.shape[-1]
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if grad_lse is None:  # O's gradient alone: the kernel as it is
            dq, dk, dv = _backward(grad_out.contiguous(), q, k, v, out, lse, ctx.extra, ctx.scale)
            return dq, dk, dv, None
        pad = q.new_zeros(*q.shape[:-1], HEAD_STEP)  # [B, h, T, 8]
        ones = pad.clone()
        ones[..., 0] = 1
        minus_g = pad.clone()
        minus_g[..., 0] = -grad_lse.to(pad.dtype)
        dq, dk, dv = _backward(
            torch.cat([grad_out, minus_g], -1),  # torch.cat's results are contiguous, as the kernels need
            torch.cat([q, pad], -1),
            torch.cat([k, pad], -1),
            torch.cat([v, pad], -1),
            torch.cat([out, ones], -1),
            lse,
            ctx.extra,
            ctx.scale,
        )
        return dq[..., :hd], dk[..., :hd], dv[..., :hd], None


def tree_attention_lse(
    q: Tensor, k0: Tensor, v0: Tensor, k_diag: Tensor, v_diag: Tensor, compile_merge: bool = False
) -> Tensor:
    """`eyas.model.drafter.tree_attention`'s result (same arguments: q, k0, v0 [B, h, T, hd]; k_diag,
    v_diag [B, h, T, k, hd]) by causal flash attention and a merge (`merge_diagonal`, compiled with
    `compile_merge`: train.compile); `supported` must hold."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    out, lse = CausalWithLse.apply(q.contiguous(), k0.contiguous(), v0.contiguous(), scale)
    if k_diag.shape[3] == 0:
        return out
    return compiled_if(merge_diagonal, compile_merge)(q, out, lse, k_diag, v_diag, scale)


def merge_diagonal(
    q: Tensor, out: Tensor, lse: Tensor, k_diag: Tensor, v_diag: Tensor, scale: float
) -> Tensor:
    """The causal part (out [B, h, T, hd], lse [B, h, T]) merged with the diagonal keys and values
    (k_diag, v_diag [B, h, T, k, hd]) of queries q [B, h, T, hd], by their softmax weights."""
    diag = torch.einsum("bhtd,bhtjd->bhtj", q.float(), k_diag.float()) * scale  # [B, h, T, k]
    weights = torch.softmax(torch.cat([lse.float().unsqueeze(-1), diag], dim=-1), dim=-1)  # [B, h, T, 1+k]
    merged = weights[..., :1] * out.float() + torch.einsum(
        "bhtj,bhtjd->bhtd", weights[..., 1:], v_diag.float()
    )
    return merged.to(q.dtype)  # [B, h, T, hd]
