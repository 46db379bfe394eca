"""The weight-name contract of the exports: the exact key set, shapes and dtypes each engine reads, and the
drafter's state dict in each engine's form.

SGLang skips unknown weight names silently (`LlamaForCausalLMEagle3.load_weights`, sglang 0.5.23), so a
misnamed tensor would serve a drafter with random weights: every export is validated against its config
here before it is written, and again when it is read back (`reload.load_export`).
"""

from __future__ import annotations

import torch

from eyas.model.drafter import DrafterConfig, Eagle3Drafter

Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


def expected_tensors(cfg: DrafterConfig) -> Shapes:
    """Every key SGLang loads for this config, with its shape and dtype."""
    if cfg.attention == "mla":
        return expected_mla_tensors(cfg)
    h, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bf = torch.bfloat16
    attn = "layers.0.self_attn"
    return {
        f"{attn}.q_proj.weight": ((nh * hd, 2 * h), bf),
        f"{attn}.k_proj.weight": ((nkv * hd, 2 * h), bf),
        f"{attn}.v_proj.weight": ((nkv * hd, 2 * h), bf),
        f"{attn}.o_proj.weight": ((h, nh * hd), bf),
        **_outside_attention(cfg),
    }


def expected_mla_tensors(cfg: DrafterConfig) -> Shapes:
    """Every key `Eagle3DeepseekV2ForCausalLM.load_weights` reads (sglang 0.5.17 / 0.5.23
    `models/kimi_k25_eagle3.py`): it fuses q_a_proj + kv_a_proj_with_mqa into
    `fused_qkv_a_proj_with_mqa` and gate + up into `gate_up_proj`, maps `layers.0.*` to its `midlayer`."""
    h, nh = cfg.hidden_size, cfg.num_attention_heads
    dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    q_lora, kv_lora = cfg.q_lora_rank, cfg.kv_lora_rank
    bf = torch.bfloat16
    attn = "layers.0.self_attn"
    out = {
        f"{attn}.q_a_proj.weight": ((q_lora, 2 * h), bf),
        f"{attn}.q_a_layernorm.weight": ((q_lora,), bf),
        f"{attn}.q_b_proj.weight": ((nh * (dn + dr), q_lora), bf),
        f"{attn}.kv_a_proj_with_mqa.weight": ((kv_lora + dr, 2 * h), bf),
        f"{attn}.kv_a_layernorm.weight": ((kv_lora,), bf),
        f"{attn}.kv_b_proj.weight": ((nh * (dn + dv), kv_lora), bf),
        f"{attn}.o_proj.weight": ((h, nh * dv), bf),
        **_outside_attention(cfg),
    }
    if cfg.fc_norm:
        out.update({f"fc_norm.{k}.weight": ((h,), bf) for k in range(3)})
    return out


def _outside_attention(cfg: DrafterConfig) -> Shapes:
    """The keys both draft layers share: fc over the taps, the dense MLP, the norms, the draft-vocab head
    and the vocab maps."""
    h, i, bf = cfg.hidden_size, cfg.intermediate_size, torch.bfloat16
    return {
        "fc.weight": ((h, 3 * h), bf),
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


def expected_speculators_tensors(cfg: DrafterConfig) -> Shapes:
    """The SGLang keys plus `embed_tokens.weight` [V, H]: speculators 0.9.0 builds its embedding
    from the checkpoint and, when the key is absent, leaves it at zeros (no warning) under
    transformers 5.19; vLLM 0.33.0 loads it and shares the target's instead when the two are equal."""
    return {
        **expected_tensors(cfg),
        "embed_tokens.weight": ((cfg.vocab_size, cfg.hidden_size), torch.bfloat16),
    }


EXPORT_KINDS = {
    "sglang": ("SGLang", expected_tensors),
    "speculators": ("speculators", expected_speculators_tensors),
}


def validate_tensors(tensors: dict[str, torch.Tensor], cfg: DrafterConfig, kind: str = "sglang") -> None:
    """Raise naming the first key that is missing, unexpected, or of the wrong shape or dtype.
    kind: `sglang` or `speculators` (which key set)."""
    label, expected = EXPORT_KINDS[kind]
    if kind != "sglang" and cfg.attention != "llama":
        raise ValueError(f"{label} export: attention {cfg.attention!r} has no {label} format (SGLang only)")
    want = expected(cfg)
    for key in sorted(set(want) - set(tensors)):
        raise ValueError(f"{label} export: key {key!r} missing")
    for key in sorted(set(tensors) - set(want)):
        raise ValueError(f"{label} export: unexpected key {key!r} (the engine would skip it silently)")
    for key, (shape, dtype) in want.items():
        t = tensors[key]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(
                f"{label} export: key {key!r} is {tuple(t.shape)} {t.dtype}, expected {shape} {dtype}"
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


def speculators_tensors(model: Eagle3Drafter) -> dict[str, torch.Tensor]:
    """The SGLang tensors plus the embedding the drafter was trained with (the target's), in bf16."""
    embed = model.embed_tokens.weight.detach().cpu().to(torch.bfloat16).contiguous()
    return {**sglang_tensors(model), "embed_tokens.weight": embed}
