"""The target model: loading it, its tokenizer, its config and the tensors the drafter borrows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default taps in the drafter convention: outputs of layers 1, L/2-1 and L-4."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def hf_hidden_index(layer_id: int) -> int:
    """Index into HF `output_hidden_states` (0 = embeddings) of drafter-convention tap `layer_id`."""
    return layer_id + 1


def read_config(model_dir: str | os.PathLike) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"target model: {path} does not exist (model.path in the config)")
    return json.loads(path.read_text())


def load_tokenizer(model_dir: str | os.PathLike, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

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
    from transformers import AutoModelForCausalLM

    read_config(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation="sdpa"
    )
    return model.to(device).eval().requires_grad_(False)


def load_embed_and_head(model_dir: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding [V, H] and lm_head [V, H], read from safetensors by name.

    Only these two tensors are read, so training never holds the whole target in memory.
    """
    model_dir = Path(model_dir)
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.exists():
        weight_map = json.loads(index_path.read_text())["weight_map"]
    else:
        with safe_open(model_dir / "model.safetensors", "pt") as fh:
            weight_map = {name: "model.safetensors" for name in fh.keys()}  # noqa: SIM118

    def get(name: str) -> torch.Tensor:
        with safe_open(model_dir / weight_map[name], "pt") as fh:
            return fh.get_tensor(name)

    embed = get("model.embed_tokens.weight")
    head = get("lm_head.weight") if "lm_head.weight" in weight_map else embed  # tied embeddings
    return embed, head
