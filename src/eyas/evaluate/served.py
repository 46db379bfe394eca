"""Served evaluation: the drafters measured where they are served, inside an SGLang engine (EAGLE-3).

One EAGLE-3 engine serves the target with chain drafting; every drafter (trained, untrained control,
baselines: SGLang export dirs) at every k of the sweep is selected in turn in the running engine
(`eyas.engine.sglang.DraftSwapEngine.select`: weights in place, the step count pinned); drafters of
another shape (a wider MLP, another draft vocabulary) get an engine of their own. A plain engine with
the same settings decodes the same prompts first: the greedy reference and the speed baseline.
Each (drafter, k, set) is decoded twice: one request at a time (batch size 1), and all prompts at
once with at most `concurrency` in flight.

Figures per request come from SGLang's `meta_info` (sglang 0.5.17 `managers/tokenizer_manager.py`):
`completion_tokens`, `spec_verify_ct` (verify passes), `spec_correct_drafts_histogram` (verify passes
by number of drafts accepted, 0..k). Two accept lengths are reported:
- `tau_sglang` = sum completion / sum verify: SGLang's `spec_accept_length`, what SpecForge's benchmark
  reports; it counts the token of the prefill;
- `tau` = sum (completion - 1) / sum verify: eyas's definition (`evaluate.specdec.SpecStats`), tokens
  per verify pass, so a pass accepting all k drafts counts k + 1.
Greedy equality with the plain engine is reported, not asserted: in bf16 a k+1-token verify pass and a
1-token decode round differently, and near ties flip. Each mismatch names its first position and the
plain engine's top-2 log-probability margin there (a flip at a small margin is rounding, not a bug).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time

from eyas.core.acceptance import (
    acceptance_by_position,
    counts_from_histograms,
    tau_from_completions,
    tau_sglang,
)
from eyas.core.atomic import atomic_file
from eyas.core.logs import Progress
from eyas.evaluate.summary import json_safe

log = logging.getLogger("eyas.evaluate.served")

SERVED_FORMAT = "eyas.served/1"
WARMUP_TOKENS = 8


# --------------------------------------------------------------------------- pure: one request's figures
def request_figures(output: dict, k: int | None) -> dict:
    """One engine output -> {output_ids, completion, verify, histogram}; `k` None for a plain engine."""
    meta = output.get("meta_info") or {}
    if "completion_tokens" not in meta:
        raise ValueError(f"SGLang output has no meta_info.completion_tokens (keys {sorted(meta)})")
    figures = {"output_ids": list(output["output_ids"]), "completion": int(meta["completion_tokens"])}
    if k is None:
        return figures
    verify = meta.get("spec_verify_ct")
    if verify is None:
        raise ValueError(
            "SGLang output has no meta_info.spec_verify_ct: the engine is not speculating "
            f"(keys {sorted(meta)})"
        )
    histogram = list(meta.get("spec_correct_drafts_histogram") or meta.get("spec_accept_histogram") or [])
    if histogram and (len(histogram) > k + 1 or sum(histogram) != verify):
        raise ValueError(f"spec histogram {histogram} does not fit k={k} and {verify} verify passes")
    return figures | {"verify": int(verify), "histogram": histogram}


def aggregate(requests: list[dict], k: int) -> dict:
    """Accept lengths (SGLang's and eyas's) and acceptance by position over a set's requests."""
    completion = sum(r["completion"] for r in requests)
    verify = sum(r["verify"] for r in requests)
    histograms = [r["histogram"] for r in requests if r["histogram"]]
    out = {
        "num_draft_tokens": k,
        "prompts": len(requests),
        "completion_tokens": completion,
        "verify_passes": verify,
        "tau_sglang": tau_sglang(completion, verify),
        "tau": tau_from_completions(completion, len(requests), verify),
        "per_prompt_tau": [tau_from_completions(r["completion"], 1, r["verify"]) for r in requests],
        "per_prompt_completion": [r["completion"] for r in requests],
        "per_prompt_verify": [r["verify"] for r in requests],
    }
    if len(histograms) == len(requests):
        out |= acceptance_by_position(*counts_from_histograms(histograms, k))
    return out


def tau_by_origin(report: dict, origins: list[str]) -> dict:
    """{origin: {prompts, tau}} of one (set, drafter, k) report whose prompts came from `origins` (one
    per prompt, e.g. the input file of each held-out prompt): tau pooled over each origin's prompts as
    `aggregate` pools the set's."""
    completions, verifies = report["per_prompt_completion"], report["per_prompt_verify"]
    if len(origins) != len(completions):
        raise ValueError(f"{len(origins)} prompt origins for {len(completions)} served prompts")
    out = {}
    for origin in sorted(set(origins)):
        picked = [i for i, o in enumerate(origins) if o == origin]
        completion = sum(completions[i] for i in picked)
        verify = sum(verifies[i] for i in picked)
        out[origin] = {"prompts": len(picked), "tau": tau_from_completions(completion, len(picked), verify)}
    return out


def _top2_margin(position_logprobs) -> float | None:
    """Log-probability of the top token minus the runner-up at one position (entries are
    (logprob, token_id, text) tuples or lists, best first)."""
    if not position_logprobs or len(position_logprobs) < 2:
        return None
    return float(position_logprobs[0][0]) - float(position_logprobs[1][0])


def compare_to_plain(spec: list[dict], plain: list[dict]) -> dict:
    """Greedy equality of each served output with the plain engine's: counts and, per mismatch, the
    first differing position, both tokens and the plain engine's top-2 margin there."""
    mismatches = []
    for index, (s, p) in enumerate(zip(spec, plain, strict=True)):
        a, b = s["output_ids"], p["output_ids"]
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        top = p.get("top_logprobs") or []
        mismatches.append(
            {
                "prompt": index,
                "position": first,
                "served_token": a[first] if first < len(a) else None,
                "plain_token": b[first] if first < len(b) else None,
                "plain_top2_margin": _top2_margin(top[first]) if first < len(top) else None,
            }
        )
    return {"prompts": len(spec), "equal": len(spec) - len(mismatches), "mismatches": mismatches}


# --------------------------------------------------------------------------- engine runs
def _sampling(max_new_tokens: int) -> dict:
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens}


def decode_set(
    engine,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    k: int | None,
    logprobs: bool,
    raw: list | None = None,
) -> dict:
    """Batch size 1 (one request at a time) and all prompts at once: outputs and tokens/s of each.
    `raw`, if given, receives the engine's batch-size-1 outputs as they came (test data)."""
    extra = {"return_logprob": True, "top_logprobs_num": 2} if logprobs else {}
    engine.generate(input_ids=prompts[0], sampling_params=_sampling(WARMUP_TOKENS))  # kernels, graphs
    single, start = [], time.perf_counter()
    progress = Progress(
        log, f"served {'plain' if k is None else f'k={k}'} at batch size 1", len(prompts), "prompts"
    )
    for prompt in prompts:
        output = engine.generate(input_ids=prompt, sampling_params=_sampling(max_new_tokens), **extra)
        if raw is not None:
            raw.append(output)
        figures = request_figures(output, k)
        if logprobs:
            figures["top_logprobs"] = output["meta_info"].get("output_top_logprobs")
        single.append(figures)
        progress.update(1)
    single_seconds = time.perf_counter() - start
    start = time.perf_counter()
    outputs = engine.generate(input_ids=prompts, sampling_params=_sampling(max_new_tokens))
    batched_seconds = time.perf_counter() - start
    batched = [request_figures(o, k) for o in outputs]
    log.info(
        "served %s: %d prompts at batch size 1 in %.1f s, all at once in %.1f s",
        "plain" if k is None else f"k={k}",
        len(prompts),
        single_seconds,
        batched_seconds,
    )
    return {
        "single": single,
        "batched": batched,
        "tokens_per_s_bs1": sum(r["completion"] for r in single) / single_seconds,
        "tokens_per_s_batched": sum(r["completion"] for r in batched) / batched_seconds,
    }


def _drafter_report(run: dict, plain: dict, k: int, max_new_tokens: int) -> dict:
    report = aggregate(run["single"], k)
    batched = aggregate(run["batched"], k)
    return report | {
        "max_new_tokens": max_new_tokens,
        "plain_tokens_per_s_bs1": plain["tokens_per_s_bs1"],
        "tau_batched": batched["tau"],
        "tokens_per_s_bs1": run["tokens_per_s_bs1"],
        "tokens_per_s_batched": run["tokens_per_s_batched"],
        "speedup_bs1": run["tokens_per_s_bs1"] / plain["tokens_per_s_bs1"],
        "speedup_batched": run["tokens_per_s_batched"] / plain["tokens_per_s_batched"],
        "greedy_equal": compare_to_plain(run["single"], plain["single"]),
        "greedy_equal_batched": compare_to_plain(run["batched"], plain["batched"]),
    }


def serve_drafters(
    *,
    prompt_sets: dict[str, list[list[int]]],
    drafter_exports: dict[str, str],
    base_args: dict,
    ks: list[int],
    max_new_tokens: int,
    concurrency: int,
    record: dict | None = None,
    stage: str = "served evaluation",
) -> dict:
    """The served figures: {plain: {set: speeds}, sets: {set: {drafter: {k: report}}}, swap_check:
    [one per EAGLE-3 engine], timings}. Drafters that one engine can swap between
    (`eyas.engine.sglang_draft_swap.swap_groups`: same tensor shapes and layer settings) share one
    engine; a drafter of another shape (e.g. a wider MLP) gets an engine of its own.
    `record`, if given, receives the raw outputs of the first set: {"plain": [...], "spec": {k: [...]}}
    (the first drafter's at each k). An engine that dies raises `eyas.engine.sglang.EngineDied` naming
    `stage`; both engines are shut down and the temporary dirs removed before it propagates."""
    from eyas.engine.sglang import start_engine
    from eyas.engine.sglang_args import plain_engine_args
    from eyas.engine.sglang_draft_swap import swap_groups

    timings = {}
    start = time.perf_counter()
    plain_args = plain_engine_args(base_args, concurrency)
    engine = start_engine(plain_args, speculative=False, stage=f"{stage} (plain reference engine)")
    timings["plain_start_seconds"] = time.perf_counter() - start
    try:
        decode = dict(max_new_tokens=max_new_tokens, k=None, logprobs=True)
        plain = {}
        for n, (name, prompts) in enumerate(prompt_sets.items()):
            raw = record.setdefault("plain", []) if record is not None and n == 0 else None
            plain[name] = decode_set(engine, prompts, **decode, raw=raw)
    finally:
        engine.shutdown()
    sets: dict = {name: {d: {} for d in drafter_exports} for name in prompt_sets}
    timings["spec_start_seconds"], swap_checks = [], []
    for index, names in enumerate(swap_groups(drafter_exports)):
        group = {name: drafter_exports[name] for name in names}
        check, seconds = _serve_group(
            group, prompt_sets, plain, sets, base_args=base_args, ks=ks, max_new_tokens=max_new_tokens,
            concurrency=concurrency, record=record if index == 0 else None, stage=stage,
        )  # fmt: skip
        timings["spec_start_seconds"].append(seconds)
        swap_checks.append(check)
    plain_speeds = {
        name: {key: run[key] for key in ("tokens_per_s_bs1", "tokens_per_s_batched")}
        for name, run in plain.items()
    }
    return {"plain": plain_speeds, "sets": sets, "swap_check": swap_checks, "timings": timings}


def _serve_group(
    exports: dict[str, str], prompt_sets: dict, plain: dict, sets: dict, *, base_args: dict, ks: list[int],
    max_new_tokens: int, concurrency: int, record: dict | None, stage: str,
) -> tuple[dict, float]:  # fmt: skip
    """Every drafter of `exports` at every k in one EAGLE-3 engine, its reports into `sets`;
    (the swap-back check, the engine's start seconds)."""
    from eyas.engine.sglang import start_engine
    from eyas.engine.sglang_args import spec_engine_args

    names = list(exports)
    with tempfile.TemporaryDirectory(prefix="eyas-served-engine-") as workdir:
        start = time.perf_counter()
        args = spec_engine_args(base_args, exports[names[0]], ks, concurrency, workdir)
        engine = start_engine(args, speculative=True, stage=f"{stage} (EAGLE-3 engine of {names[0]})")
        start_seconds = time.perf_counter() - start
        try:
            order = sorted(ks, reverse=True)  # the engine starts at the longest chain
            for i, drafter in enumerate(names):
                for j, k in enumerate(order):
                    if i or j:  # the engine started with the first drafter at the longest k
                        engine.select(exports[drafter], k)
                    for n, (set_name, prompts) in enumerate(prompt_sets.items()):
                        keep = record is not None and n == 0 and i == 0
                        raw = record.setdefault("spec", {}).setdefault(str(k), []) if keep else None
                        run = decode_set(
                            engine, prompts, max_new_tokens=max_new_tokens, k=k, logprobs=False, raw=raw
                        )
                        report = _drafter_report(run, plain[set_name], k, max_new_tokens)
                        sets[set_name][drafter][str(k)] = report
                        log.info("served %s / %s / k=%d: tau %s", set_name, drafter, k, report["tau"])
            check = _swap_back_check(engine, names[0], exports, prompt_sets, sets, order[0], max_new_tokens)
        finally:
            engine.shutdown()
    return check, start_seconds


def _swap_back_check(
    engine, first: str, exports: dict, prompt_sets: dict, sets: dict, k: int, max_new_tokens: int
):
    """Serve the first drafter at the first k again after every other drafter and k: its verify passes
    and tau must be those it gave as the engine started with it (a swap that left a stale tensor, or a
    runtime state of another k, would show here)."""
    engine.select(exports[first], k)
    set_name, prompts = next(iter(prompt_sets.items()))
    again = decode_set(engine, prompts, max_new_tokens=max_new_tokens, k=k, logprobs=False)
    before = sets[set_name][first][str(k)]
    after = aggregate(again["single"], k)
    return {
        "set": set_name,
        "drafter": first,
        "k": k,
        "tau_at_start": before["tau"],
        "tau_after_swaps": after["tau"],
        "verify_passes_at_start": before["verify_passes"],
        "verify_passes_after_swaps": after["verify_passes"],
    }


def specdec_view(report: dict) -> dict:
    """A served report in the fields of `evaluate_specdec`'s (summary.SPECDEC_FIELDS), at batch size 1,
    so the summary's table and plots read served figures where the HF loop did not run."""
    equal = report["greedy_equal"]
    return {
        "tau": report["tau"],
        "temperature": 0.0,
        "speedup": report["speedup_bs1"],
        "spec_tokens_per_s": report["tokens_per_s_bs1"],
        "greedy_tokens_per_s": report["plain_tokens_per_s_bs1"],
        "acceptance_by_position": report.get("acceptance_by_position"),
        "conditional_acceptance_by_position": report.get("conditional_acceptance_by_position"),
        "position_attempted": report.get("position_attempted"),
        "position_accepted": report.get("position_accepted"),
        "greedy_equal": {
            "checked": True,
            "mismatch_count": len(equal["mismatches"]),
            "mismatches": equal["mismatches"],
        },
        "num_prompts": report["prompts"],
        "max_new_tokens": report["max_new_tokens"],
        "num_draft_tokens": report["num_draft_tokens"],
        "verify_passes": report["verify_passes"],
        "generated_tokens": report["completion_tokens"],
    }


def write_served(out_json: str | os.PathLike, result: dict) -> None:
    with atomic_file(out_json) as fh:
        fh.write(json.dumps(json_safe(result), indent=2, allow_nan=False) + "\n")
