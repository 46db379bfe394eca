"""The specdec rule's entry: one prompt set, every drafter, in eyas's own speculative decoding loop (HF
target, batch 1) -> one JSON (format `SPECDEC_SET_FORMAT`) holding the set's meta, each drafter's report,
and the identity of the drafters and settings it used. One job per set: CPU decoding is memory-latency
bound, so two 1-thread processes decode more tokens/s together than one 2-thread process."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from eyas.config import EvaluateSettings
from eyas.core.acceptance import max_prompt_tokens
from eyas.core.atomic import atomic_file
from eyas.evaluate.drafters import load_drafters
from eyas.evaluate.sets import load_prompt_set
from eyas.evaluate.specdec import evaluate_specdec
from eyas.evaluate.summary import json_safe
from eyas.model.target import load_target, load_tokenizer, resolve_device

log = logging.getLogger("eyas.evaluate")

SPECDEC_SET_FORMAT = "eyas.specdec_set/1"
# fp32 everywhere: bf16 rounding differs between 1-token and k-token forwards, so greedy equality
# (the correctness check of speculative decoding) only holds in fp32 (measured on the H200).
DTYPE = torch.float32
UNTRAINED_SEED = 0
# The settings a per-set JSON must share with the merge (the rest of `settings` is device placement).
SPECDEC_SETTINGS = ("num_prompts", "max_new_tokens", "num_draft_tokens", "temperature", "seed")


def specdec_settings(settings: EvaluateSettings) -> dict:
    """The `SPECDEC_SETTINGS` of the `evaluate` section, as a per-set JSON records them: the HF loop
    decodes the first k of the sweep."""
    chosen = {key: getattr(settings, key) for key in SPECDEC_SETTINGS}
    return chosen | {"num_draft_tokens": settings.num_draft_tokens[0]}


def run_specdec_set(
    *,
    set_name: str,
    set_path: str,
    drafter_dir: str,
    set_format: str | None = None,
    model_dir: str,
    out_json: str,
    settings: EvaluateSettings,
    baselines: list[dict] | None = None,
    threads: int | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """Real speculative decoding of every drafter on one prompt set (plain greedy decoded once, shared
    by all drafters); writes `out_json` atomically and returns its dict."""
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(settings.device)
    chosen = specdec_settings(settings)
    drafters, _, identity = load_drafters(drafter_dir, model_dir, baselines, settings.untrained_control)
    config = drafters["trained"].config
    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    max_prompt = max_prompt_tokens(
        config.max_position_embeddings, chosen["max_new_tokens"], chosen["num_draft_tokens"]
    )
    prompt_set = load_prompt_set(set_name, set_path, tokenizer, chosen["num_prompts"], max_prompt, set_format)
    if not prompt_set.prompts:
        raise ValueError(f"{set_path}: no {set_name} prompt fits (max {max_prompt} tokens)")
    decode = dict(
        max_new_tokens=chosen["max_new_tokens"],
        num_draft_tokens=chosen["num_draft_tokens"],
        eos_token_ids={tokenizer.eos_token_id},
        aux_layer_ids=config.aux_layer_ids,
        device=device,
        dtype=DTYPE,
        temperature=chosen["temperature"],
        seed=chosen["seed"],
    )
    reports = {}
    greedy_cache: dict = {}  # the set's plain greedy outputs: decoded once, not once per drafter
    target = load_target(model_dir, dtype=DTYPE, device=device)  # loaded once, shared by the drafters
    for name, model in drafters.items():
        reports[name] = evaluate_specdec(
            model_dir, model, prompt_set.prompts, **decode, greedy_cache=greedy_cache, target=target
        )
        log.info(
            "%s / %s: tau %.3f, speedup %s", set_name, name, reports[name]["tau"], reports[name]["speedup"]
        )
    result = {
        "format": SPECDEC_SET_FORMAT,
        "set": set_name,
        "meta": prompt_set.meta(),
        "device": device,
        "dtype": str(DTYPE).removeprefix("torch."),
        "settings": chosen,
        "identity": identity,
        "reports": json_safe(reports),
    }
    with atomic_file(out_json) as fh:
        fh.write(json.dumps(result, indent=2, allow_nan=False) + "\n")
    return result


def read_specdec_set(path: str, set_name: str, settings: EvaluateSettings, identity: dict) -> dict:
    """A per-set JSON, refused (naming the file and the field) unless it was made for `set_name` with
    these drafters (`identity` of `load_drafters`) and these settings."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != SPECDEC_SET_FORMAT:
        raise ValueError(f"{path}: field 'format' is {data.get('format')!r}, expected {SPECDEC_SET_FORMAT!r}")
    if data.get("set") != set_name:
        raise ValueError(f"{path}: field 'set' is {data.get('set')!r}, expected {set_name!r}")
    return check_made_with(path, data, identity=identity, settings=specdec_settings(settings))


def check_made_with(path: str, data: dict, **sections: dict) -> dict:
    """`data` (a stage's JSON at `path`), refused naming the file and field unless each of its
    `sections` holds the wanted values (the drafters' identity, the settings it was made with)."""
    for section, want in sections.items():
        have = data.get(section) or {}
        for key, value in want.items():
            if have.get(key) != value:
                raise ValueError(
                    f"{path}: field '{section}.{key}' is {have.get(key)!r}, the current drafters and "
                    f"config give {value!r}: it was made with another drafter or settings; rerun its job"
                )
    return data
