"""Token-budget batching for extraction: pure maths, no I/O.

Samples are sorted by length (longest first) and packed greedily so that each batch's padded size,
`batch_size * max_len_in_batch`, stays within the budget. Sorting keeps padding waste small because
neighbours have similar lengths; longest-first means an out-of-memory batch shows up at once rather
than at the end of a long shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    """How a shard's samples are grouped into forward passes."""

    batches: list[list[int]]  # sample indices per batch, longest first inside each batch
    empty: list[int]  # zero-length samples: nothing to run, written as empty rows
    real_tokens: int  # sum of sample lengths
    padded_tokens: int  # sum over batches of batch_size * max_len_in_batch

    @property
    def padding_fraction(self) -> float:
        """Fraction of the computed token slots that are padding (0.0 for an empty plan)."""
        if self.padded_tokens == 0:
            return 0.0
        return 1.0 - self.real_tokens / self.padded_tokens


def plan_batches(lengths: Sequence[int], token_budget: int) -> BatchPlan:
    """Pack samples into batches with `len(batch) * max(lengths in batch) <= token_budget`.

    A sample longer than the budget goes alone in its batch. Every non-empty sample appears in exactly
    one batch; ties in length keep index order so the plan is deterministic.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if any(n < 0 for n in lengths):
        raise ValueError("sample lengths must be >= 0")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    empty = sorted(i for i in order if lengths[i] == 0)
    batches: list[list[int]] = []
    padded = 0
    current: list[int] = []
    current_max = 0
    for index in order:
        if lengths[index] == 0:
            continue
        # Descending order: the first sample of a batch is its longest, so the padded width is fixed.
        if current and (len(current) + 1) * current_max > token_budget:
            batches.append(current)
            padded += len(current) * current_max
            current = []
        if not current:
            current_max = lengths[index]
        current.append(index)
    if current:
        batches.append(current)
        padded += len(current) * current_max
    return BatchPlan(batches=batches, empty=empty, real_tokens=int(sum(lengths)), padded_tokens=padded)
