"""Token-budget batching for extraction: pure maths, no I/O.

Samples are sorted by length (longest first) and cut into contiguous groups, each within the budget
(`batch_size * max_len_in_batch <= token_budget`). Where to cut is chosen by dynamic programming to
minimise `padded tokens + batch_overhead_tokens * batches`: a greedy fill pads a batch with every
shorter neighbour that still fits (12% padding for 100 conversation-like samples at a 32k budget),
the optimum closes a batch early when the padding it would add costs more than another forward
(under 2% there). Longest-first means an out-of-memory batch shows up at once, not at the end.

With `window_tokens`, samples are planned window by window (consecutive samples in store order, at
most that many tokens each): the store writer can only flush a chunk once every sample in it has
arrived, so a shard-wide sort would keep most of the shard in memory as partly filled chunks;
windows bound that to about one window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BATCH_OVERHEAD_TOKENS = 256  # a forward's fixed cost (launches, sync, Python) in token-equivalents
# On a CPU a token costs ~1 ms and a forward's fixed cost a few ms, so padding dominates: with the GPU
# figure the default job's shard padded 6.4%, with this one 1.0% (bench/README.md).
CPU_BATCH_OVERHEAD_TOKENS = 16


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


def plan_batches(
    lengths: Sequence[int],
    token_budget: int,
    batch_overhead_tokens: int = BATCH_OVERHEAD_TOKENS,
    window_tokens: int | None = None,
) -> BatchPlan:
    """Batches with `len(batch) * max(lengths in batch) <= token_budget` and least padding + overhead.

    A sample longer than the budget goes alone in its batch. Every non-empty sample appears in exactly
    one batch; ties in length keep index order, so the plan is deterministic. `window_tokens`: plan
    consecutive windows of samples of at most that many tokens (a longer sample is a window alone).
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if window_tokens is not None and window_tokens < 1:
        raise ValueError(f"window_tokens must be >= 1, got {window_tokens}")
    if any(n < 0 for n in lengths):
        raise ValueError("sample lengths must be >= 0")
    batches: list[list[int]] = []
    for window in _windows(lengths, window_tokens):
        order = sorted((i for i in window if lengths[i] > 0), key=lambda i: (-lengths[i], i))
        sorted_lengths = np.array([lengths[i] for i in order], dtype=np.int64)
        cuts = _optimal_cuts(sorted_lengths, token_budget, batch_overhead_tokens)
        batches += [order[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
    empty = [i for i in range(len(lengths)) if lengths[i] == 0]
    padded = sum(len(batch) * lengths[batch[0]] for batch in batches)
    return BatchPlan(batches=batches, empty=empty, real_tokens=int(sum(lengths)), padded_tokens=padded)


def _windows(lengths: Sequence[int], window_tokens: int | None) -> list[range]:
    """Consecutive index ranges of at most `window_tokens` tokens (all samples when None)."""
    if window_tokens is None:
        return [range(len(lengths))]
    windows, start, total = [], 0, 0
    for i, n in enumerate(lengths):
        if total and total + n > window_tokens:
            windows.append(range(start, i))
            start, total = i, 0
        total += n
    windows.append(range(start, len(lengths)))
    return windows


def _optimal_cuts(widths: np.ndarray, budget: int, overhead: int) -> list[int]:
    """Boundaries 0 = c_0 < ... < c_m = n of groups [c_k, c_k+1) of the descending `widths`.

    cost[j] = least cost of the first j samples; a last group [i, j) has width widths[i] (the
    longest), size j - i, and costs size * width + overhead. Only groups within the budget (or of a
    single sample) are allowed; the window of candidates i is bounded by budget // widths[j-1].
    """
    n = len(widths)
    cost = np.zeros(n + 1)
    start = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        lo = max(0, j - max(1, budget // int(widths[j - 1])))
        i = np.arange(lo, j)
        size = j - i
        fits = (size * widths[i] <= budget) | (size == 1)
        candidates = np.where(fits, cost[i] + size * widths[i] + overhead, np.inf)
        best = int(np.argmin(candidates))  # first minimum: the largest batch among equal costs
        cost[j], start[j] = candidates[best], i[best]
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(int(start[cuts[-1]]))
    return cuts[::-1]
