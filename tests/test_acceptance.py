"""The arithmetic of speculative decoding's figures (eyas.core.acceptance): both accept lengths, the
per-position rates from either source, and the prompt budget."""

from __future__ import annotations

import pytest

from eyas.core.acceptance import (
    acceptance_by_position,
    counts_from_histograms,
    max_prompt_tokens,
    ratio,
    tau,
    tau_from_completions,
    tau_sglang,
    walked_counts,
)
from eyas.evaluate.specdec import SpecStats


def test_ratio_of_nothing_is_unknown():
    assert ratio(3, 4) == 0.75
    assert ratio(0, 0) is None


def test_the_two_accept_lengths_differ_by_the_prefill_token():
    # two requests: 9 and 5 completion tokens, 4 and 2 verify passes
    completion, requests, verify = 9 + 5, 2, 4 + 2
    assert tau_sglang(completion, verify) == pytest.approx(14 / 6)
    assert tau_from_completions(completion, requests, verify) == pytest.approx(12 / 6)
    assert tau(12, 6) == tau_from_completions(completion, requests, verify)
    assert tau(5, 0) is None


def test_histogram_counts_equal_the_decoding_loops_own_counts():
    """The served evaluation's histograms and eyas's per-pass record give one set of counts."""
    k = 3
    accepted_per_pass = [0, 3, 1, 2, 3, 0]
    stats = SpecStats(num_draft_tokens=k, drafted_per_pass=[k] * 6, accepted_per_pass=accepted_per_pass)
    histogram = [accepted_per_pass.count(a) for a in range(k + 1)]
    assert counts_from_histograms([histogram], k) == (
        stats.position_attempted,
        stats.position_reached,
        stats.position_accepted,
    )
    rates = acceptance_by_position(*counts_from_histograms([histogram], k))
    assert rates["acceptance_by_position"] == [4 / 6, 3 / 6, 2 / 6]
    assert rates["conditional_acceptance_by_position"] == [4 / 6, 3 / 4, 2 / 3]


def test_an_unreached_position_has_no_rate():
    rates = acceptance_by_position([4, 4], [4, 0], [0, 0])
    assert rates["conditional_acceptance_by_position"] == [0.0, None]


def test_prompt_budget_leaves_room_for_the_longest_chain():
    assert max_prompt_tokens(2048, 48, 4) == 2048 - 48 - 10
    assert max_prompt_tokens(2048, 48, [3, 5]) == max_prompt_tokens(2048, 48, 5)


def test_the_walk_starts_each_chain_where_the_last_one_ended():
    run = [2, 0, 0, 1, 0, 0]  # leading correct drafts at each index
    # passes at 0 (2 accepted), 3 (1), 5 (0): 6 tokens in 3 passes, where the average over every index
    # as a chain start, (3 + 1 + 1 + 2 + 1 + 1) / 6 = 1.5, would be another figure
    assert walked_counts(run, [True] * 6, k=3) == (6, 3)
    assert walked_counts(run, [True] * 6, k=1) == (2 + 1 + 2 + 1, 4)  # chains cut at k = 1: 0, 2, 3, 5
    # a prompt stretch (no start) is stepped over; the walk resumes at the next start
    assert walked_counts([1, 3, 0, 0, 1, 0], [True, False, False, True, True, True], k=3) == (2 + 1 + 2, 3)
    assert walked_counts([1, 1], [False, False], k=3) == (0, 0)
