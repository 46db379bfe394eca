"""The target model: loading it, its tokenizer, its config and the tensors the drafter borrows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open


def read_config(model_dir: str | os.PathLike) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"target model: {path} does not exist (model.source in the config)")
    return json.loads(path.read_text())


def load_tokenizer(model_dir: str | os.PathLike, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    # A path that is not a local dir would be taken for a hub repo id: fail here, naming it, instead.
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(
            f"target tokenizer: {model_dir} is not a directory (model.source in the config)"
        )
    if not any((model_dir / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(
            f"target tokenizer: {model_dir} has no tokenizer.json or tokenizer_config.json"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    if not tokenizer.chat_template:
        raise ValueError(f"target tokenizer in {model_dir} has no chat template (tokenizer_config.json)")
    return tokenizer


def load_target(
    model_dir: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = read_config(model_dir)
    # A multimodal wrapper around a causal LM (Kimi-K2.5's KimiK25ForConditionalGeneration: a vision tower
    # around DeepSeek-V3) is an image-text-to-text model in transformers, not a causal LM; text-only
    # prompts run it as its language model (models/kimi_k25 in transformers 5.25). Kimi-K2.5's own
    # config.json also maps AutoModelForCausalLM to its remote code (modeling_kimi_k25.py): that code
    # runs only when the user trusts it.
    native_wrapper = is_multimodal_wrapper(config) and not trust_remote_code
    auto = AutoModelForImageTextToText if native_wrapper else AutoModelForCausalLM
    model = auto.from_pretrained(
        str(model_dir), dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation="sdpa"
    )
    return model.to(device).eval().requires_grad_(False)


def is_multimodal_wrapper(config: dict) -> bool:
    """A checkpoint whose language model lies in `text_config` beside a `vision_config`."""
    return "text_config" in config and "vision_config" in config


# Where a multimodal wrapper keeps its language model's tensors: Kimi-K2.5 (`language_model.model.*`,
# `language_model.lm_head.*`, as sglang's models/kimi_k25.py loads them).
WRAPPED_PREFIXES = ("language_model.",)


def load_target_tensor(model_dir: str | os.PathLike, name: str) -> torch.Tensor:
    """One named tensor of the target's safetensors (single file or sharded with an index); a wrapper's
    language-model tensor is found under its prefix (`WRAPPED_PREFIXES`) when the plain name is absent."""
    model_dir = Path(model_dir)
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.exists():
        weight_map = json.loads(index_path.read_text())["weight_map"]
        names = set(weight_map)
    else:
        file = model_dir / "model.safetensors"
        with safe_open(file, "pt") as fh:
            names = set(fh.keys())
    found = next((n for n in (name, *(p + name for p in WRAPPED_PREFIXES)) if n in names), None)
    if found is None:
        raise KeyError(f"{index_path if index_path.exists() else file}: no tensor {name!r}")
    if index_path.exists():
        file = model_dir / weight_map[found]
    with safe_open(file, "pt") as fh:
        return fh.get_tensor(found)


def load_embed_and_head(model_dir: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding [V, H] and lm_head [V, H], read from safetensors by name.

    Only these tensors are read, so training never holds the whole target in memory.
    """
    embed = load_target_tensor(model_dir, "model.embed_tokens.weight")
    try:
        head = load_target_tensor(model_dir, "lm_head.weight")
    except KeyError:
        head = embed  # tied embeddings
    return embed, head


def resolve_device(device: str) -> str:
    """`auto` means CUDA when this process sees a GPU, else the CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but this process sees no CUDA device")
    return device
