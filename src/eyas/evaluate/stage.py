"""The evaluate stage: the trained drafter, an untrained baseline and any configured baseline drafters,
offline (simulated tau on the held-out stores) and in real speculative decoding on each prompt set."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from eyas.evaluate.offline import evaluate_offline
from eyas.evaluate.sets import load_prompt_set
from eyas.evaluate.specdec import evaluate_specdec
from eyas.evaluate.summary import write_summary
from eyas.model.drafter import Eagle3Drafter
from eyas.provenance import DRAFTER_PROVENANCE
from eyas.target import load_embed_and_head, load_tokenizer, resolve_device

log = logging.getLogger("eyas.evaluate")


def untrained_like(drafter: Eagle3Drafter, model_dir: str | os.PathLike, seed: int = 0) -> Eagle3Drafter:
    """A freshly initialised drafter with the same config, target embedding and draft vocab."""
    torch.manual_seed(seed)
    baseline = Eagle3Drafter(drafter.config)
    embed, _ = load_embed_and_head(model_dir)
    baseline.set_target_embedding(embed)
    baseline.set_vocab(drafter.d2t.clone(), drafter.t2d.clone())
    return baseline.eval()


def _load_baseline(name: str, path: str, expected: dict) -> Eagle3Drafter:
    """A configured drafter dir; it must come from the same target and tokenizer as the trained one."""
    meta = json.loads((Path(path) / "config.json").read_text())
    for key, want in expected.items():
        if meta.get(key) != want:
            raise ValueError(
                f"evaluate.baselines {name!r} ({path}/config.json): provenance field {key!r} is "
                f"{meta.get(key)!r}, the trained drafter's is {want!r}"
            )
    return Eagle3Drafter.from_pretrained(path).eval()


def run_evaluation(
    *,
    drafter_dir: str,
    set_paths: dict[str, str],
    token_shards: list[str],
    hidden_stores: list[str],
    model_dir: str,
    out_summary: str,
    out_plot: str,
    settings: dict,
    ttt_steps: int,
    baselines: list[dict] | None = None,
    threads: int | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """`set_paths` maps each evaluation set name (`eyas.evaluate.sets`) to its file; `baselines` are
    [{name, path}] drafter dirs evaluated beside the trained and untrained drafters."""
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(settings["device"])
    # fp32 everywhere: bf16 rounding differs between 1-token and k-token forwards, so greedy equality
    # (the correctness check of speculative decoding) only holds in fp32 (measured on the H200).
    dtype = torch.float32
    drafter = Eagle3Drafter.from_pretrained(drafter_dir).eval()
    drafter_meta = json.loads((Path(drafter_dir) / "config.json").read_text())
    expected = {field: drafter_meta[field] for field in DRAFTER_PROVENANCE}
    drafters = {"trained": drafter, "untrained": untrained_like(drafter, model_dir)}
    for item in baselines or []:
        drafters[item["name"]] = _load_baseline(item["name"], item["path"], expected)

    offline = {}
    for name, model in drafters.items():
        offline[name] = evaluate_offline(
            model, token_shards, hidden_stores, model_dir,
            ttt_steps=ttt_steps, expected_provenance=expected, device=device,
        )  # fmt: skip
        log.info("offline %s: simulated tau %.3f", name, offline[name]["simulated_tau"])

    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    max_prompt = (
        drafter.config.max_position_embeddings - settings["max_new_tokens"] - 2 * settings["num_draft_tokens"]
    )
    decode = dict(
        max_new_tokens=settings["max_new_tokens"],
        num_draft_tokens=settings["num_draft_tokens"],
        eos_token_ids={tokenizer.eos_token_id},
        aux_layer_ids=drafter.config.aux_layer_ids,
        device=device,
        dtype=dtype,
        temperature=settings.get("temperature", 0.0),
        seed=settings.get("seed", 0),
    )
    specdec, set_meta = {}, {}
    for set_name, path in set_paths.items():
        prompt_set = load_prompt_set(set_name, path, tokenizer, settings["num_prompts"], max_prompt)
        if not prompt_set.prompts:
            raise ValueError(f"{path}: no {set_name} prompt fits (max {max_prompt} tokens)")
        set_meta[set_name] = prompt_set.meta()
        specdec[set_name] = {}
        greedy_cache: dict = {}  # the set's plain greedy outputs: decoded once, not once per drafter
        for name, model in drafters.items():
            report = evaluate_specdec(
                model_dir, model, prompt_set.prompts, **decode, greedy_cache=greedy_cache
            )
            specdec[set_name][name] = report
            log.info("%s / %s: tau %.3f, speedup %s", set_name, name, report["tau"], report["speedup"])

    meta = {
        "drafter": drafter_dir,
        "model_dir": model_dir,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "temperature": decode["temperature"],
        "sets": set_meta,
        "baselines": {item["name"]: item["path"] for item in baselines or []},
        **{f"drafter_{k}": v for k, v in expected.items()},
    }
    return write_summary(out_summary, out_plot, offline=offline, specdec=specdec, meta=meta)
