"""The drafter's side of eyas's speculative decoding (`eyas.evaluate.specdec`): k chained drafts per
round, greedy or sampled, and the drafter's KV cache across rounds (crop to its target-state entries,
then extend with the target aux of the accepted tokens, as SGLang's draft-extend does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from eyas.evaluate.sampling import draft_distribution
from eyas.model.drafter import DrafterCache

if TYPE_CHECKING:
    from eyas.model.drafter import Eagle3Drafter


def draft_sampler(drafter: Eagle3Drafter, vocab_size: int, temperature: float, generator):
    """None at temperature 0 (greedy drafts); else `sampler(logits [D]) -> (draft index [1], q [V])`,
    drawing each draft from the drafter's distribution q."""
    if temperature == 0:
        return None
    device = next(drafter.parameters()).device
    draft_target_ids = torch.arange(len(drafter.d2t), device=device) + drafter.d2t  # [D]

    def sampler(logits):  # [D] -> (draft index [1], q [V])
        q = draft_distribution(logits, draft_target_ids, vocab_size, temperature)
        d_probs = q[draft_target_ids]  # [D]
        return torch.multinomial(d_probs, 1, generator=generator), q

    return sampler


def draft_chain(
    drafter: Eagle3Drafter, logits: Tensor, hidden_out: Tensor, position: int, k: int, cache, sampler=None
) -> tuple[list[int], list[Tensor]]:
    """k drafts: d_1 from the extend's last `logits` [D]; each further step feeds back `hidden_out`
    [1, 1, H] of the previous step and that step's draft id, one RoPE position further on.

    Greedy (argmax) without a `sampler`; with one, `sampler(logits) -> (draft index, q [V])` samples
    each draft and the q rows are returned for verification (an empty list when greedy)."""
    drafts, qs = [], []
    token = None  # [1] target id of the previous draft
    for _ in range(k):
        if token is not None:
            position += 1
            step_logits, hidden_out = drafter.forward_step(
                hidden_out, token.view(1, 1), torch.tensor([[position]], device=token.device), cache
            )  # [1, 1, D], [1, 1, H]
            hidden_out, logits = hidden_out[:, -1:], step_logits[0, -1]
        if sampler is None:
            index = logits.argmax(-1, keepdim=True)  # [1] draft id
        else:
            index, q = sampler(logits)
            qs.append(q)
        token = drafter.draft_to_target(index)  # [1] target id
        drafts.append(int(token))
    return drafts, qs


class ChainDrafter:
    """The drafter across rounds: its cache and the pending extend, the target aux [1, T, K*H] at
    indices lo .. lo+T-1 each paired with the token after it (`ids`)."""

    def __init__(self, drafter: Eagle3Drafter, aux: Tensor, ids: list[int], sampler) -> None:
        self.drafter, self.sampler = drafter, sampler
        self.device = next(drafter.parameters()).device
        self.dtype = next(p for p in drafter.parameters() if p.is_floating_point()).dtype
        self.cache = DrafterCache()
        self.aux, self.ids, self.lo = aux, ids, 0

    def draft(self, k: int) -> tuple[list[int], list[Tensor]]:
        """Run the pending extend, then chain k drafts from its last output (`draft_chain`)."""
        self.cache.crop(self.lo)  # drop chained drafts: keep only target-state entries
        hidden = self.drafter.combine_taps(self.aux.to(self.device, self.dtype))  # [1, T, H]
        ids = torch.tensor([self.ids], device=self.device)  # [1, T]
        end = self.lo + len(self.ids)
        pos = torch.arange(self.lo, end, device=self.device)[None]  # [1, T]
        d_logits, d_hidden = self.drafter.forward_step(hidden, ids, pos, self.cache)
        self.lo = end
        return draft_chain(
            self.drafter, d_logits[0, -1], d_hidden[:, -1:], end - 1, k, self.cache, self.sampler
        )

    def extend_next(self, aux: Tensor, ids: list[int]) -> None:
        """The next round's extend: aux of s_m, d_1 .. d_a with the tokens d_1 .. d_a, g_a."""
        self.aux, self.ids = aux, ids
