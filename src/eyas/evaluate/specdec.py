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

import inspect
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from eyas.core.acceptance import acceptance_by_position, ratio, tau
from eyas.evaluate.sampling import draft_distribution, pick, probs, rejection_verify
from eyas.model.capture import TapCapture
from eyas.model.drafter import DrafterCache
from eyas.model.target import load_target

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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


# --------------------------------------------------------------------------- target plumbing
def capture_taps(target: PreTrainedModel, layer_ids: list[int]) -> TapCapture:
    """Hooks on the target's tapped layers; `take_concat()` gives the last forward's [1, T, K*H]."""
    return TapCapture(target, layer_ids)


_CACHE_KWARG: dict[type, str] = {}


def _cache_kwarg(target: PreTrainedModel) -> str:
    # Recent transformers 5.x call it `cache` (deprecating `past_key_values`); earlier 5.x know the latter.
    kind = type(target)
    if kind not in _CACHE_KWARG:
        names = inspect.signature(target.forward).parameters
        _CACHE_KWARG[kind] = "cache" if "cache" in names else "past_key_values"
    return _CACHE_KWARG[kind]


def _new_target_cache(target: PreTrainedModel):
    from transformers import DynamicCache

    return DynamicCache(config=target.config)


def _crop_target_cache(cache, length: int) -> None:
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # a negative argument removes that many tokens in every transformers 5.x


def _target_forward(target: PreTrainedModel, cache, ids: list[int], last_only: bool = False) -> Tensor:
    """Run `ids` after the cached prefix; returns logits [T, V] (or [1, V] with last_only)."""
    device = next(target.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # [1, T]
    past = cache.get_seq_length()
    position_ids = torch.arange(past, past + len(ids), device=device)[None]  # [1, T]
    out = target(
        input_ids=input_ids,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1 if last_only else 0,
        **{_cache_kwarg(target): cache},
    )
    return out.logits[0]


def _check_lengths(
    target: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int, margin: int = 0
) -> None:
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: speculative decoding needs at least one prompt token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} is negative")
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and len(prompt_ids) + max_new_tokens + margin > limit:
        raise ValueError(
            f"prompt of {len(prompt_ids)} tokens + max_new_tokens={max_new_tokens} (+{margin} drafts) "
            f"exceeds the target's max_position_embeddings={limit}"
        )


# --------------------------------------------------------------------------- decoding
@torch.inference_mode()
def plain_generate(
    target: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_token_ids: set[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Plain decoding with a KV cache, one token per forward: greedy (the reference output) at
    temperature 0, else sampling from softmax(logits / temperature).

    Stops after `max_new_tokens` tokens or after the first eos token (which is kept).
    """
    _check_lengths(target, prompt_ids, max_new_tokens)
    out: list[int] = []
    if max_new_tokens == 0:
        return out
    cache = _new_target_cache(target)
    logits = _target_forward(target, cache, list(prompt_ids), last_only=True)  # [1, V]
    while True:
        token = pick(logits[-1], temperature, generator)
        out.append(token)
        if token in eos_token_ids or len(out) >= max_new_tokens:
            return out
        logits = _target_forward(target, cache, [token])


def _draft_chain(
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
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens={num_draft_tokens} must be >= 1")
    _check_lengths(target, prompt_ids, max_new_tokens, margin=num_draft_tokens)
    stats = SpecStats(num_draft_tokens=num_draft_tokens)
    start = time.perf_counter()
    out: list[int] = []
    if max_new_tokens == 0:
        return out, stats
    drafter_device = next(drafter.parameters()).device
    drafter_dtype = next(p for p in drafter.parameters() if p.is_floating_point()).dtype
    target_cache = _new_target_cache(target)
    drafter_cache = DrafterCache()
    sampler = None
    if temperature > 0:
        draft_target_ids = torch.arange(len(drafter.d2t), device=drafter_device) + drafter.d2t  # [D]
        vocab_size = target.config.vocab_size

        def sampler(logits):  # [D] -> (draft index [1], q [V])
            q = draft_distribution(logits, draft_target_ids, vocab_size, temperature)
            d_probs = q[draft_target_ids]  # [D]
            return torch.multinomial(d_probs, 1, generator=generator), q

    with capture_taps(target, aux_layer_ids) as taps:
        prompt = list(prompt_ids)
        logits = _target_forward(target, target_cache, prompt, last_only=True)  # [1, V]
        token = pick(logits[-1], temperature, generator)
        out.append(token)
        done = token in eos_token_ids or len(out) >= max_new_tokens
        # Pending drafter extend: target aux at indices lo .. lo+T-1 with the token after each.
        ext_aux = taps.take_concat()  # [1, n, K*H]
        ext_ids = prompt[1:] + [token]
        ext_lo = 0
        last = token  # s_m: committed, not yet in the target cache
        while not done:
            remaining = max_new_tokens - len(out)
            k = min(num_draft_tokens, remaining - 1)
            drafts: list[int] = []
            qs: list[Tensor] = []  # [V] per draft at temperature > 0
            if k > 0:
                drafter_cache.crop(ext_lo)  # drop chained drafts: keep only target-state entries
                hidden = drafter.combine_taps(ext_aux.to(drafter_device, drafter_dtype))  # [1, T, H]
                ids = torch.tensor([ext_ids], device=drafter_device)  # [1, T]
                pos = torch.arange(ext_lo, ext_lo + len(ext_ids), device=drafter_device)[None]  # [1, T]
                d_logits, d_hidden = drafter.forward_step(hidden, ids, pos, drafter_cache)
                drafts, qs = _draft_chain(
                    drafter,
                    d_logits[0, -1],
                    d_hidden[:, -1:],
                    ext_lo + len(ext_ids) - 1,
                    k,
                    drafter_cache,
                    sampler,
                )
                ext_lo += len(ext_ids)
            # else: the budget allows one token only, the pass's bonus; generation ends after it.
            committed = target_cache.get_seq_length()  # s_0 .. s_{m-1}
            v_logits = _target_forward(target, target_cache, [last, *drafts])  # [k + 1, V]
            v_aux = taps.take_concat()  # [1, k + 1, K*H]
            if temperature == 0:
                greedy = v_logits.argmax(-1).tolist()  # g_0 .. g_k
                a = accept_length(drafts, greedy[:-1])
                next_token = greedy[a]
            else:
                p = probs(v_logits, temperature)  # [k + 1, V]
                q = torch.stack(qs).to(p.device) if qs else p.new_zeros(0, p.shape[-1])  # [k, V]
                a, next_token = rejection_verify(drafts, q, p, generator)
            stats.verify_passes += 1
            stats.drafted_per_pass.append(len(drafts))
            stats.accepted_per_pass.append(a)
            new_tokens, done = clip_at_stop([*drafts[:a], next_token], remaining, eos_token_ids)
            out.extend(new_tokens)
            _crop_target_cache(target_cache, committed + 1 + a)  # s_m, d_1 .. d_a stay
            ext_aux, ext_ids, last = v_aux[:, : a + 1], new_tokens, new_tokens[-1]
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
    k = num_draft_tokens
    sampling = {"temperature": temperature, "generator": torch.Generator(device=device).manual_seed(seed)}

    def plain(prompt, n):
        if temperature == 0:  # the exact reference
            return plain_generate(target, prompt, n, eos_token_ids)
        return plain_generate(target, prompt, n, eos_token_ids, **sampling)

    if prompts:  # warm-up: first-call allocations and lazy init must not land in the timings
        warm = min(4, max_new_tokens)
        speculative_generate(target, drafter, prompts[0], warm, k, eos_token_ids, aux_layer_ids, **sampling)
        if check_equal:
            plain(prompts[0], warm)
    check_output = check_equal and temperature == 0
    per_prompt = []
    totals = {"spec_tokens": 0, "spec_seconds": 0.0, "greedy_tokens": 0, "greedy_seconds": 0.0}
    emitted, passes = 0, 0
    attempted, reached, accepted = [0] * k, [0] * k, [0] * k
    mismatches = []
    for index, prompt in enumerate(prompts):
        spec_out, stats = speculative_generate(
            target, drafter, prompt, max_new_tokens, k, eos_token_ids, aux_layer_ids, **sampling
        )
        row = {"prompt_tokens": len(prompt), **stats.to_dict()}
        totals["spec_tokens"] += stats.generated
        totals["spec_seconds"] += stats.wall_seconds
        emitted += max(stats.generated - 1, 0) if stats.verify_passes else 0
        passes += stats.verify_passes
        attempted = [x + y for x, y in zip(attempted, stats.position_attempted, strict=True)]
        reached = [x + y for x, y in zip(reached, stats.position_reached, strict=True)]
        accepted = [x + y for x, y in zip(accepted, stats.position_accepted, strict=True)]
        if check_equal:
            cached = greedy_cache.get(index) if greedy_cache is not None and temperature == 0 else None
            if cached is None:
                t0 = time.perf_counter()
                cached = plain(prompt, max_new_tokens), time.perf_counter() - t0
                if greedy_cache is not None and temperature == 0:
                    greedy_cache[index] = cached
            greedy_out, row["greedy_seconds"] = cached
            totals["greedy_tokens"] += len(greedy_out)
            totals["greedy_seconds"] += row["greedy_seconds"]
        if check_output:
            row["first_mismatch"] = first_mismatch(greedy_out, spec_out)
            row["equal"] = row["first_mismatch"] is None
            if not row["equal"]:
                mismatches.append({"prompt": index, "first_mismatch": row["first_mismatch"]})
        per_prompt.append(row)
    spec_tps = ratio(totals["spec_tokens"], totals["spec_seconds"])
    greedy_tps = ratio(totals["greedy_tokens"], totals["greedy_seconds"]) if check_equal else None
    return {
        "num_prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "num_draft_tokens": k,
        "aux_layer_ids": list(aux_layer_ids),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "temperature": temperature,
        "tau": tau(emitted, passes),
        "verify_passes": passes,
        "generated_tokens": totals["spec_tokens"],
        **acceptance_by_position(attempted, reached, accepted),
        "spec_tokens_per_s": spec_tps,
        "greedy_tokens_per_s": greedy_tps,  # plain decoding: sampling at temperature > 0
        "speedup": spec_tps / greedy_tps if spec_tps and greedy_tps else None,
        "greedy_equal": {
            "checked": check_output,
            "equal_prompts": sum(bool(r.get("equal")) for r in per_prompt) if check_output else None,
            "mismatch_count": len(mismatches) if check_output else None,
            "mismatches": mismatches,
        },
        "per_prompt": per_prompt,
    }
