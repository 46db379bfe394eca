"""Read an export back as the serving engine reads it: the round-trip check that an export computes what
the trained drafter computes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from eyas.core.layer_ids import tap_ids_from_sglang, tap_ids_from_vllm
from eyas.export.speculators import SPECULATORS_ARCH
from eyas.export.tensors import validate_tensors
from eyas.model.drafter import DrafterConfig, Eagle3Drafter


def load_export(export_dir: str | os.PathLike, embed: torch.Tensor | None = None) -> Eagle3Drafter:
    """Rebuild a drafter from an export dir, reading only what the serving engine reads.

    The config is parsed from the export's own fields (SGLang or speculators layout, vLLM ids
    converted back). embed [V, H]: the target embedding SGLang shares, required for an SGLang
    export; a speculators export uses its own. Used to check that an export computes what the
    trained model computes."""
    from safetensors.torch import load_file

    export_dir = Path(export_dir)
    raw = json.loads((export_dir / "config.json").read_text())
    if raw.get("architectures") == [SPECULATORS_ARCH]:
        kind = "speculators"
        layer = raw["transformer_layer_config"]
        aux = tap_ids_from_vllm(raw["eagle_aux_hidden_state_layer_ids"])
    elif raw.get("architectures") == ["LlamaForCausalLMEagle3"]:
        kind = "sglang"
        layer = raw
        model_type = raw.get("eyas_provenance", {}).get("target_model_type", "llama")
        aux = tap_ids_from_sglang(model_type, raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    else:
        raise ValueError(
            f"{export_dir / 'config.json'}: field 'architectures' is {raw.get('architectures')!r}"
        )
    cfg = DrafterConfig(
        hidden_size=layer["hidden_size"],
        intermediate_size=layer["intermediate_size"],
        num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer["num_key_value_heads"],
        head_dim=layer["head_dim"],
        rms_norm_eps=layer["rms_norm_eps"],
        rope_theta=layer["rope_theta"],
        max_position_embeddings=layer["max_position_embeddings"],
        vocab_size=layer["vocab_size"],
        draft_vocab_size=raw["draft_vocab_size"],
        aux_layer_ids=aux,
        hidden_act=layer["hidden_act"],
        rope_scaling=layer.get("rope_scaling"),
    )
    tensors = load_file(str(export_dir / "model.safetensors"))
    validate_tensors(tensors, cfg, kind)
    model = Eagle3Drafter(cfg)
    state = {k: (v if k in ("d2t", "t2d") else v.float()) for k, v in tensors.items()}
    if kind == "sglang":
        if embed is None:
            raise ValueError(f"{export_dir}: an SGLang export has no embedding: pass the target's")
        state["embed_tokens.weight"] = embed.float()
    model.load_state_dict(state, strict=True)
    return model.eval()
