"""Draft vocab: the D target tokens the drafter can propose, from loss-masked token frequencies.

`d2t[i] = target_id_i - i` (int64) for the ascending target ids of the draft vocab, `t2d` is a bool
mask over the target vocab (the layout SGLang's EAGLE-3 drafter loads: `hot_token_id = arange(D) + d2t`,
https://github.com/sgl-project/sglang).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save

from eyas.core.atomic import atomic_path
from eyas.store import read_token_shard

VOCAB_FORMAT = "eyas.draft_vocab/1"


def count_tokens(token_shards: list[str], vocab_size: int) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(masked counts [V], unmasked counts [V], tokenizer_hash) over all shards.

    Raises naming the shard when ids fall outside the vocab or shards disagree on the tokenizer.
    """
    masked = np.zeros(vocab_size, dtype=np.int64)
    unmasked = np.zeros(vocab_size, dtype=np.int64)
    tok_hash: str | None = None
    for path in token_shards:
        shard = read_token_shard(path)
        ids = shard.input_ids.astype(np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(
                f"{path}: input_ids hold ids in [{ids.min()}, {ids.max()}], outside vocab {vocab_size}"
            )
        shard_hash = shard.attrs.get("tokenizer_hash")
        if tok_hash is not None and shard_hash != tok_hash:
            raise ValueError(
                f"{path}: field 'tokenizer_hash' is {shard_hash!r}, other shards have {tok_hash!r}"
            )
        tok_hash = shard_hash
        is_masked = shard.loss_mask.astype(bool)
        masked += np.bincount(ids[is_masked], minlength=vocab_size)
        unmasked += np.bincount(ids[~is_masked], minlength=vocab_size)
    return masked, unmasked, tok_hash


def select_draft_ids(
    masked: np.ndarray, unmasked: np.ndarray, draft_vocab_size: int
) -> tuple[np.ndarray, dict]:
    """Ascending target ids of the draft vocab and how they were chosen.

    Order of preference: masked frequency (desc), then, if fewer than D distinct masked tokens exist,
    unmasked frequency (desc), then the lowest remaining ids. Ties go to the smaller id throughout.
    """
    vocab_size = len(masked)
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} not in [1, vocab_size={vocab_size}]")
    ids = np.arange(vocab_size)
    # lexsort sorts by the last key first: masked desc, then unmasked desc, then id asc.
    order = np.lexsort((ids, -unmasked, -masked))
    chosen = np.sort(order[:draft_vocab_size])
    distinct = int((masked > 0).sum())
    from_unmasked = int(((masked[chosen] == 0) & (unmasked[chosen] > 0)).sum())
    stats = {
        "masked_tokens": int(masked.sum()),
        "distinct": distinct,
        "coverage": float(masked[chosen].sum() / max(1, masked.sum())),
        "filled_from_unmasked": from_unmasked,
        "filled_lowest_ids": int(((masked[chosen] == 0) & (unmasked[chosen] == 0)).sum()),
    }
    return chosen, stats


def ids_to_mapping(target_ids: np.ndarray, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending target ids [D] -> (d2t [D] int64, t2d [V] bool)."""
    target = torch.as_tensor(target_ids, dtype=torch.int64)
    d2t = target - torch.arange(len(target), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target] = True
    return d2t, t2d


def build_draft_vocab(
    token_shards: list[str], vocab_size: int, draft_vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(d2t [D] int64, t2d [V] bool, stats) from the loss-masked tokens of `token_shards`."""
    masked, unmasked, tok_hash = count_tokens(token_shards, vocab_size)
    chosen, stats = select_draft_ids(masked, unmasked, draft_vocab_size)
    d2t, t2d = ids_to_mapping(chosen, vocab_size)
    stats.update({"draft_vocab_size": draft_vocab_size, "vocab_size": vocab_size, "tokenizer_hash": tok_hash})
    return d2t, t2d, stats


def save_draft_vocab(
    path: str | os.PathLike, d2t: torch.Tensor, t2d: torch.Tensor, stats: dict, tokenizer_hash: str
) -> None:
    """safetensors with `d2t`, `t2d` and string metadata (design.md), written atomically."""
    validate_mapping(d2t, t2d, str(path))
    metadata = {
        "format": VOCAB_FORMAT,
        "tokenizer_hash": str(tokenizer_hash),
        "draft_vocab_size": str(len(d2t)),
        "vocab_size": str(len(t2d)),
        "masked_tokens": str(int(stats.get("masked_tokens", 0))),
        "coverage": repr(float(stats.get("coverage", 0.0))),
        "stats": json.dumps(stats, sort_keys=True),
    }
    blob = save({"d2t": d2t.long().contiguous(), "t2d": t2d.bool().contiguous()}, metadata=metadata)
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(canonical_safetensors(blob))


def canonical_safetensors(blob: bytes) -> bytes:
    """`blob` (a safetensors file) with its JSON header's keys sorted. safetensors serializes the
    metadata from a hash map whose order changes from process to process, so the same vocab would get
    another file hash (`draft_vocab_hash`, which every drafter and export records) on every rerun. Data
    offsets are relative to the end of the header, so only the header is rewritten (padded with spaces
    to 8 bytes, as the format asks: https://github.com/huggingface/safetensors#format)."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + size :]


def load_draft_vocab(path: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(d2t, t2d, metadata) with numeric metadata parsed; refuses a file that is not a draft vocab."""
    path = Path(path)
    with safe_open(path, "pt") as fh:
        raw = fh.metadata() or {}
        if raw.get("format") != VOCAB_FORMAT:
            raise ValueError(f"{path}: field 'format' is {raw.get('format')!r}, expected {VOCAB_FORMAT!r}")
        d2t, t2d = fh.get_tensor("d2t"), fh.get_tensor("t2d")
    meta = {
        "tokenizer_hash": raw["tokenizer_hash"],
        "draft_vocab_size": int(raw["draft_vocab_size"]),
        "vocab_size": int(raw["vocab_size"]),
        "masked_tokens": int(raw["masked_tokens"]),
        "coverage": float(raw["coverage"]),
        "stats": json.loads(raw.get("stats", "{}")),
    }
    validate_mapping(d2t, t2d, str(path))
    if len(d2t) != meta["draft_vocab_size"]:
        raise ValueError(
            f"{path}: d2t has {len(d2t)} rows but field 'draft_vocab_size' is {meta['draft_vocab_size']}"
        )
    return d2t, t2d, meta


def validate_mapping(d2t: torch.Tensor, t2d: torch.Tensor, where: str) -> None:
    if d2t.dtype != torch.int64 or t2d.dtype != torch.bool:
        raise ValueError(f"{where}: d2t must be int64 and t2d bool (got {d2t.dtype}, {t2d.dtype})")
    target = torch.arange(len(d2t)) + d2t
    if len(target) and (int(target.min()) < 0 or int(target.max()) >= len(t2d)):
        raise ValueError(f"{where}: d2t maps outside the target vocab of {len(t2d)}")
    if not bool((target[1:] > target[:-1]).all()):
        raise ValueError(f"{where}: draft vocab target ids are not strictly ascending")
    if int(t2d.sum()) != len(d2t) or not bool(t2d[target].all()):
        raise ValueError(f"{where}: t2d is not True exactly at the {len(d2t)} draft vocab target ids")
