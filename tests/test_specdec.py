"""Speculative decoding on the tiny target: greedy equality, acceptance accounting, stops, cache rollback."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch import nn

from eyas.evaluate import specdec
from eyas.evaluate.specdec import (
    accept_length,
    capture_taps,
    clip_at_stop,
    evaluate_specdec,
    first_mismatch,
    plain_generate,
    speculative_generate,
)
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import load_target, read_config

AUX = [0, 1, 2]
VOCAB = 49152


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return load_target(tiny_model_dir)


@pytest.fixture(scope="module")
def chaotic_target(tiny_model_dir):
    """The tiny target with large random weights: its greedy output depends on the whole context
    (the std-0.02 init mostly repeats one token), so a wrongly rolled-back cache changes the output."""
    model = load_target(tiny_model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def random_drafter(model_dir, seed: int = 0) -> Eagle3Drafter:
    torch.manual_seed(seed)
    return Eagle3Drafter(DrafterConfig.from_target_config(read_config(model_dir), 4096, AUX)).eval()


class OracleDrafter(nn.Module):
    """Test double with the drafter's serving interface, drafting from a known greedy continuation.

    Channel 0 of the hidden it passes around counts chain depth (0 = fc'd target taps), so it knows
    which draft (1-based) each output is. Draft j of a chain whose extend ended at index p is the true
    token iff j <= correct(p); otherwise a wrong one. It also asserts the caller's cache discipline:
    positions contiguous with the cache, extends only on top of target-state entries.
    """

    def __init__(self, reference: list[int], correct):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # device/dtype probe for the caller
        self.register_buffer("d2t", torch.zeros(VOCAB, dtype=torch.int64))
        self.reference = reference
        self.correct = correct
        self.extends: list[tuple[list[int], list[int], torch.Tensor]] = []  # (positions, ids, aux [T, 3H])
        self._aux: torch.Tensor | None = None
        self._chain_base = -1

    def combine_taps(self, aux):
        self._aux = aux[0].clone()
        return aux.new_zeros(*aux.shape[:2], 2)  # [1, T, 2]: depth 0

    def draft_to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]

    def forward_step(self, hidden, input_ids, position_ids, cache):
        pos = position_ids[0].tolist()
        depth = int(hidden[0, 0, 0])
        assert pos == list(range(cache.length, cache.length + len(pos))), (pos, cache.length)
        if depth == 0:
            if cache.length:
                assert bool((cache.key[0, 0, :, 1] == 0).all()), "extend on top of un-cropped drafts"
            self.extends.append((pos, input_ids[0].tolist(), self._aux))
            self._chain_base = pos[-1]
        marks = torch.tensor([[float(p), float(depth)] for p in pos])[None, None]  # [1, 1, T, 2]
        cache.append(marks, marks)
        draft_index = depth + 1
        true = self.reference[pos[-1] + 2] if pos[-1] + 2 < len(self.reference) else 0
        token = true if draft_index <= self.correct(self._chain_base) else (true + 1) % VOCAB
        logits = torch.zeros(1, len(pos), VOCAB)
        logits[0, -1, token] = 1.0
        return logits, hidden.new_full((1, len(pos), 2), float(depth + 1))


def reference_of(model, prompt: list[int], length: int) -> list[int]:
    return prompt + plain_generate(model, prompt, length, set())


def scrambled(seed: int, k: int):
    """A deterministic per-chain number of correct drafts in [0, k]."""
    return lambda base: zlib.crc32(f"{seed}:{base}".encode()) % (k + 1)


# --------------------------------------------------------------------------- pure helpers
def test_accept_length_and_clip():
    assert accept_length([5, 6, 7], [5, 6, 9, 1]) == 2
    assert accept_length([5], [4, 5]) == 0
    assert accept_length([], [3]) == 0
    assert accept_length([1, 2], [1, 2, 3]) == 2
    assert clip_at_stop([1, 2, 3], 5, {2}) == ([1, 2], True)
    assert clip_at_stop([1, 2, 3], 2, set()) == ([1, 2], True)
    assert clip_at_stop([1, 2, 3], 4, set()) == ([1, 2, 3], False)
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


def test_tap_capture_is_hf_hidden_states_plus_one(target):
    ids = torch.tensor([[5, 17, 300, 4000, 9]])
    with capture_taps(target, AUX) as taps, torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        aux = taps.take_concat()  # [1, T, 3H]
    want = torch.cat([out.hidden_states[v + 1] for v in AUX], dim=-1)
    torch.testing.assert_close(aux, want)
    with torch.no_grad():
        target(input_ids=ids)
    assert not taps.outputs  # hooks removed on exit: the later forward captured nothing


# --------------------------------------------------------------------------- (a) untrained drafter
def test_random_drafter_matches_greedy(tiny_model_dir, target):
    drafter = random_drafter(tiny_model_dir)
    prompt = [1, 42, 977, 3051, 12]
    want = plain_generate(target, prompt, 16, set())
    got, stats = speculative_generate(target, drafter, prompt, 16, 4, set(), AUX)
    assert got == want and len(got) == 16
    assert stats.generated == 16 and stats.tau is not None and stats.tau >= 1.0
    assert stats.verify_passes == len(stats.accepted_per_pass) <= 15
    assert sum(stats.accepted_per_pass) + stats.verify_passes == stats.generated - 1


# --------------------------------------------------------------------------- (b) oracle drafter
@pytest.mark.parametrize("k", [1, 3, 5])
def test_oracle_accepts_everything(chaotic_target, k):
    prompt = [7, 1234, 99, 40000]
    max_new = 1 + 3 * (k + 1)  # x_n, then exactly three full passes
    reference = reference_of(chaotic_target, prompt, max_new + k + 2)
    drafter = OracleDrafter(reference, correct=lambda base: k)
    got, stats = speculative_generate(chaotic_target, drafter, prompt, max_new, k, set(), AUX)
    assert got == reference[len(prompt) : len(prompt) + max_new]
    assert stats.accepted_per_pass == [k, k, k] and stats.drafted_per_pass == [k, k, k]
    assert stats.tau == k + 1
    assert stats.position_accepted == [3] * k == stats.position_attempted


def test_oracle_extends_pair_target_aux_with_next_token(chaotic_target):
    """Every drafter extend feeds the target's aux at index t with token t+1, each index exactly once."""
    prompt = [3, 500, 20000, 77, 8]
    k, max_new = 3, 14
    reference = reference_of(chaotic_target, prompt, max_new + k + 2)
    drafter = OracleDrafter(reference, correct=scrambled(1, k))
    got, _ = speculative_generate(chaotic_target, drafter, prompt, max_new, k, set(), AUX)
    sequence = prompt + got
    with capture_taps(chaotic_target, AUX) as taps, torch.no_grad():
        chaotic_target(input_ids=torch.tensor([sequence]))
        full_aux = taps.take_concat()[0]  # [T, 3H]
    positions = [p for pos, _, _ in drafter.extends for p in pos]
    assert positions == list(range(len(positions))) and len(positions) >= len(prompt)
    for pos, ids, aux in drafter.extends:
        assert ids == [sequence[p + 1] for p in pos]
        torch.testing.assert_close(aux, full_aux[pos[0] : pos[-1] + 1], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- (c) stops
def test_max_new_tokens_is_never_exceeded(chaotic_target, tiny_model_dir):
    prompt = [11, 222, 3333]
    k = 3
    reference = reference_of(chaotic_target, prompt, 20)
    drafter = random_drafter(tiny_model_dir)
    assert speculative_generate(chaotic_target, drafter, prompt, 0, k, set(), AUX)[0] == []
    assert plain_generate(chaotic_target, prompt, 0, set()) == []
    one, stats = speculative_generate(chaotic_target, drafter, prompt, 1, k, set(), AUX)
    assert one == reference[3:4] and stats.verify_passes == 0 and stats.tau is None
    for max_new in range(2, 12):
        oracle = OracleDrafter(reference, correct=lambda base: k)
        got, stats = speculative_generate(chaotic_target, oracle, prompt, max_new, k, set(), AUX)
        assert got == reference[3 : 3 + max_new], max_new
        assert all(d <= k for d in stats.drafted_per_pass)
        assert stats.position_attempted[0] <= max_new - 1


def test_eos_stops_both_decoders(chaotic_target, tiny_model_dir):
    prompt = [11, 222, 3333]
    greedy = plain_generate(chaotic_target, prompt, 20, set())
    stop_at = 6
    eos = {greedy[stop_at]}
    cut = greedy[: greedy.index(greedy[stop_at]) + 1]  # through the first occurrence of that token
    assert plain_generate(chaotic_target, prompt, 20, eos) == cut
    reference = prompt + greedy
    for drafter in (OracleDrafter(reference, correct=lambda base: 5), random_drafter(tiny_model_dir)):
        got, stats = speculative_generate(chaotic_target, drafter, prompt, 20, 5, eos, AUX)
        assert got == cut and stats.generated == len(cut)
    first_eos = {greedy[0]}
    got, stats = speculative_generate(
        chaotic_target, random_drafter(tiny_model_dir), prompt, 20, 3, first_eos, AUX
    )
    assert got == greedy[:1] and stats.verify_passes == 0


# --------------------------------------------------------------------------- (d) cache rollback
@pytest.mark.parametrize("k", [1, 3, 5])
def test_rollback_equals_greedy_over_random_prompts(chaotic_target, tiny_model_dir, k):
    gen = torch.Generator().manual_seed(k)
    drafter = random_drafter(tiny_model_dir, seed=k)
    for trial in range(4):
        prompt = torch.randint(0, VOCAB, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen)
        prompt = prompt.tolist()
        max_new = 18
        reference = reference_of(chaotic_target, prompt, max_new + k + 2)
        correct = scrambled(trial, k)
        oracle = OracleDrafter(reference, correct=correct)
        got, stats = speculative_generate(chaotic_target, oracle, prompt, max_new, k, set(), AUX)
        assert got == reference[len(prompt) : len(prompt) + max_new], (k, trial)
        # accepted = the oracle's correct-prefix length, capped by the drafts proposed in that pass
        bases = [pos[-1] for pos, _, _ in oracle.extends]
        want = [min(correct(b), d) for b, d in zip(bases, stats.drafted_per_pass, strict=False)]
        assert stats.accepted_per_pass[: len(want)] == want
        assert len(set(stats.accepted_per_pass)) > 1  # mixed acceptance: partial rollbacks happened
        got_random, _ = speculative_generate(chaotic_target, drafter, prompt, max_new, k, set(), AUX)
        assert got_random == got


# --------------------------------------------------------------------------- evaluate_specdec
def test_evaluate_specdec_reports(tiny_model_dir, monkeypatch):
    prompts = [[1, 42, 977], [5, 6, 7, 8, 9]]
    drafter = random_drafter(tiny_model_dir)
    kwargs = dict(max_new_tokens=8, num_draft_tokens=3, eos_token_ids={2}, aux_layer_ids=AUX)
    report = evaluate_specdec(tiny_model_dir, drafter, prompts, **kwargs)
    assert report["greedy_equal"]["mismatch_count"] == 0 and report["greedy_equal"]["equal_prompts"] == 2
    assert report["tau"] >= 1.0 and report["speedup"] > 0 and report["spec_tokens_per_s"] > 0
    assert len(report["acceptance_by_position"]) == 3 and len(report["per_prompt"]) == 2
    assert report["verify_passes"] == sum(r["verify_passes"] for r in report["per_prompt"])

    real_greedy = specdec.plain_generate

    def off_by_one(target, prompt, max_new_tokens, eos):
        out = real_greedy(target, prompt, max_new_tokens, eos)
        return out[:2] + [(out[2] + 1) % VOCAB] + out[3:] if len(out) > 2 else out

    monkeypatch.setattr(specdec, "plain_generate", off_by_one)
    report = evaluate_specdec(tiny_model_dir, drafter, prompts, **kwargs)
    mismatch = report["greedy_equal"]
    assert mismatch["mismatch_count"] == 2 and mismatch["mismatches"][0] == {"prompt": 0, "first_mismatch": 2}
    assert report["per_prompt"][1]["equal"] is False


def test_greedy_cache_decodes_each_prompt_once_and_still_checks(tiny_model_dir, monkeypatch):
    prompts = [[1, 42, 977], [5, 6, 7, 8, 9]]
    kwargs = dict(max_new_tokens=8, num_draft_tokens=3, eos_token_ids={2}, aux_layer_ids=AUX)
    real_greedy, calls = specdec.plain_generate, []
    monkeypatch.setattr(specdec, "plain_generate", lambda *a, **k: calls.append(a[1]) or real_greedy(*a, **k))
    cache: dict = {}
    first = evaluate_specdec(
        tiny_model_dir, random_drafter(tiny_model_dir), prompts, **kwargs, greedy_cache=cache
    )
    decoded = len(calls)  # the warm-up + one per prompt
    other = random_drafter(tiny_model_dir, seed=1)
    second = evaluate_specdec(tiny_model_dir, other, prompts, **kwargs, greedy_cache=cache)
    assert sorted(cache) == [0, 1] and len(calls) == decoded + 1  # the second call: its warm-up only
    for report in (first, second):
        assert report["greedy_equal"]["equal_prompts"] == 2 and report["greedy_equal"]["mismatch_count"] == 0
    assert [r["greedy_seconds"] for r in first["per_prompt"]] == [
        r["greedy_seconds"] for r in second["per_prompt"]
    ]
    # a wrong cached reference is caught, not trusted blindly
    cache[1] = ([(cache[1][0][0] + 1) % VOCAB, *cache[1][0][1:]], cache[1][1])
    third = evaluate_specdec(tiny_model_dir, other, prompts, **kwargs, greedy_cache=cache)
    assert third["greedy_equal"]["mismatches"] == [{"prompt": 1, "first_mismatch": 0}]


def test_a_loaded_target_is_used_as_is(tiny_model_dir, monkeypatch):
    """A set's drafters share one loaded target (evaluate/stage_specdec.py): passing it gives the report a
    fresh load gives, and nothing is loaded again."""
    from eyas.model.target import load_target

    prompts = [[1, 42, 977], [5, 6, 7, 8, 9]]
    kwargs = dict(max_new_tokens=8, num_draft_tokens=3, eos_token_ids={2}, aux_layer_ids=AUX)
    drafter = random_drafter(tiny_model_dir)
    fresh = evaluate_specdec(tiny_model_dir, drafter, prompts, **kwargs)
    target = load_target(tiny_model_dir)
    monkeypatch.setattr(specdec, "load_target", lambda *a, **k: pytest.fail("target loaded again"))
    shared = evaluate_specdec(tiny_model_dir, drafter, prompts, **kwargs, target=target)
    timing = ("wall_seconds", "greedy_seconds", "tokens_per_s")
    for a, b in zip(fresh["per_prompt"], shared["per_prompt"], strict=True):
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in b.items() if k not in timing
        }
    assert fresh["tau"] == shared["tau"] and shared["greedy_equal"]["equal_prompts"] == 2
