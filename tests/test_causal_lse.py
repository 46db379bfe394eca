"""The TTT step's attention by causal flash attention plus a log-sum-exp merge (`train.tree_attention:
lse`, eyas.model.causal_lse) equals the masked form (`eyas.model.drafter.tree_attention`): values and the
gradients of every input, the log-sum-exp's own gradient folded into the flash kernel's backward."""

from __future__ import annotations

import math

import pytest
import torch
from modelkit import tiny_drafter_config

from eyas.model.causal_lse import CausalWithLse, supported, tree_attention_lse
from eyas.model.drafter import Eagle3Drafter, tree_attention


def _grads(fn, tensors, weights):
    for t in tensors:
        t.grad = None
    out = fn(*tensors)
    (out * weights).sum().backward()
    return out.detach(), [None if t.grad is None or not t.grad.numel() else t.grad.clone() for t in tensors]


@pytest.mark.parametrize("steps", [0, 1, 3, 6])
def test_lse_form_equals_the_masked_form_with_gradients(steps):
    torch.manual_seed(steps)
    b, h, t, hd = 2, 3, 45, 16
    tensors = [torch.randn(b, h, t, hd, requires_grad=True) for _ in range(3)]
    tensors += [torch.randn(b, h, t, steps, hd, requires_grad=True) for _ in range(2)]
    weights = torch.randn(b, h, t, hd)
    want, want_grads = _grads(tree_attention, tensors, weights)
    got, got_grads = _grads(tree_attention_lse, tensors, weights)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for name, g, w in zip(["q", "k0", "v0", "k_diag", "v_diag"], got_grads, want_grads, strict=True):
        if w is None:
            assert g is None, name
        else:
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=name)


def _causal_reference(q, k, v):
    """(out, lse) of causal attention written out: [B, h, T, hd], [B, h, T]."""
    t = q.shape[2]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def test_causal_attention_returns_its_log_sum_exp_with_its_gradient():
    torch.manual_seed(0)
    inputs = [torch.randn(1, 2, 30, 8, dtype=torch.float64) for _ in range(3)]
    grad_out, grad_lse = (
        torch.randn(1, 2, 30, 8, dtype=torch.float64),
        torch.randn(1, 2, 30, dtype=torch.float64),
    )
    results = {}
    for name, dtype in (("reference", torch.float64), ("flash", torch.float32)):
        leaves = [x.detach().clone().to(dtype).requires_grad_() for x in inputs]
        if name == "reference":
            out, lse = _causal_reference(*leaves)
        else:
            out, lse = CausalWithLse.apply(*leaves, 1 / math.sqrt(8))
        ((out.double() * grad_out).sum() + (lse.double() * grad_lse).sum()).backward()
        results[name] = [out.detach().double(), lse.detach().double()] + [x.grad.double() for x in leaves]
    for what, got, want in zip(
        ["out", "lse", "dq", "dk", "dv"], results["flash"], results["reference"], strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=what)


def test_only_equal_head_sizes_and_flash_dtypes_take_the_lse_form():
    q = torch.zeros(1, 1, 4, 16)
    assert supported(q, torch.zeros(1, 1, 4, 2, 16))
    assert not supported(q, torch.zeros(1, 1, 4, 2, 12))  # MLA: values narrower than keys
    assert not supported(
        torch.zeros(1, 1, 4, 12), torch.zeros(1, 1, 4, 2, 12)
    )  # head size not a multiple of 8
    assert not supported(q.double(), torch.zeros(1, 1, 4, 2, 16).double())


def test_the_drafters_ttt_unroll_is_the_same_with_either_form():
    torch.manual_seed(0)
    drafter = Eagle3Drafter(tiny_drafter_config())
    hidden, vocab = drafter.config.hidden_size, drafter.config.vocab_size
    aux, ids = torch.randn(2, 20, 3 * hidden), torch.randint(0, vocab, (2, 20))
    outs = {}
    for impl in ("masked", "lse"):
        drafter.attention_impl = impl
        drafter.zero_grad()
        hidden = drafter.ttt_hidden(aux, ids, 4)
        sum(h.square().sum() for h in hidden).backward()
        outs[impl] = [h.detach() for h in hidden] + [
            p.grad.clone() for p in drafter.parameters() if p.grad is not None
        ]
    for got, want in zip(outs["lse"], outs["masked"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
