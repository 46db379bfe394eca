"""Export a trained drafter as SGLang's `LlamaForCausalLMEagle3` dir (`config.json` + `model.safetensors`,
no embedding: SGLang shares the target's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import save_file

from eyas.core.atomic import atomic_dir
from eyas.core.layer_ids import sglang_layer_ids
from eyas.core.provenance import DRAFTER_PROVENANCE
from eyas.export.tensors import sglang_tensors, validate_tensors
from eyas.model.drafter import DrafterConfig, Eagle3Drafter, read_drafter_config

PROVENANCE_KEYS = (*DRAFTER_PROVENANCE, "draft_vocab_hash")


def sglang_config(
    cfg: DrafterConfig, provenance: dict | None = None, target_model_type: str = "llama"
) -> dict:
    """config.json for SGLang's LlamaForCausalLMEagle3 (a one-layer Llama + EAGLE-3 fields).

    The aux ids are in SGLang's convention for the target's family (`eyas.core.layer_ids`): the
    serving engine hands them to the target's `set_eagle3_layers_to_capture`. An MLA drafter gets
    `Eagle3DeepseekV2ForCausalLM`'s config (`mla_config`)."""
    if cfg.attention == "mla":
        return mla_config(cfg, provenance, target_model_type)
    return {
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
        **_eagle3_fields(cfg, provenance, target_model_type),
    }


def _eagle3_fields(cfg: DrafterConfig, provenance: dict | None, target_model_type: str) -> dict:
    """The fields both draft configs end with: weight dtype, the EAGLE-3 taps in SGLang's convention
    for the target's family, and eyas's provenance (ignored by SGLang, kept for traceability and for
    reading the ids back)."""
    return {
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(target_model_type, cfg.aux_layer_ids),
            "use_aux_hidden_state": True,
        },
        "eyas_provenance": {**(provenance or {}), "target_model_type": target_model_type},
    }


def export_sglang(
    drafter_dir: str | os.PathLike, out_dir: str | os.PathLike, target_model_type: str = "llama"
) -> dict:
    """Write `config.json` + `model.safetensors` for SGLang at `out_dir` (atomic). Returns a summary.
    `target_model_type`: the target's HF model_type (`eyas.core.layer_ids.text_model_type`)."""
    model = Eagle3Drafter.from_pretrained(drafter_dir)
    raw = read_drafter_config(drafter_dir)
    provenance = {k: raw[k] for k in PROVENANCE_KEYS if k in raw}
    tensors = sglang_tensors(model)
    validate_tensors(tensors, model.config)
    config = sglang_config(model.config, provenance, target_model_type)
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
        "sglang_aux_layer_ids": config["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
    }


def mla_config(
    cfg: DrafterConfig, provenance: dict | None = None, target_model_type: str = "deepseek_v3"
) -> dict:
    """config.json for SGLang's `Eagle3DeepseekV2ForCausalLM` (`models/kimi_k25_eagle3.py`, 0.5.17 and
    0.5.23): a one-layer DeepSeek-V3 config (transformers' `DeepseekV3Config` reads it; SGLang's
    model config gives the draft an MLA KV cache by its architecture) plus the EAGLE-3 fields and the
    EAGLE-3.1 flags `fc_norm` / `norm_output` the class reads. Interleaved RoPE (`rope_interleave`)
    at the drafter's theta, no scaling: what `eyas.model.mla` trains."""
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "num_hidden_layers": 1,
        "first_k_dense_replace": 1,  # the one layer is dense (the class builds a DeepseekV2MLP anyway)
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_interleave": True,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        **_eagle3_fields(cfg, provenance, target_model_type),
    }
