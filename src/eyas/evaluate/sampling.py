"""Token choice for speculative decoding at temperature T: greedy (T == 0) or sampled (T > 0).

At T > 0 the drafter samples each draft from its own distribution q and the target verifies with the
standard speculative-sampling rule (Leviathan et al. 2023, Chen et al. 2023): draft x at position i is
accepted with probability min(1, p_i(x) / q_i(x)); the first rejected position emits a token from
normalize(max(0, p_i - q_i)); if every draft is accepted, a bonus token comes from p_k. Each emitted
token is then distributed exactly as plain sampling from the target's p, whatever q is.

All functions are pure apart from the `generator` they draw from. p and q are over the target vocab;
the drafter's q is zero outside its draft vocab.
"""

from __future__ import annotations

import torch
from torch import Tensor


def probs(logits: Tensor, temperature: float) -> Tensor:
    """softmax(logits / T) in fp32 over the last dim. logits [..., V] -> [..., V]."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def pick(logits: Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """One token from logits [V]: argmax at T == 0, else a sample of softmax(logits / T)."""
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(probs(logits, temperature), 1, generator=generator))


def draft_distribution(draft_logits: Tensor, draft_target_ids: Tensor, vocab_size: int, temperature: float):
    """The drafter's q over the target vocab: draft_logits [D] -> [V], zero outside the draft vocab."""
    q = draft_logits.new_zeros(vocab_size, dtype=torch.float32)  # [V]
    q[draft_target_ids] = probs(draft_logits, temperature)
    return q


def rejection_verify(
    drafts: list[int], q: Tensor, p: Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """Speculative sampling of one verify pass.

    drafts: k draft ids (target vocab), each sampled from its row of q [k, V]; p [k + 1, V] the
    target's probabilities at s_m, d_1 .. d_k. Returns (a, token): drafts d_1 .. d_a are accepted and
    `token` follows them (the residual sample at the first rejection, or the bonus from p[k]).
    """
    k = len(drafts)
    if q.shape[0] != k or p.shape[0] != k + 1:
        shapes = f"{tuple(q.shape)}, {tuple(p.shape)}"
        raise ValueError(f"rejection_verify: {k} drafts need q [k, V], p [k+1, V]; got {shapes}")
    for i, d in enumerate(drafts):
        u = torch.rand((), generator=generator, device=p.device)
        # accept with probability min(1, p/q); q[i, d] > 0 because d was drawn from q[i]
        if u * q[i, d] < p[i, d]:
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)  # [V]
        total = residual.sum()
        # total == 0 only if p == q, where rejection has probability 0; fall back to p for rounding.
        weights = residual / total if total > 0 else p[i]
        return i, int(torch.multinomial(weights, 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))
