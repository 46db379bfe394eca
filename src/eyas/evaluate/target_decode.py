"""The HF target as a batch-1 decoder: forwards after its KV-cached prefix, cache rollback, hooks on
its tapped layers, the length checks, and plain decoding (the reference `eyas.evaluate.specdec` is
checked against).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from eyas.evaluate.sampling import pick
from eyas.model.capture import TapCapture

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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


def new_target_cache(target: PreTrainedModel):
    from transformers import DynamicCache

    return DynamicCache(config=target.config)


def crop_target_cache(cache, length: int) -> None:
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # a negative argument removes that many tokens in every transformers 5.x


def target_forward(target: PreTrainedModel, cache, ids: list[int], last_only: bool = False) -> Tensor:
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


def check_lengths(
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
    check_lengths(target, prompt_ids, max_new_tokens)
    out: list[int] = []
    if max_new_tokens == 0:
        return out
    cache = new_target_cache(target)
    logits = target_forward(target, cache, list(prompt_ids), last_only=True)  # [1, V]
    while True:
        token = pick(logits[-1], temperature, generator)
        out.append(token)
        if token in eos_token_ids or len(out) >= max_new_tokens:
            return out
        logits = target_forward(target, cache, [token])
