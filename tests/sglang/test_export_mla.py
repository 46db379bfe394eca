"""eyas's MLA drafter export fed to the real sglang 0.5.23 `Eagle3DeepseekV2ForCausalLM.load_weights` on CPU
(`models/kimi_k25_eagle3.py`; 0.5.17's differs only in imports), as test_export_load_weights.py does for
the Llama drafter: built from the export's own config.json (transformers' AutoConfig), every parameter
set to NaN, the export's tensors through its real loader (which skips unknown names with a warning only).
Then every parameter holds the export's values (q_a_proj + kv_a_proj_with_mqa fused, gate + up fused),
no key is skipped, the EAGLE-3.1 flags reach the model, SGLang's RoPE for MLA equals eyas's interleaved
RoPE, and the absorbed attention SGLang serves from the loaded weights (`w_kc`, `w_vc`, a latent cache)
equals the expanded attention eyas trains.
"""

from __future__ import annotations

import pytest
import torch
from objects import load_into_nan
from test_drafter import MLA_LAYER, tiny_config  # tests/ is on sys.path (rootdir conftest)
from test_export_load_weights import monkeypatch_module, sglang_cpu_groups  # noqa: F401 (fixtures)
from transformers import AutoConfig

from eyas.export import export_sglang, load_export
from eyas.model.drafter import Eagle3Drafter
from eyas.model.mla import apply_rope_interleaved, rope_interleaved_cos_sin

VOCAB, DRAFT_VOCAB, H = 100, 40, 32


@pytest.fixture(
    scope="module", params=[{}, {"fc_norm": True, "norm_output": True}], ids=["eagle3", "eagle3.1"]
)
def exported(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("mla_export")
    cfg = tiny_config(**MLA_LAYER, **request.param, aux_layer_ids=[1, 14, 26])
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    target_ids = torch.randperm(VOCAB)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[target_ids] = True
    model.set_vocab(target_ids - torch.arange(DRAFT_VOCAB), t2d)
    model.save_pretrained(out / "drafter")
    export_sglang(out / "drafter", out / "export", target_model_type="kimi_k25")
    return out / "export", model


@pytest.fixture(scope="module")
def loaded(sglang_cpu_groups, exported, monkeypatch_module):  # noqa: F811 (fixtures by name)
    import sglang.srt.layers.rotary_embedding.base as rope_base
    import sglang.srt.models.deepseek_v2 as deepseek_v2
    from sglang.srt.layers.rotary_embedding.factory import get_rope
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    # RoPE at construction only (load_weights does not use it): on a "cpu" device SGLang's MLA asks
    # get_rope_cpu, which implements DeepSeek's yarn only; the generic table is built instead.
    monkeypatch_module.setattr(rope_base, "_is_cpu", True)
    monkeypatch_module.setattr(
        deepseek_v2, "get_rope_wrapper", lambda *a, device=None, **k: get_rope(*a, **k)
    )
    export_dir, _ = exported
    config = AutoConfig.from_pretrained(str(export_dir))
    return load_into_nan(Eagle3DeepseekV2ForCausalLM, config, export_dir)


def _expected_params(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SGLang parameter name -> the value the export should have put there (its fusions applied)."""
    out = {}
    for key, t in tensors.items():
        if key in ("d2t", "t2d") or ".kv_a_proj_with_mqa." in key or ".up_proj." in key:
            continue
        name = key.replace("layers.0.", "midlayer.")
        name = name if name.startswith("lm_head.") else f"model.{name}"
        if ".q_a_proj." in key:
            kv = tensors[key.replace("q_a_proj", "kv_a_proj_with_mqa")]
            name, t = name.replace("q_a_proj", "fused_qkv_a_proj_with_mqa"), torch.cat([t, kv])
        elif ".gate_proj." in key:
            up = tensors[key.replace("gate_proj", "up_proj")]
            name, t = name.replace("gate_proj", "gate_up_proj"), torch.cat([t, up])
        out[name] = t
    return out


def test_config_as_sglang_reads_it(exported, loaded):
    _, drafter = exported
    model, _ = loaded
    cfg = drafter.config
    assert model.config.draft_vocab_size == DRAFT_VOCAB and model.config.vocab_size == VOCAB
    assert model.model.num_aux_hidden_states == 3 and model.model.fc.input_size == 3 * H
    assert (model.model.fc_norm is not None) == cfg.fc_norm and model.model.norm_output == cfg.norm_output
    attn = model.model.midlayer.self_attn
    assert (attn.q_lora_rank, attn.kv_lora_rank) == (cfg.q_lora_rank, cfg.kv_lora_rank)
    assert (attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim) == (8, 4, 6)
    assert attn.scaling == pytest.approx((8 + 4) ** -0.5)  # no yarn: SDPA's default scale in eyas
    assert model.config.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert model.load_lm_head_from_target is False


def test_every_parameter_holds_the_export_and_no_key_is_skipped(loaded):
    model, tensors = loaded
    params = dict(model.named_parameters())
    expected = _expected_params(tensors)
    assert set(params) - set(expected) == {"model.embed_tokens.weight"}  # the target's, set by the worker
    assert set(expected) <= set(params), sorted(set(expected) - set(params))
    for name, want in expected.items():
        got = params[name][: want.shape[0]]  # lm_head: vocab padding rows past the draft vocab
        assert got.dtype == torch.bfloat16 == want.dtype, name
        assert torch.equal(got, want), f"{name} differs from the export"
    assert torch.equal(model.get_hot_token_id(), tensors["d2t"] + torch.arange(DRAFT_VOCAB))


def test_sglang_mla_rope_equals_eyas_interleaved_rope():
    """DeepseekV2AttentionMLA builds its RoPE with is_neox_style = not rope_interleave (True in the
    export): SGLang's own table, applied natively, rotates q and k as eyas.model.mla does."""
    from sglang.srt.layers.rotary_embedding.factory import get_rope

    rope = get_rope(4, 4, 256, 10000.0, is_neox_style=False, dtype=torch.float32)
    torch.manual_seed(0)
    q, k = torch.randn(7, 3, 4), torch.randn(7, 1, 4)  # [T, heads, dr]
    positions = torch.arange(5, 12)
    q_sg, k_sg = rope.forward_native(positions, q.clone(), k.clone())
    cos, sin = rope_interleaved_cos_sin(positions[None], 4, 10000.0)  # [1, 1, T, dr/2]
    q_ours = apply_rope_interleaved(q.transpose(0, 1)[None], cos, sin)[0].transpose(0, 1)
    k_ours = apply_rope_interleaved(k.transpose(0, 1)[None], cos, sin)[0].transpose(0, 1)
    torch.testing.assert_close(q_sg.reshape(q.shape), q_ours)
    torch.testing.assert_close(k_sg.reshape(k.shape), k_ours)


def test_absorbed_attention_from_sglang_weights_equals_eyas_expanded_attention(exported, loaded):
    """SGLang serves MLA absorbed: scores from the latent (q_nope multiplied into it by `w_kc`) plus
    the shared rope key, outputs through `w_vc`, both split from kv_b_proj by its post_load_weights.
    Computed here from the loaded model's tensors, it equals eyas's expanded attention (reloaded from
    the same export), so the cache SGLang keeps ([kv_lora + dr] per token) serves what eyas trained."""
    export_dir, drafter = exported
    model, _ = loaded
    attn = model.model.midlayer.self_attn
    ours = load_export(export_dir, drafter.embed_tokens.weight.detach()).double().layers[0].self_attn
    cfg = drafter.config
    nh, dn, dr, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    torch.manual_seed(1)
    t = 9
    x = torch.randn(1, t, 2 * H, dtype=torch.float64)  # [1, T, 2H]
    pos = torch.arange(t)[None]
    q, k, v = ours.qkv(x, pos)  # expanded: [1, nH, T, dn + dr], [1, nH, T, dn + dr], [1, nH, T, dv]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    expanded = (
        torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~causal, float("-inf")) * attn.scaling, -1) @ v
    )

    fused = attn.fused_qkv_a_proj_with_mqa.weight.double()  # [q_lora + r + dr, 2H]
    latent, k_rope = (x @ fused.T)[..., cfg.q_lora_rank :].split([r, dr], dim=-1)  # [1, T, r], [1, T, dr]
    latent = ours.kv_a_layernorm(latent)[0]  # [T, r]: what SGLang caches, with k_rope
    cos, sin = rope_interleaved_cos_sin(pos, dr, cfg.rope_theta)
    k_rope = apply_rope_interleaved(k_rope[:, None], cos, sin)[0, 0]  # [T, dr]
    q_nope, q_rope = q[0].split([dn, dr], dim=-1)  # [nH, T, dn], [nH, T, dr] (q_rope rotated)
    w_kc, w_vc = attn.w_kc.double(), attn.w_vc.double()  # [nH, dn, r], [nH, r, dv]
    scores = (q_nope @ w_kc) @ latent.T + q_rope @ k_rope.T  # [nH, T, T]
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")) * attn.scaling, -1)
    absorbed = (probs @ latent) @ w_vc  # [nH, T, dv]
    assert w_kc.shape == (nh, dn, r) and w_vc.shape == (nh, r, cfg.v_head_dim)
    torch.testing.assert_close(absorbed, expanded[0], rtol=1e-9, atol=1e-9)
