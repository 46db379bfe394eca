"""The arithmetic of speculative decoding's figures, in one place: accept length (tau) in both
definitions, acceptance by draft position from per-pass counts or from verify histograms, the
simulated tau of held-out accuracies, ratios, and the prompt-length budget of an evaluation.

Used by eyas's own decoding loop (`evaluate.specdec`), the served evaluation (`evaluate.served`), the
held-out metrics (`train.heldout`) and the benchmarks, so the figures they report are comparable.

Two accept lengths, over the same verify passes of a chain of k drafts:
- eyas's `tau` counts the tokens emitted by verify passes per pass. The prefill and the token it
  emits are excluded, so a pass that accepts all k drafts gives exactly k + 1.
- SGLang's `tau_sglang` (its `spec_accept_length`, and SpecForge's benchmark) divides all completion
  tokens by the verify passes, the prefill's token included: higher by 1 / passes per request.
"""

from __future__ import annotations

import numpy as np


def ratio(num: float, den: float) -> float | None:
    """num / den, or None where there is nothing to divide by (a rate of no events is unknown, not 0)."""
    return num / den if den else None


def tau(emitted: int, verify_passes: int) -> float | None:
    """eyas's accept length: tokens emitted by verify passes / verify passes."""
    return ratio(emitted, verify_passes)


def tau_from_completions(completion_tokens: int, requests: int, verify_passes: int) -> float | None:
    """eyas's accept length from a server's counts: each request's first completion token comes from
    its prefill, not from a verify pass."""
    return ratio(completion_tokens - requests, verify_passes)


def tau_sglang(completion_tokens: int, verify_passes: int) -> float | None:
    """SGLang's accept length: every completion token, the prefill's included, per verify pass."""
    return ratio(completion_tokens, verify_passes)


def simulated_tau(conditional_acc: list[float]) -> float:
    """Expected accept length of a chain draft from per-position conditional accuracies:
    1 + sum_k prod_{j<=k} acc_j (the EAGLE papers' tau under teacher forcing)."""
    total, prod = 1.0, 1.0
    for acc in conditional_acc:
        prod *= acc
        total += prod
    return total


def walked_counts(accept_run, chain_start, k: int) -> tuple[int, int]:
    """(tokens emitted, verify passes) of greedy chain decoding walked along one held-out sample.

    accept_run [T] int: leading correct drafting steps at index t (drafts t+2, t+3, ... all equal to
    the target's greedy tokens); chain_start [T] bool: a pass may start at t (token t+2 is a response
    token). From the first start, a pass accepts a = min(accept_run[t], k) drafts, emits a + 1 tokens
    and the next pass starts at t + a + 1, as in served decoding; an index that is no start (a prompt
    or user turn) is stepped over. `simulated_tau` averages over every index as a chain start; the walk
    crosses an easy stretch in fewer passes than a hard one of the same length, so over stretches of
    steady acceptance its tau is their token-weighted harmonic mean, not the arithmetic one: the
    served kind of tau.
    """
    run, start = np.asarray(accept_run), np.asarray(chain_start, dtype=bool)
    starts = np.flatnonzero(start)  # ascending
    emitted = passes = 0
    i = 0
    while i < len(starts):
        t = int(starts[i])
        a = min(int(run[t]), k)
        emitted += a + 1
        passes += 1
        i = int(np.searchsorted(starts, t + a + 1))  # the first start at or after the next pass
    return emitted, passes


def at_chain_length(by_k: list | None, k: int):
    """The entry for chain length k of a list indexed k - 1 (None past its end or without a list)."""
    return by_k[k - 1] if by_k and 1 <= k <= len(by_k) else None


def counts_from_histograms(histograms: list[list[int]], k: int) -> tuple[list[int], list[int], list[int]]:
    """(attempted, reached, accepted) [k] each from verify-pass histograms (index a = passes that
    accepted a drafts), where every pass proposes all k drafts: position i is reached when drafts
    0..i-1 were accepted and accepted when drafts 0..i were."""
    counts = [0] * (k + 1)
    for histogram in histograms:
        for accepted, passes in enumerate(histogram):
            counts[accepted] += passes
    attempted = [sum(counts)] * k
    reached = [sum(counts[i:]) for i in range(k)]
    accepted = [sum(counts[i + 1 :]) for i in range(k)]
    return attempted, reached, accepted


def acceptance_by_position(attempted: list[int], reached: list[int], accepted: list[int]) -> dict:
    """The per-position counts and their two rates: accepted / attempted (acceptance) and accepted /
    reached (conditional acceptance, given drafts 0..i-1 accepted). A rate is None where unreached."""
    return {
        "acceptance_by_position": [ratio(a, n) for a, n in zip(accepted, attempted, strict=True)],
        "conditional_acceptance_by_position": [ratio(a, n) for a, n in zip(accepted, reached, strict=True)],
        "position_attempted": list(attempted),
        "position_reached": list(reached),
        "position_accepted": list(accepted),
    }


def max_prompt_tokens(max_positions: int, max_new_tokens: int, num_draft_tokens: list[int] | int) -> int:
    """The longest prompt an evaluation decodes: the target's positions less the new tokens and, for
    the longest chain k, room for k drafts verified past the end plus the drafter's own k steps
    (2 k), and 2 positions of slack for the bonus token and the prefill's token."""
    ks = [num_draft_tokens] if isinstance(num_draft_tokens, int) else list(num_draft_tokens)
    return max_positions - max_new_tokens - 2 * max(ks) - 2
