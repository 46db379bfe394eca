"""Real speculative decoding at batch size 1: an HF target verifies chains drafted by an EAGLE-3 drafter.

One round, with committed tokens s_0 .. s_m where the target's KV cache holds s_0 .. s_{m-1} and the
drafter's cache holds indices 0 .. m-1, each pairing the target's aux taps at t with token t+1:

1. draft: the drafter's output at index m-1 gives d_1; k-1 chained steps feed back its own hidden_out,
   the previous draft's id and position +1 (docs/design.md alignment, SGLang chain drafting);
2. verify: one target forward over [s_m, d_1 .. d_k] yields greedy tokens g_0 .. g_k; accept the longest
   prefix d_1 .. d_a with d_i == g_{i-1}, plus the bonus g_a (at temperature > 0: drafts sampled from
   the drafter, accepted by rejection sampling, `eyas.evaluate.sampling`; g_a is then its next token);
3. roll back: crop the target cache to s_0 .. s_m, d_1 .. d_a; crop the drafter cache to its
   target-state entries (its chained drafts are dropped) and extend it with the target aux of
   s_m, d_1 .. d_a paired with the next tokens d_1 .. d_a, g_a (SGLang's draft-extend). That extend's
   last output is the next round's d_1.

The prompt's prefill is round zero: the target prefill gives x_n, the drafter prefill over indices
0 .. n-1 (aux of x_t with id x_{t+1}) gives d_1. Greedy verification makes the output identical to
plain greedy decoding whatever the drafter proposes; `evaluate_specdec` checks exactly that.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from eyas.core.acceptance import acceptance_by_position, ratio, tau
from eyas.evaluate.chain_draft import ChainDrafter, draft_sampler
from eyas.evaluate.sampling import pick, probs, rejection_verify
from eyas.evaluate.target_decode import (
    capture_taps,
    check_lengths,
    crop_target_cache,
    new_target_cache,
    plain_generate,
    target_forward,
)
from eyas.model.target import load_target

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from eyas.model.capture import TapCapture
    from eyas.model.drafter import Eagle3Drafter


# --------------------------------------------------------------------------- pure helpers
def accept_length(drafts: list[int], target_greedy: list[int]) -> int:
    """Length of the longest prefix of `drafts` equal to the target's greedy tokens at those positions."""
    a = 0
    while a < len(drafts) and a < len(target_greedy) and drafts[a] == target_greedy[a]:
        a += 1
    return a


def clip_at_stop(tokens: list[int], remaining: int, eos_token_ids: set[int]) -> tuple[list[int], bool]:
    """Keep at most `remaining` tokens and stop after the first eos (kept, like HF generate).

    Returns (kept tokens, whether generation is finished).
    """
    kept: list[int] = []
    for token in tokens[:remaining]:
        kept.append(token)
        if token in eos_token_ids:
            return kept, True
    return kept, len(kept) >= remaining


@dataclass
class SpecStats:
    """What one speculative generation did.

    tau = tokens emitted by verify passes / verify passes. Both the target prefill and its token x_n
    are EXCLUDED: a pass that accepts every one of k drafts emits k + 1 tokens, so tau == k + 1 exactly
    (up to the last pass, which eos or max_new_tokens may cut short). tau is None without a verify pass.
    """

    num_draft_tokens: int
    generated: int = 0  # all new tokens, x_n of the prefill included
    verify_passes: int = 0  # target forwards over [s_m, d_1 .. d_k]; the prefill is not one
    drafted_per_pass: list[int] = field(default_factory=list)  # k, or fewer when the budget ends
    accepted_per_pass: list[int] = field(default_factory=list)  # drafts equal to the target's greedy
    wall_seconds: float = 0.0

    @property
    def tau(self) -> float | None:
        return tau(self.generated - 1, self.verify_passes)

    @property
    def position_attempted(self) -> list[int]:
        """[k]: passes in which draft position i (0-based) was proposed."""
        return [sum(d > i for d in self.drafted_per_pass) for i in range(self.num_draft_tokens)]

    @property
    def position_reached(self) -> list[int]:
        """[k]: passes in which position i was proposed and drafts 0 .. i-1 were all accepted."""
        pairs = list(zip(self.drafted_per_pass, self.accepted_per_pass, strict=True))
        return [sum(d > i and a >= i for d, a in pairs) for i in range(self.num_draft_tokens)]

    @property
    def position_accepted(self) -> list[int]:
        """[k]: passes in which drafts 0 .. i were all accepted."""
        return [sum(a > i for a in self.accepted_per_pass) for i in range(self.num_draft_tokens)]

    def to_dict(self) -> dict:
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "generated": self.generated,
            "verify_passes": self.verify_passes,
            "tau": self.tau,
            "drafted_per_pass": list(self.drafted_per_pass),
            "accepted_per_pass": list(self.accepted_per_pass),
            "position_attempted": self.position_attempted,
            "position_reached": self.position_reached,
            "position_accepted": self.position_accepted,
            "wall_seconds": self.wall_seconds,
        }


# --------------------------------------------------------------------------- decoding
def _check_spec_args(
    target: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    num_draft_tokens: int,
    temperature: float,
) -> None:
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens={num_draft_tokens} must be >= 1")
    check_lengths(target, prompt_ids, max_new_tokens, margin=num_draft_tokens)


def _verify(
    target: PreTrainedModel,
    cache,
    taps: TapCapture,
    last: int,
    drafts: list[int],
    qs: list[Tensor],
    sampling: dict,
) -> tuple[int, int, Tensor]:
    """One target forward over [s_m, d_1 .. d_k]; crops the cache back to s_0 .. s_m, d_1 .. d_a.

    Returns (a accepted drafts, the next token: g_a, or the rejection sample's, the aux [1, a + 1, K*H]
    of s_m, d_1 .. d_a)."""
    committed = cache.get_seq_length()  # s_0 .. s_{m-1}
    v_logits = target_forward(target, cache, [last, *drafts])  # [k + 1, V]
    v_aux = taps.take_concat()  # [1, k + 1, K*H]
    if sampling["temperature"] == 0:
        greedy = v_logits.argmax(-1).tolist()  # g_0 .. g_k
        a = accept_length(drafts, greedy[:-1])
        next_token = greedy[a]
    else:
        p = probs(v_logits, sampling["temperature"])  # [k + 1, V]
        q = torch.stack(qs).to(p.device) if qs else p.new_zeros(0, p.shape[-1])  # [k, V]
        a, next_token = rejection_verify(drafts, q, p, sampling["generator"])
    crop_target_cache(cache, committed + 1 + a)  # s_m, d_1 .. d_a stay
    return a, next_token, v_aux[:, : a + 1]


@torch.inference_mode()
def speculative_generate(
    target: PreTrainedModel,
    drafter: Eagle3Drafter,
    prompt_ids: list[int],
    max_new_tokens: int,
    num_draft_tokens: int,
    eos_token_ids: set[int],
    aux_layer_ids: list[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], SpecStats]:
    """Speculative decoding (chain of `num_draft_tokens` drafts per verify pass).

    At temperature 0 verification is greedy and the output equals `plain_generate`'s token for token
    (up to floating-point differences between the target's one-token and multi-token forwards). At
    temperature > 0 drafts are sampled from the drafter and verified by rejection sampling
    (`eyas.evaluate.sampling`): each token is distributed as plain sampling from the target, drawing
    from `generator`. Near the token budget fewer drafts are proposed (at most
    max_new_tokens - generated - 1), so no draft is attempted that could never be emitted.
    See `SpecStats` for how tau counts passes.
    """
    _check_spec_args(target, prompt_ids, max_new_tokens, num_draft_tokens, temperature)
    stats = SpecStats(num_draft_tokens=num_draft_tokens)
    start = time.perf_counter()
    out: list[int] = []
    if max_new_tokens == 0:
        return out, stats
    sampling = {"temperature": temperature, "generator": generator}
    sampler = draft_sampler(drafter, target.config.vocab_size, temperature, generator)
    target_cache = new_target_cache(target)
    with capture_taps(target, aux_layer_ids) as taps:
        prompt = list(prompt_ids)
        logits = target_forward(target, target_cache, prompt, last_only=True)  # [1, V]
        last = pick(logits[-1], temperature, generator)  # s_m: committed, not yet in the target cache
        out.append(last)
        done = last in eos_token_ids or len(out) >= max_new_tokens
        # round zero's extend: the prompt's aux [1, n, K*H], each with the token after it
        drafting = ChainDrafter(drafter, taps.take_concat(), prompt[1:] + [last], sampler)
        while not done:
            remaining = max_new_tokens - len(out)
            k = min(num_draft_tokens, remaining - 1)
            # k == 0: the budget allows one token only, the pass's bonus; generation ends after it.
            drafts, qs = drafting.draft(k) if k > 0 else ([], [])  # qs: [V] per draft at temperature > 0
            a, next_token, kept_aux = _verify(target, target_cache, taps, last, drafts, qs, sampling)
            stats.verify_passes += 1
            stats.drafted_per_pass.append(len(drafts))
            stats.accepted_per_pass.append(a)
            new_tokens, done = clip_at_stop([*drafts[:a], next_token], remaining, eos_token_ids)
            out.extend(new_tokens)
            drafting.extend_next(kept_aux, new_tokens)
            last = new_tokens[-1]
    stats.generated = len(out)
    stats.wall_seconds = time.perf_counter() - start
    return out, stats


# --------------------------------------------------------------------------- evaluation
def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class _Decoders:
    """Both sides of one evaluation, sharing its settings and one generator (`sampling`)."""

    target: PreTrainedModel
    drafter: Eagle3Drafter
    num_draft_tokens: int
    eos_token_ids: set[int]
    aux_layer_ids: list[int]
    sampling: dict  # temperature, generator

    def spec(self, prompt: list[int], n: int) -> tuple[list[int], SpecStats]:
        k, eos, aux = self.num_draft_tokens, self.eos_token_ids, self.aux_layer_ids
        return speculative_generate(self.target, self.drafter, prompt, n, k, eos, aux, **self.sampling)

    def plain(self, prompt: list[int], n: int) -> list[int]:
        if self.sampling["temperature"] == 0:  # the exact reference
            return plain_generate(self.target, prompt, n, self.eos_token_ids)
        return plain_generate(self.target, prompt, n, self.eos_token_ids, **self.sampling)

    def plain_timed(
        self, index: int, prompt: list[int], n: int, greedy_cache: dict | None
    ) -> tuple[list[int], float]:
        """(plain output, seconds); at temperature 0 from `greedy_cache` if it holds prompt `index`."""
        cache = greedy_cache if self.sampling["temperature"] == 0 else None
        cached = cache.get(index) if cache is not None else None
        if cached is None:
            t0 = time.perf_counter()
            cached = self.plain(prompt, n), time.perf_counter() - t0
            if cache is not None:
                cache[index] = cached
        return cached


class _Totals:
    """Sums over prompts: tokens and seconds of both sides, verify-emitted tokens and verify passes
    (tau, see `SpecStats`), and per draft position the passes that attempted, reached, accepted it."""

    def __init__(self, k: int) -> None:
        self.spec_tokens, self.spec_seconds, self.greedy_tokens, self.greedy_seconds = 0, 0.0, 0, 0.0
        self.emitted, self.passes = 0, 0
        self.attempted, self.reached, self.accepted = [0] * k, [0] * k, [0] * k

    def add_spec(self, stats: SpecStats) -> None:
        self.spec_tokens += stats.generated
        self.spec_seconds += stats.wall_seconds
        self.emitted += max(stats.generated - 1, 0) if stats.verify_passes else 0
        self.passes += stats.verify_passes
        self.attempted = [x + y for x, y in zip(self.attempted, stats.position_attempted, strict=True)]
        self.reached = [x + y for x, y in zip(self.reached, stats.position_reached, strict=True)]
        self.accepted = [x + y for x, y in zip(self.accepted, stats.position_accepted, strict=True)]

    def add_plain(self, tokens: int, seconds: float) -> None:
        self.greedy_tokens += tokens
        self.greedy_seconds += seconds


def _prompt_row(
    decoders: _Decoders,
    totals: _Totals,
    index: int,
    prompt: list[int],
    max_new_tokens: int,
    check_equal: bool,
    greedy_cache: dict | None,
) -> dict:
    """One prompt's report row: its speculative stats, plain seconds and (greedy) equality; adds to
    `totals`."""
    spec_out, stats = decoders.spec(prompt, max_new_tokens)
    row = {"prompt_tokens": len(prompt), **stats.to_dict()}
    totals.add_spec(stats)
    if check_equal:
        greedy_out, row["greedy_seconds"] = decoders.plain_timed(index, prompt, max_new_tokens, greedy_cache)
        totals.add_plain(len(greedy_out), row["greedy_seconds"])
        if decoders.sampling["temperature"] == 0:
            row["first_mismatch"] = first_mismatch(greedy_out, spec_out)
            row["equal"] = row["first_mismatch"] is None
    return row


def _aggregate(totals: _Totals, per_prompt: list[dict], check_equal: bool, check_output: bool) -> dict:
    """The report's figures over all prompts, between its settings and `per_prompt`."""
    mismatches = [
        {"prompt": index, "first_mismatch": row["first_mismatch"]}
        for index, row in enumerate(per_prompt)
        if check_output and not row["equal"]
    ]
    spec_tps = ratio(totals.spec_tokens, totals.spec_seconds)
    greedy_tps = ratio(totals.greedy_tokens, totals.greedy_seconds) if check_equal else None
    return {
        "tau": tau(totals.emitted, totals.passes),
        "verify_passes": totals.passes,
        "generated_tokens": totals.spec_tokens,
        **acceptance_by_position(totals.attempted, totals.reached, totals.accepted),
        "spec_tokens_per_s": spec_tps,
        "greedy_tokens_per_s": greedy_tps,  # plain decoding: sampling at temperature > 0
        "speedup": spec_tps / greedy_tps if spec_tps and greedy_tps else None,
        "greedy_equal": {
            "checked": check_output,
            "equal_prompts": sum(bool(r.get("equal")) for r in per_prompt) if check_output else None,
            "mismatch_count": len(mismatches) if check_output else None,
            "mismatches": mismatches,
        },
    }


def evaluate_specdec(
    model_dir: str | os.PathLike,
    drafter: Eagle3Drafter,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    num_draft_tokens: int,
    eos_token_ids: set[int],
    aux_layer_ids: list[int],
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    check_equal: bool = True,
    temperature: float = 0.0,
    seed: int = 0,
    greedy_cache: dict | None = None,
    target: PreTrainedModel | None = None,
) -> dict:
    """Speculative vs plain decoding over `prompts`: tau, acceptance by draft position, speed.

    The drafter is moved to `device`/`dtype` in place. With `check_equal`, each prompt is also decoded
    plainly (timed) and the speedup is the ratio of tokens/s; at temperature 0 the two outputs must be
    equal token for token: mismatches are counted and located, never hidden. At temperature > 0 both
    sides sample (one generator seeded with `seed`), so outputs differ and equality is not checked.
    Without `check_equal` only the speculative side runs (no equality, no speedup).
    Aggregate tau = sum of verify-emitted tokens / sum of verify passes (see `SpecStats`).
    greedy_cache: {prompt index: (plain greedy output, seconds)} shared by calls on the same prompts,
    target and settings (e.g. one per prompt set): at temperature 0 the plain side of each prompt is
    decoded and timed once and reused by every drafter, since it does not depend on the drafter.
    target: the target already loaded from `model_dir` on `device` in `dtype` (`load_target`), so a
    set's drafters share one copy; loaded here when None.
    """
    if target is None:
        target = load_target(model_dir, dtype=dtype, device=device)
    drafter = drafter.to(device=device, dtype=dtype).eval()
    sampling = {"temperature": temperature, "generator": torch.Generator(device=device).manual_seed(seed)}
    decoders = _Decoders(target, drafter, num_draft_tokens, eos_token_ids, aux_layer_ids, sampling)
    if prompts:  # warm-up: first-call allocations and lazy init must not land in the timings
        warm = min(4, max_new_tokens)
        decoders.spec(prompts[0], warm)
        if check_equal:
            decoders.plain(prompts[0], warm)
    totals = _Totals(num_draft_tokens)
    per_prompt = [
        _prompt_row(decoders, totals, index, prompt, max_new_tokens, check_equal, greedy_cache)
        for index, prompt in enumerate(prompts)
    ]
    return {
        "num_prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "num_draft_tokens": num_draft_tokens,
        "aux_layer_ids": list(aux_layer_ids),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "temperature": temperature,
        **_aggregate(totals, per_prompt, check_equal, check_output=check_equal and temperature == 0),
        "per_prompt": per_prompt,
    }
