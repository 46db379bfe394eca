"""The evaluate stage: the trained drafter and an untrained baseline, offline and in real decoding."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from eyas.data.tokenize import read_prepared, render_prompt
from eyas.evaluate.offline import evaluate_offline
from eyas.evaluate.specdec import evaluate_specdec
from eyas.evaluate.summary import write_summary
from eyas.model.drafter import Eagle3Drafter
from eyas.provenance import DRAFTER_PROVENANCE
from eyas.target import load_embed_and_head, load_tokenizer, resolve_device

log = logging.getLogger("eyas.evaluate")


def held_out_prompts(
    conversations: str | os.PathLike, tokenizer, limit: int, max_length: int
) -> list[list[int]]:
    """Prompt tokens (history up to the last assistant turn) of the first `limit` held-out dialogues."""
    prompts = []
    for record in read_prepared(conversations):
        ids = render_prompt(tokenizer, record["messages"], record["tools"])
        if len(ids) <= max_length:
            prompts.append(ids)
        if len(prompts) == limit:
            break
    return prompts


def untrained_like(drafter: Eagle3Drafter, model_dir: str | os.PathLike, seed: int = 0) -> Eagle3Drafter:
    """A freshly initialised drafter with the same config, target embedding and draft vocab."""
    torch.manual_seed(seed)
    baseline = Eagle3Drafter(drafter.config)
    embed, _ = load_embed_and_head(model_dir)
    baseline.set_target_embedding(embed)
    baseline.set_vocab(drafter.d2t.clone(), drafter.t2d.clone())
    return baseline.eval()


def run_evaluation(
    *,
    drafter_dir: str,
    conversations: str,
    token_shards: list[str],
    hidden_stores: list[str],
    model_dir: str,
    out_summary: str,
    out_plot: str,
    settings: dict,
    ttt_steps: int,
    threads: int | None = None,
    trust_remote_code: bool = False,
) -> dict:
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(settings["device"])
    # fp32 everywhere: bf16 rounding differs between 1-token and k-token forwards, so greedy equality
    # (the correctness check of speculative decoding) only holds in fp32 (measured on the H200).
    dtype = torch.float32
    drafter = Eagle3Drafter.from_pretrained(drafter_dir).eval()
    drafter_meta = json.loads((Path(drafter_dir) / "config.json").read_text())
    expected = {field: drafter_meta[field] for field in DRAFTER_PROVENANCE}
    baseline = untrained_like(drafter, model_dir)

    offline = evaluate_offline(
        drafter, token_shards, hidden_stores, model_dir,
        ttt_steps=ttt_steps, expected_provenance=expected, device=device,
    )  # fmt: skip
    log.info("offline: simulated tau %.3f, accuracy %s", offline["simulated_tau"], offline["accuracy"])

    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    max_prompt = (
        drafter.config.max_position_embeddings - settings["max_new_tokens"] - 2 * settings["num_draft_tokens"]
    )
    prompts = held_out_prompts(conversations, tokenizer, settings["num_prompts"], max_prompt)
    if not prompts:
        raise ValueError(f"{conversations}: no held-out prompt fits (max {max_prompt} tokens)")
    decode = dict(
        max_new_tokens=settings["max_new_tokens"],
        num_draft_tokens=settings["num_draft_tokens"],
        eos_token_ids={tokenizer.eos_token_id},
        aux_layer_ids=drafter.config.aux_layer_ids,
        device=device,
        dtype=dtype,
    )
    specdec = evaluate_specdec(model_dir, drafter, prompts, **decode)
    log.info("trained drafter: tau %.3f, speedup %s", specdec["tau"], specdec["speedup"])
    specdec_untrained = evaluate_specdec(model_dir, baseline, prompts, **decode)
    log.info("untrained drafter: tau %.3f", specdec_untrained["tau"])

    meta = {
        "drafter": drafter_dir,
        "model_dir": model_dir,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "prompts": len(prompts),
        "conversations": conversations,
        **{f"drafter_{k}": v for k, v in expected.items()},
    }
    return write_summary(
        out_summary,
        out_plot,
        offline=offline,
        specdec=specdec,
        specdec_untrained=specdec_untrained,
        meta=meta,
    )
