"""Export a trained drafter as the directory SGLang serves with `LlamaForCausalLMEagle3`.

SGLang skips unknown weight names silently (FACTS §4), so a misnamed tensor would serve a drafter
with random weights: the exact key set, shapes and dtypes are validated against the config here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from eyas.atomic import atomic_dir
from eyas.model.drafter import DrafterConfig, Eagle3Drafter, read_drafter_config
from eyas.provenance import DRAFTER_PROVENANCE

PROVENANCE_KEYS = (*DRAFTER_PROVENANCE, "draft_vocab_hash")


def sglang_config(cfg: DrafterConfig, provenance: dict | None = None) -> dict:
    """config.json for SGLang's LlamaForCausalLMEagle3 (a one-layer Llama + EAGLE-3 fields)."""
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        # transformers 5 reads rope_parameters, 4.x reads rope_theta: write both, same value.
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
            "use_aux_hidden_state": True,
        },
    }
    if provenance:
        config["eyas_provenance"] = provenance  # ignored by SGLang, kept for traceability
    return config


def expected_tensors(cfg: DrafterConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every key SGLang loads for this config, with its shape and dtype."""
    h, nh, nkv, hd, i = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    )
    bf = torch.bfloat16
    return {
        "fc.weight": ((h, 3 * h), bf),
        "layers.0.self_attn.q_proj.weight": ((nh * hd, 2 * h), bf),
        "layers.0.self_attn.k_proj.weight": ((nkv * hd, 2 * h), bf),
        "layers.0.self_attn.v_proj.weight": ((nkv * hd, 2 * h), bf),
        "layers.0.self_attn.o_proj.weight": ((h, nh * hd), bf),
        "layers.0.mlp.gate_proj.weight": ((i, h), bf),
        "layers.0.mlp.up_proj.weight": ((i, h), bf),
        "layers.0.mlp.down_proj.weight": ((h, i), bf),
        "layers.0.input_layernorm.weight": ((h,), bf),
        "layers.0.hidden_norm.weight": ((h,), bf),
        "layers.0.post_attention_layernorm.weight": ((h,), bf),
        "norm.weight": ((h,), bf),
        "lm_head.weight": ((cfg.draft_vocab_size, h), bf),
        "d2t": ((cfg.draft_vocab_size,), torch.int64),
        "t2d": ((cfg.vocab_size,), torch.bool),
    }


def validate_tensors(tensors: dict[str, torch.Tensor], cfg: DrafterConfig) -> None:
    """Raise naming the first key that is missing, unexpected, or of the wrong shape or dtype."""
    want = expected_tensors(cfg)
    for key in sorted(set(want) - set(tensors)):
        raise ValueError(f"SGLang export: key {key!r} missing")
    for key in sorted(set(tensors) - set(want)):
        raise ValueError(f"SGLang export: unexpected key {key!r} (SGLang would skip it silently)")
    for key, (shape, dtype) in want.items():
        t = tensors[key]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(
                f"SGLang export: key {key!r} is {tuple(t.shape)} {t.dtype}, expected {shape} {dtype}"
            )


def sglang_tensors(model: Eagle3Drafter) -> dict[str, torch.Tensor]:
    """The drafter's state dict in SGLang form: bf16 weights, int64 d2t, bool t2d, no embedding."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "embed_tokens.weight":
            continue  # SGLang shares the target's embedding
        out[name] = (
            t.detach().cpu().contiguous() if name in ("d2t", "t2d") else t.detach().cpu().to(torch.bfloat16)
        )
    return out


def export_sglang(drafter_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Write `config.json` + `model.safetensors` for SGLang at `out_dir` (atomic). Returns a summary."""
    model = Eagle3Drafter.from_pretrained(drafter_dir)
    raw = read_drafter_config(drafter_dir)
    provenance = {k: raw[k] for k in PROVENANCE_KEYS if k in raw}
    tensors = sglang_tensors(model)
    validate_tensors(tensors, model.config)
    config = sglang_config(model.config, provenance)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    size = (Path(out_dir) / "model.safetensors").stat().st_size
    return {
        "out_dir": str(out_dir),
        "keys": len(tensors),
        "parameters": int(sum(t.numel() for k, t in tensors.items() if k not in ("d2t", "t2d"))),
        "bytes": size,
        "draft_vocab_size": model.config.draft_vocab_size,
        "aux_layer_ids": list(model.config.aux_layer_ids),
    }
