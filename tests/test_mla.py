"""The MLA drafter layer (`eyas.model.mla`, `attention: mla`): its attention equals transformers'
DeepSeek-V3 attention, the MLA dims it takes from a target, and the EAGLE-3.1 options."""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

from eyas.model.drafter import DrafterConfig, Eagle3Drafter, sdpa
from eyas.model.mla import mla_dims

torch.set_num_threads(1)

H, HEADS = 32, 4
MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)


def mla_config(**overrides) -> DrafterConfig:
    base = dict(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=12,
        rms_norm_eps=1e-6,  # HF DeepseekV3RMSNorm's default, which its attention's norms use
        rope_theta=10000.0,
        max_position_embeddings=256,
        vocab_size=100,
        draft_vocab_size=40,
        aux_layer_ids=[1, 2, 5],
        attention="mla",
        **MLA,
    )
    base.update(overrides)
    return DrafterConfig(**base)


def test_mla_attention_equals_transformers_deepseek_v3_attention():
    """The drafter's MLA (expanded form, SDPA, interleaved RoPE) against transformers' own
    DeepseekV3Attention (rope_interleave) given the same weights: HF's is built for a 2H-wide input
    and its o_proj replaced by the drafter's (nH * dv -> H), so the two read the same 2H concat."""
    torch.manual_seed(0)
    drafter = Eagle3Drafter(mla_config()).double()
    attn = drafter.layers[0].self_attn
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    hf_cfg = DeepseekV3Config(
        hidden_size=2 * H,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        rope_theta=10000.0,
        rope_interleave=True,
        attention_bias=False,
        max_position_embeddings=256,
        **MLA,
    )
    hf_cfg._attn_implementation = "sdpa"
    hf = DeepseekV3Attention(hf_cfg, layer_idx=0).double()
    hf.o_proj = torch.nn.Linear(HEADS * MLA["v_head_dim"], H, bias=False).double()
    missing = hf.load_state_dict(attn.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    rotary = DeepseekV3RotaryEmbedding(hf_cfg)

    x = torch.randn(2, 11, 2 * H, dtype=torch.float64)  # [B, T, 2H]
    pos = torch.arange(3, 14).expand(2, 11)  # offset positions: RoPE must not start at 0 to agree
    q, k, v = attn.qkv(x, pos)
    assert q.shape == k.shape == (2, HEADS, 11, 12) and v.shape == (2, HEADS, 11, 6)
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    ours = attn.project_out(sdpa(q, k, v, causal))  # [B, T, H]
    theirs, _ = hf(x, rotary(x, pos), attention_mask=None)
    assert ours.shape == theirs.shape == (2, 11, H)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


def test_mla_dims_from_an_mla_target_and_derived_for_others():
    kimi_text = {"hidden_size": 7168, "num_attention_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
                 "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}  # fmt: skip
    assert mla_dims(kimi_text) == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                                   "qk_rope_head_dim": 64, "v_head_dim": 128}  # fmt: skip
    lite = {**kimi_text, "q_lora_rank": None}  # DeepSeek-V2-Lite: no query latent
    assert mla_dims(lite)["q_lora_rank"] == 3 * 512
    smollm2 = {"hidden_size": 576, "num_attention_heads": 9}
    assert mla_dims(smollm2) == {"q_lora_rank": 768, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
                                 "qk_rope_head_dim": 32, "v_head_dim": 64}  # fmt: skip
    with pytest.raises(ValueError, match="lacks MLA field"):
        mla_dims({"kv_lora_rank": 512, "qk_nope_head_dim": 128})


def _target(**fields) -> dict:
    return {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100, "rope_theta": 50000.0, **fields}  # fmt: skip


def test_from_target_config_auto_picks_mla_through_a_wrapper():
    text = _target(model_type="deepseek_v3", **MLA)
    wrapper = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
               "text_config": text}  # fmt: skip
    cfg = DrafterConfig.from_target_config(wrapper, 40, [1, 2, 3], attention="auto")
    assert cfg.attention == "mla" and cfg.hidden_size == 64
    assert {f: getattr(cfg, f) for f in MLA} == MLA
    assert cfg.num_key_value_heads == 4 and cfg.head_dim == 12
    plain = DrafterConfig.from_target_config(_target(), 40, [1, 2, 3], attention="auto")
    assert plain.attention == "llama" and plain.q_lora_rank is None
    forced = DrafterConfig.from_target_config(_target(), 40, [1, 2, 3], attention="mla", fc_norm=True)
    assert forced.attention == "mla" and forced.qk_rope_head_dim == 8 and forced.fc_norm


def test_options_are_mla_only_and_validated():
    with pytest.raises(ValueError, match="options of attention 'mla'"):
        DrafterConfig.from_target_config(_target(), 40, [1, 2, 3], attention="llama", norm_output=True)
    with pytest.raises(ValueError, match="not 'llama' or 'mla'"):
        mla_config(attention="gqa")
    with pytest.raises(ValueError, match="needs even qk_rope_head_dim"):
        mla_config(qk_rope_head_dim=5)


def test_fc_norm_normalises_each_tap_and_norm_output_feeds_the_normed_state():
    torch.manual_seed(0)
    model = Eagle3Drafter(mla_config(fc_norm=True, norm_output=True)).eval()
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(model.state_dict())
    aux = torch.randn(1, 5, 3 * H)
    scaled = torch.cat([aux[..., :H] * 7, aux[..., H:]], dim=-1)  # one tap scaled: RMSNorm undoes it
    torch.testing.assert_close(model.combine_taps(aux), model.combine_taps(scaled))
    ids, pos = torch.randint(0, 100, (1, 5)), torch.arange(5)[None]
    logits, fed = model.forward_step(model.combine_taps(aux), ids, pos)
    plain = Eagle3Drafter(mla_config()).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("fc_norm")})
    _, out = plain.forward_step(model.combine_taps(aux), ids, pos)  # the same layer without the options
    torch.testing.assert_close(fed, model.norm(out))
    torch.testing.assert_close(logits, model.lm_head(model.norm(out)))
