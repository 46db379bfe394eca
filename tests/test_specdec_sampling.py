"""Speculative sampling (temperature > 0) emits tokens distributed exactly as plain target sampling.

Tolerance: for n draws from a distribution over V outcomes, the Bretagnolle-Huber-Carol inequality
gives P(TV(empirical, true) > eps) <= 2**V * exp(-2 n eps**2). `tv_bound` solves it for a false-alarm
probability of 1e-4, so a correct implementation fails with probability below 1e-4 (the draws are
also seeded, so the test is deterministic). Each test also runs known-wrong verifiers through the same
check and asserts they fail it, so the tolerance has power.
"""

from __future__ import annotations

import math

import pytest
import torch

from eyas.evaluate import specdec
from eyas.evaluate.sampling import rejection_verify
from eyas.evaluate.specdec import speculative_generate
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import load_target, read_config

ALPHA = 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


def tv_bound(n: int, v: int, alpha: float = ALPHA) -> float:
    return math.sqrt((v * math.log(2) + math.log(1 / alpha)) / (2 * n))


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


# --------------------------------------------------------------------------- wrong verifiers
def accept_always(drafts, q, p, generator):
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def resample_from_p(drafts, q, p, generator):
    """Right acceptance test, but the rejection samples p instead of the residual max(0, p - q)."""
    for i, d in enumerate(drafts):
        if torch.rand((), generator=generator) * q[i, d] >= p[i, d]:
            return i, int(torch.multinomial(p[i], 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[-1], 1, generator=generator))


# --------------------------------------------------------------------------- pure verifier
P0 = torch.tensor([0.50, 0.25, 0.10, 0.10, 0.05, 0.00])
Q0 = torch.tensor([0.05, 0.15, 0.30, 0.10, 0.20, 0.20])  # q puts mass where p has none (token 5)
P1 = torch.tensor([0.05, 0.05, 0.10, 0.20, 0.30, 0.30])


def first_two(verify, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the first emitted token, and of the second one when the draft was accepted."""
    gen = torch.Generator().manual_seed(seed)
    first, second = torch.zeros(6), torch.zeros(6)
    q, p = Q0[None], torch.stack([P0, P1])
    for _ in range(n):
        d = int(torch.multinomial(Q0, 1, generator=gen))
        a, token = verify([d], q, p, gen)
        if a == 1:
            first[d] += 1
            second[token] += 1
        else:
            first[token] += 1
    return first, second


def test_rejection_verify_emits_target_distribution():
    n = 6000
    first, second = first_two(rejection_verify, n)
    eps = tv_bound(n, 6)  # 0.033; resample_from_p is 0.175 off, accept_always 0.55
    assert tv(first, P0) < eps, (first / n, eps)
    # the bonus after an accepted draft comes from p_1; accepted draws: sum_x min(p, q) = 0.45 of n
    assert second.sum() > 0.4 * n and tv(second, P1) < tv_bound(int(second.sum()), 6)
    assert first[5] == 0  # never emits a token the target gives probability 0
    for wrong in (accept_always, resample_from_p):
        bad, _ = first_two(wrong, n)
        assert tv(bad, P0) > 3 * eps, wrong.__name__


def test_rejection_verify_checks_shapes():
    with pytest.raises(ValueError, match="2 drafts"):
        rejection_verify([1, 2], torch.zeros(1, 6), torch.zeros(3, 6), None)


# --------------------------------------------------------------------------- end to end, tiny target
V = 16  # a vocab small enough to estimate the distribution of a generated token
AUX = [0, 1, 2]
PROMPT = [3, 7, 1, 12]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A 4-layer Llama over 16 tokens with large random weights (peaked, context-dependent p) and a
    random drafter over 10 of them with large weights (q far from p)."""
    from modelkit import tiny_llama_config
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("small_vocab")
    config = tiny_llama_config(
        vocab_size=V, hidden_size=32, intermediate_size=64, head_dim=8, max_position_embeddings=64,
        tie_word_embeddings=False, pad_token_id=None,  # LlamaConfig's own pad (none)
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    target = load_target(out)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in target.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    torch.manual_seed(2)
    drafter = Eagle3Drafter(DrafterConfig.from_target_config(read_config(out), 10, AUX)).eval()
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() == 2 and p.dtype.is_floating_point:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return target, drafter


@torch.no_grad()
def exact_marginals(target, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """P(x_n+1) and P(x_n+2) of plain sampling, by enumerating every x_n, x_n+1."""

    def next_probs(prefixes: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, V]
        return torch.softmax(target(input_ids=prefixes).logits[:, -1].float() / temperature, -1)

    prompt = torch.tensor([PROMPT])
    p0 = next_probs(prompt)[0]  # [V]
    one = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)  # [V, T+1]
    p1 = next_probs(one)  # [V, V]: row x_n
    two = torch.cat([one.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], 1)  # [V*V, T+2]
    p2 = next_probs(two).view(V, V, V)  # [x_n, x_n+1, V]
    joint01 = p0[:, None] * p1  # [V, V]
    return joint01.sum(0), (joint01[..., None] * p2).sum((0, 1))


def sampled_marginals(target, drafter, n: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(2, V)
    accepted = 0
    for _ in range(n):
        out, stats = speculative_generate(target, drafter, PROMPT, 3, 2, set(), AUX, temperature, gen)
        counts[0, out[1]] += 1
        counts[1, out[2]] += 1
        accepted += sum(stats.accepted_per_pass)
    assert 0 < accepted < 2 * n  # drafts were both accepted and rejected
    return counts[0], counts[1]


def test_speculative_sampling_matches_target_marginals(small_vocab, monkeypatch):
    """Tokens 2 and 3 (both decided by the verify pass over k=2 sampled drafts) follow plain sampling.

    n=400 runs take ~10 s on one CPU thread; the bound is loose (eps 0.16), enough to reject a verifier
    that accepts every draft (0.2-0.4 off); the pure test above tells finer errors apart."""
    target, drafter = small_vocab
    temperature = 1.0
    want1, want2 = exact_marginals(target, temperature)
    n = 400
    eps = tv_bound(n, V)
    got1, got2 = sampled_marginals(target, drafter, n, temperature)
    assert tv(got1, want1) < eps and tv(got2, want2) < eps, (tv(got1, want1), tv(got2, want2), eps)
    monkeypatch.setattr(specdec, "rejection_verify", accept_always)
    bad1, bad2 = sampled_marginals(target, drafter, n, temperature)
    assert max(tv(bad1, want1), tv(bad2, want2)) > eps, (tv(bad1, want1), tv(bad2, want2))


def test_temperature_zero_stays_greedy(small_vocab):
    target, drafter = small_vocab
    want = specdec.plain_generate(target, PROMPT, 10, set())
    got, _ = speculative_generate(target, drafter, PROMPT, 10, 3, set(), AUX, 0.0)
    assert got == want
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, drafter, PROMPT, 10, 3, set(), AUX, -1.0)


def test_evaluate_specdec_at_temperature(tiny_model_dir):
    from eyas.evaluate.specdec import evaluate_specdec

    torch.manual_seed(0)
    drafter = Eagle3Drafter(DrafterConfig.from_target_config(read_config(tiny_model_dir), 4096, AUX)).eval()
    kwargs = dict(max_new_tokens=8, num_draft_tokens=3, eos_token_ids={2}, aux_layer_ids=AUX, temperature=0.8)
    report = evaluate_specdec(tiny_model_dir, drafter, [[1, 42, 977], [5, 6, 7]], **kwargs, seed=3)
    assert report["temperature"] == 0.8 and report["tau"] >= 1.0 and report["speedup"] > 0
    assert report["greedy_equal"]["checked"] is False and report["greedy_equal"]["mismatch_count"] is None
    again = evaluate_specdec(tiny_model_dir, drafter, [[1, 42, 977], [5, 6, 7]], **kwargs, seed=3)
    assert [r["accepted_per_pass"] for r in again["per_prompt"]] == [
        r["accepted_per_pass"] for r in report["per_prompt"]
    ]  # seeded: reproducible
