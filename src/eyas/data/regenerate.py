"""Regenerate assistant responses with the target itself (optional stage between prepare and tokenize).

A drafter learns to predict the target; training on the target's own responses instead of the
dataset's removes the mismatch between what the data says and what the target would say (the
EAGLE/SpecForge "regenerate" recipe). For each conversation, the LAST assistant turn is replaced by
the target's continuation of the history before it (chat template with the generation prompt); the
earlier turns stay as they were, so multi-turn tool-use dialogues keep their structure.

Generation is batched: prompts sorted by length, left-padded, `generate` with a KV cache. Every
conversation is written back; those not regenerated keep their response and are counted by reason:
read == regenerated + empty (the target produced nothing) + too_long (prompt over the limit) +
no_assistant (tokenize rejects these). A response cut at max_new_tokens is kept as cut.
"""

from __future__ import annotations

import json
import logging
import os

import torch

from eyas.atomic import atomic_file
from eyas.data.tokenize import SampleRejected, read_prepared, render_prompt

log = logging.getLogger("eyas.regenerate")


def _batches(order: list[int], batch_size: int) -> list[list[int]]:
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@torch.inference_mode()
def generate_batch(model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int, temperature: float):
    """Continuations (token lists, through the first eos exclusive) of left-padded `prompts`."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # [B, T] left-padded
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, T]
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        top_k=None,
        top_p=None,
        **sampling,
    )  # [B, T + N]
    results = []
    for row in out[:, width:].tolist():
        cut = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
        results.append(row[:cut])
    return results


def regenerate_split(
    conversations: str | os.PathLike,
    out_path: str | os.PathLike,
    model,
    tokenizer,
    *,
    max_new_tokens: int,
    batch_size: int,
    max_prompt_length: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> dict:
    """Write `conversations` with each last assistant turn regenerated to `out_path`; returns stats."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size={batch_size} and max_new_tokens={max_new_tokens} must be >= 1")
    torch.manual_seed(seed)
    records = list(read_prepared(conversations))
    prompts: dict[int, list[int]] = {}
    stats = {"read": len(records), "regenerated": 0, "empty": 0, "too_long": 0, "no_assistant": 0}
    for index, record in enumerate(records):
        record["regenerated"] = False
        try:
            ids = render_prompt(tokenizer, record["messages"], record["tools"])
        except SampleRejected:
            stats["no_assistant"] += 1  # tokenize rejects it with its reason; nothing to regenerate
            continue
        if len(ids) <= max_prompt_length:
            prompts[index] = ids
        else:
            stats["too_long"] += 1
    order = sorted(prompts, key=lambda i: len(prompts[i]))
    new_tokens = 0
    for batch in _batches(order, batch_size):
        outputs = generate_batch(
            model,
            tokenizer,
            [prompts[i] for i in batch],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
        for index, tokens in zip(batch, outputs, strict=True):
            text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
            record = records[index]
            if not text:
                stats["empty"] += 1
                continue
            messages = record["messages"]
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            record["messages"] = [
                *messages[:last],
                {"role": "assistant", "content": text},
                *messages[last + 1 :],
            ]
            record["regenerated"] = True
            stats["regenerated"] += 1
            new_tokens += len(tokens)
        log.info("regenerated %d / %d", stats["regenerated"] + stats["empty"], len(order))
    stats["new_tokens"] = new_tokens
    with atomic_file(out_path) as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return stats
