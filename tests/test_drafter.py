"""Drafter: TTT unroll == serving chain with a KV cache, tree mask, save/load, config parsing."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from modelkit import tiny_drafter_config

from eyas.model import drafter as drafter_module
from eyas.model.drafter import DrafterCache, DrafterConfig, Eagle3Drafter, tree_attention

torch.set_num_threads(1)


tiny_config = tiny_drafter_config  # the name the drafter tests use


MLA_LAYER = dict(
    attention="mla",
    num_key_value_heads=4,
    head_dim=12,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
)
LAYERS = {
    "llama": {},
    "mla": MLA_LAYER,
    "mla_eagle3.1": {**MLA_LAYER, "fc_norm": True, "norm_output": True},
}


@pytest.fixture(params=list(LAYERS))
def drafter(request) -> Eagle3Drafter:
    """The drafter with each decoder layer (`attention`: llama, mla, mla with the EAGLE-3.1 options):
    the TTT, cache, padding and gradient tests hold for every one."""
    torch.manual_seed(0)
    model = Eagle3Drafter(tiny_config(**LAYERS[request.param])).eval()
    # Larger weights than the 0.02 init so attention patterns and the residual path matter.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_param_names_match_sglang(drafter):
    if drafter.config.attention != "llama":
        pytest.skip("the MLA names are checked against SGLang's class: tests/sglang/test_export_mla.py")
    names = set(drafter.state_dict())
    expected = {
        "embed_tokens.weight",
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
    }
    assert names == expected
    assert drafter.layers[0].self_attn.q_proj.weight.shape == (4 * 8, 64)  # q reads 2H
    assert drafter.fc.weight.shape == (32, 96)
    assert not drafter.embed_tokens.weight.requires_grad


@pytest.mark.parametrize("t_index", [0, 3, 6])
def test_chain_with_cache_reproduces_ttt(drafter, t_index):
    steps, seq = 4, 12
    torch.manual_seed(1)
    aux = torch.randn(1, seq, 96)
    ids = torch.randint(0, 100, (1, seq))
    with torch.no_grad():
        ttt = drafter.ttt_forward(aux, ids, steps)
        cache = DrafterCache()
        # Step 0: prefill positions 0..t with the fused target taps and ids shifted by one.
        pos = torch.arange(t_index + 1)[None]
        logits, hidden = drafter.forward_step(
            drafter.combine_taps(aux[:, : t_index + 1]), ids[:, 1 : t_index + 2], pos, cache
        )
        torch.testing.assert_close(logits[0, t_index], ttt[0][0, t_index], atol=1e-5, rtol=1e-5)
        h = hidden[:, -1:]
        for k in range(1, steps):
            # Step k feeds back its own hidden, embeds x_{t+1+k}, sits at position t+k.
            logits, h = drafter.forward_step(
                h, ids[:, t_index + 1 + k : t_index + 2 + k], torch.tensor([[t_index + k]]), cache
            )
            torch.testing.assert_close(logits[0, 0], ttt[k][0, t_index], atol=1e-5, rtol=1e-5)
        assert cache.length == t_index + steps


def test_ttt_step_k_does_not_see_future_or_other_indices(drafter):
    """Changing aux at index > t must not change any step's logits at index t (causal tree)."""
    torch.manual_seed(2)
    aux = torch.randn(1, 10, 96)
    ids = torch.randint(0, 100, (1, 10))
    with torch.no_grad():
        a = drafter.ttt_forward(aux, ids, 3)
        aux2 = aux.clone()
        aux2[:, 6:] += 5.0
        b = drafter.ttt_forward(aux2, ids, 3)
    for k in range(3):
        torch.testing.assert_close(a[k][:, :6], b[k][:, :6])
        assert not torch.allclose(a[k][:, 6:], b[k][:, 6:])


def test_ttt_rows_independent_of_padding(drafter):
    """A right-padded row gives the same logits on its real positions as when run alone."""
    torch.manual_seed(3)
    aux = torch.randn(2, 9, 96)
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        batch = drafter.ttt_forward(aux, ids, 2)
        alone = drafter.ttt_forward(aux[1:, :5], ids[1:, :5], 2)
    # Step k at index t uses ids up to t+1+k: compare indices whose inputs lie inside the short row.
    for k in range(2):
        n = 5 - 1 - k
        torch.testing.assert_close(batch[k][1, :n], alone[k][0, :n], atol=1e-5, rtol=1e-5)


def test_tree_attention_matches_dense_mask():
    torch.manual_seed(4)
    b, h, t, d, k = 1, 2, 7, 4, 3
    q, k0, v0 = (torch.randn(b, h, t, d) for _ in range(3))
    kd, vd = torch.randn(b, h, t, k, d), torch.randn(b, h, t, k, d)
    got = tree_attention(q, k0, v0, kd, vd)
    keys = torch.cat([k0, kd.permute(0, 1, 3, 2, 4).reshape(b, h, k * t, d)], dim=2)  # [B, h, (k+1)T, d]
    values = torch.cat([v0, vd.permute(0, 1, 3, 2, 4).reshape(b, h, k * t, d)], dim=2)
    mask = torch.zeros(t, (k + 1) * t, dtype=torch.bool)
    mask[:, :t] = torch.ones(t, t).tril().bool()
    for j in range(k):
        mask[:, t * (j + 1) : t * (j + 2)] = torch.eye(t, dtype=torch.bool)
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_ttt_gradients_flow_and_embedding_frozen(drafter):
    drafter.train()
    aux = torch.randn(1, 8, 96)
    ids = torch.randint(0, 100, (1, 8))
    loss = sum(x.logsumexp(-1).sum() for x in drafter.ttt_forward(aux, ids, 3))
    loss.backward()
    assert drafter.embed_tokens.weight.grad is None
    assert drafter.fc.weight.grad.abs().sum() > 0
    assert drafter.layers[0].hidden_norm.weight.grad.abs().sum() > 0


def test_cache_crop():
    cache = DrafterCache()
    cache.append(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))
    cache.crop(3)
    assert cache.length == 3 and cache.value.shape[2] == 3
    with pytest.raises(ValueError):
        cache.crop(4)


def test_vocab_mapping(drafter):
    d2t = torch.zeros(40, dtype=torch.int64)
    d2t[20:] = 50  # draft ids 20..39 -> target ids 70..89
    t2d = torch.zeros(100, dtype=torch.bool)
    t2d[torch.arange(40) + d2t] = True
    drafter.set_vocab(d2t, t2d)
    assert drafter.draft_to_target(torch.tensor([0, 19, 20, 39])).tolist() == [0, 19, 70, 89]
    t2d[0] = False
    with pytest.raises(ValueError, match="disagree"):
        drafter.set_vocab(d2t, t2d)


def test_save_load_round_trip(drafter, tmp_path):
    drafter.save_pretrained(tmp_path / "d", extra_config={"model_hash": "abc"})
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["model_hash"] == "abc" and cfg["draft_vocab_size"] == 40
    loaded = Eagle3Drafter.from_pretrained(tmp_path / "d")
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    with pytest.raises(ValueError, match="override"):
        drafter.save_pretrained(tmp_path / "e", extra_config={"vocab_size": 3})


def test_from_target_config_reads_rope_parameters():
    target = {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "vocab_size": 49152,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    }
    cfg = DrafterConfig.from_target_config(target, draft_vocab_size=8192, aux_layer_ids=[1, 14, 26])
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None and cfg.num_key_value_heads == 3
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
    target["rope_parameters"] = {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="rope_scaling"):
        DrafterConfig.from_target_config(target, draft_vocab_size=8192, aux_layer_ids=[1, 14, 26])
    with pytest.raises(ValueError, match="unknown"):
        DrafterConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    target["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    wide = DrafterConfig.from_target_config(target, 8192, [1, 14, 26], intermediate_size=6144)
    assert wide.intermediate_size == 6144 and cfg.intermediate_size == 1536  # null keeps the target's
    assert dataclasses.replace(wide, intermediate_size=1536) == cfg


def reference_tree_attention(q, k0, v0, k_diag, v_diag):
    """The first trainer's implementation (fp32 scores per 1024-query block, joint softmax)."""
    import math

    scale = 1.0 / math.sqrt(q.shape[-1])
    t_len = q.shape[2]
    outs = []
    for lo in range(0, t_len, 1024):
        hi = min(t_len, lo + 1024)
        qc = q[:, :, lo:hi].float()
        causal = qc @ k0[:, :, :hi].float().transpose(-1, -2) * scale
        rows = torch.arange(lo, hi)[:, None]
        causal = causal.masked_fill(torch.arange(hi)[None, :] > rows, float("-inf"))
        diag = (qc[..., None, :] * k_diag[:, :, lo:hi].float()).sum(-1) * scale
        probs = torch.cat([causal, diag], dim=-1).softmax(-1)
        out = probs[..., :hi] @ v0[:, :, :hi].float()
        out = out + (probs[..., hi:, None] * v_diag[:, :, lo:hi].float()).sum(-2)
        outs.append(out.to(q.dtype))
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_sdpa_tree_attention_equals_reference_forward_and_backward(chunk, recompute, monkeypatch):
    if recompute:  # every chunk checkpointed, as for long samples
        monkeypatch.setattr(drafter_module, "CHECKPOINT_BYTES", 0)
    torch.manual_seed(6)
    b, h, t, d, k = 2, 2, 11, 4, 3
    args = [torch.randn(b, h, t, d) for _ in range(3)] + [torch.randn(b, h, t, k, d) for _ in range(2)]
    args = [a.requires_grad_() for a in args]
    want = reference_tree_attention(*args)
    grads_want = torch.autograd.grad(want.square().sum(), args)
    got = tree_attention(*args, chunk=chunk)  # SDPA chunks (grad enabled)
    grads_got = torch.autograd.grad(got.square().sum(), args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_mlp_recompute_gives_the_same_loss_and_gradients(drafter):
    """Checkpointing each TTT step's MLP block changes memory, not results (bitwise on CPU)."""
    torch.manual_seed(3)
    aux, ids = torch.randn(2, 10, 96), torch.randint(0, 100, (2, 10))
    results = []
    for recompute in (False, True):
        drafter.zero_grad(set_to_none=True)
        hidden = drafter.ttt_hidden(aux, ids, 3, recompute_mlp=recompute)
        loss = sum((h.float() ** 2).mean() * (0.8**k) for k, h in enumerate(hidden))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b) and grads_a.keys() == grads_b.keys() and len(grads_a) > 5
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_mlp_recompute_rule():
    from eyas.model.drafter import mlp_recompute_needed

    quarter_h200 = 139.8 * 2**30 / 4
    assert not mlp_recompute_needed(4 * 4096, 14336, 7, 2, quarter_h200)  # 13.2 GB kept
    assert mlp_recompute_needed(65536, 14336, 7, 2, quarter_h200)  # 52.6 GB recomputed
    assert not mlp_recompute_needed(10**9, 14336, 7, 4, float("inf"))  # CPU: never
