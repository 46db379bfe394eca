"""The drafter's one decoder layer (SGLang's `LlamaDecoderLayer` of `llama_eagle3.py`): attention over
the 2H concat of the normed token embedding and the normed incoming hidden, then residual + SiLU MLP.
The attention is Llama's GQA with RoPE (`Attention`, here) or DeepSeek-V2 MLA (`eyas.model.mla`),
as `DrafterConfig.attention` says; both offer the `qkv` / `project_out` the drafter's forward passes
call, so `eyas.model.drafter` runs the attention itself (cached chain or TTT tree mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eyas.model.drafter_config import DrafterConfig
from eyas.model.mla import MLAAttention
from eyas.model.norm import RMSNorm


def rope_cos_sin(position_ids: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Llama RoPE tables for `position_ids` [B, T] -> cos, sin [B, 1, T, hd] (fp32)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device).float() / head_dim)
    freqs = position_ids.float()[..., None] * inv_freq  # [B, T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, hd]
    return emb.cos()[:, None], emb.sin()[:, None]


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, h, T, hd] rotated by position (HF Llama's rotate_half convention)."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """[B, nKV, S, hd] -> [B, nKV * groups, S, hd] (GQA: each KV head serves `groups` query heads)."""
    if groups == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


class Attention(nn.Module):
    """Llama GQA attention whose q/k/v read the 2H concat of normed embedding and normed hidden."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)

    def qkv(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, 2H] -> post-RoPE q [B, nH, T, hd], k and v [B, nKV, T, hd]."""
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(position_ids, c.head_dim, c.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def project_out(self, out: Tensor) -> Tensor:
        """[B, nH, T, hd] -> [B, T, H]."""
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.self_attn = MLAAttention(cfg) if cfg.attention == "mla" else Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # on the token embedding
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # on the incoming hidden
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def attn_input(self, embeds: Tensor, hidden: Tensor) -> Tensor:
        """[B, T, H] x2 -> [B, T, 2H]; embedding first, like SGLang."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn_out: Tensor, residual: Tensor) -> Tensor:
        """Residual + MLP after attention: [B, T, H] -> [B, T, H] (pre-final-norm)."""
        h2 = attn_out + residual
        return h2 + self.mlp(self.post_attention_layernorm(h2))
