"""The weight-name contract of the exports: the exact key set, shapes and dtypes each engine reads, and the
drafter's state dict in each engine's form.

SGLang skips unknown weight names silently (`LlamaForCausalLMEagle3.load_weights`, sglang 0.5.23), so a
misnamed tensor would serve a drafter with random weights: every export is validated against its config
here before it is written, and again when it is read back (`reload.load_export`).
"""

from __future__ import annotations

import torch

from eyas.model.drafter import DrafterConfig, Eagle3Drafter


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


def expected_speculators_tensors(cfg: DrafterConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
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
