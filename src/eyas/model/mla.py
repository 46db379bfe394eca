"""Multi-head latent attention (DeepSeek-V2 MLA) for the drafter's decoder layer (`train.drafter: mla`),
and the MLA dimensions a drafter takes from its target.

SGLang serves this layer as `Eagle3DeepseekV2ForCausalLM` (`python/sglang/srt/models/kimi_k25_eagle3.py`,
identical in 0.5.17 and 0.5.23 apart from imports, https://github.com/sgl-project/sglang): the EAGLE-3
layout of `eyas.model.drafter` with DeepSeek-V2's attention (`DeepseekV2AttentionMLA`, `deepseek_v2.py`)
whose down-projections read the 2H concat [input_layernorm(embed), hidden_norm(hidden)]:

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))             # [.., 2H] -> [.., q_lora] -> [.., nH, dn + dr]
    c, kr  = split(kv_a_proj_with_mqa(x), [kv_lora, dr])      # latent [.., kv_lora], shared rope key [.., dr]
    k, v   = split(kv_b_proj(kv_a_layernorm(c)), [dn, dv])    # [.., nH, dn], [.., nH, dv]
    q_rope, kr rotated by RoPE in interleaved pairs (DeepSeek's `rope_interleave`, SGLang's non-neox rope)
    out    = o_proj(softmax(q.k / sqrt(dn + dr)) v)            # keys = [k_nope, kr broadcast to every head]

SGLang fuses q_a_proj and kv_a_proj_with_mqa into `fused_qkv_a_proj_with_mqa` at load and serves the
absorbed form (queries multiplied into the latent, a cache of [kv_lora + dr] per token); this module
computes the same attention in the expanded form above (per-head keys and values), which training and
the HF evaluation loop need. Its `qkv`/`project_out` are those of the Llama `Attention`
(`eyas.model.decoder_layer`), so the TTT unroll and the serving chain of `Eagle3Drafter` run unchanged;
keys and values have every query head (no GQA groups), and the value width dv may differ from the key
width dn + dr.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from eyas.model.norm import RMSNorm

MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def mla_dims(text_config: dict) -> dict[str, int]:
    """The five MLA dimensions of a drafter for this target (its text config).

    A target with MLA (`kv_lora_rank` in its config: DeepSeek-V2/V3, Kimi-K2/K2.5) gives its own, so
    the draft's KV cache has the target's shape; a missing `q_lora_rank` (DeepSeek-V2-Lite has none,
    and SGLang's EAGLE-3 MLA layer requires one) is 3 * kv_lora_rank. A target without MLA gets
    DeepSeek-V3's proportions to its head width hd (V3, hd 128: nope 128, rope 64, v 128, kv_lora 512,
    q_lora 1536): nope = v = hd, rope = hd / 2, kv_lora = 4 hd, q_lora = 12 hd, with
    hd = head_dim or hidden_size / num_attention_heads (SmolLM2-135M: hd 64 -> 64, 32, 64, 256, 768).
    """
    c = text_config
    if c.get("kv_lora_rank"):
        missing = [f for f in MLA_FIELDS[1:] if not c.get(f)]
        if missing:
            raise ValueError(f"target config.json has kv_lora_rank but lacks MLA field(s) {missing}")
        dims = {f: int(c[f]) for f in MLA_FIELDS[1:]}
        dims["q_lora_rank"] = int(c.get("q_lora_rank") or 3 * dims["kv_lora_rank"])
        return {f: dims[f] for f in MLA_FIELDS}
    hd = int(c.get("head_dim") or int(c["hidden_size"]) // int(c["num_attention_heads"]))
    if hd % 4:
        raise ValueError(f"target head width {hd} is not a multiple of 4: no MLA rope width hd / 2 (even)")
    return {
        "q_lora_rank": 12 * hd,
        "kv_lora_rank": 4 * hd,
        "qk_nope_head_dim": hd,
        "qk_rope_head_dim": hd // 2,
        "v_head_dim": hd,
    }


def rope_interleaved_cos_sin(position_ids: Tensor, dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """RoPE tables for interleaved pairs: position_ids [B, T] -> cos, sin [B, 1, T, dim / 2] (fp32)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=position_ids.device).float() / dim)
    freqs = position_ids.float()[..., None] * inv_freq  # [B, T, dim/2]
    return freqs.cos()[:, None], freqs.sin()[:, None]


def apply_rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, h, T, dim] with pairs (x0, x1), (x2, x3), ... each rotated by one frequency (GPT-J style,
    SGLang's `is_neox_style=False`, HF DeepSeek-V3's `apply_rotary_pos_emb_interleave`)."""
    even, odd = x[..., 0::2], x[..., 1::2]  # [B, h, T, dim/2]; times the fp32 tables: >= fp32 math
    rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)  # [B, h, T, dim/2, 2]
    return rotated.flatten(-2).to(x.dtype)


class MLAAttention(nn.Module):
    """DeepSeek-V2 MLA reading the drafter's 2H attention input; parameter names as SGLang loads them.
    cfg: the drafter's `DrafterConfig` (attention `mla`; not imported: `eyas.model.drafter_config`
    imports this module)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, nh = cfg.hidden_size, cfg.num_attention_heads
        dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.q_a_proj = nn.Linear(2 * h, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, nh * (dn + dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * h, cfg.kv_lora_rank + dr, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, nh * (dn + dv), bias=False)
        self.o_proj = nn.Linear(nh * dv, h, bias=False)

    def qkv(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, 2H] -> post-RoPE q and k [B, nH, T, dn + dr], v [B, nH, T, dv]."""
        b, t, _ = x.shape
        c = self.cfg
        nh, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # [B, T, nH * (dn + dr)]
        q_nope, q_rope = q.view(b, t, nh, dn + dr).transpose(1, 2).split([dn, dr], dim=-1)
        # latent [B, T, kv_lora], k_rope [B, T, dr]
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, nh, dn + dv).transpose(1, 2)
        k_nope, v = kv.split([dn, dv], dim=-1)  # [B, nH, T, dn], [B, nH, T, dv]
        cos, sin = rope_interleaved_cos_sin(position_ids, dr, c.rope_theta)
        q_rope = apply_rope_interleaved(q_rope, cos, sin)
        k_rope = apply_rope_interleaved(k_rope[:, None], cos, sin).expand(b, nh, t, dr)  # one key, every head
        return torch.cat([q_nope, q_rope], dim=-1), torch.cat([k_nope, k_rope], dim=-1), v

    def project_out(self, out: Tensor) -> Tensor:
        """[B, nH, T, dv] -> [B, T, H]."""
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
