"""TTT loss: hand-computed value, mask shift, normalisation, out-of-vocab teachers, metrics, tau."""

from __future__ import annotations

import math

import pytest
import torch

from eyas.core.acceptance import simulated_tau
from eyas.train.loss import step_loss_mask, teacher_from_final, ttt_loss


def ones(t: int) -> torch.Tensor:
    return torch.ones(1, t, dtype=torch.bool)


def test_hand_made_value():
    # T=4, D=2, one step: positions t=0,1 carry loss (t+2 in {2,3} masked in); teachers at t+1.
    teacher = torch.tensor([[[9.0, 9.0], [0.0, 0.0], [math.log(3), 0.0], [5.0, -5.0]]])
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3)], [7.0, 1.0], [2.0, 2.0]]])
    loss_mask = torch.tensor([[0, 0, 1, 1]])
    loss, m = ttt_loss([logits], teacher, ones(4), loss_mask, ones(4))
    ce0 = math.log(2)  # teacher (.5, .5) vs drafter (.5, .5)
    ce1 = -(0.75 * math.log(0.25) + 0.25 * math.log(0.75))  # teacher (.75, .25) vs drafter (.25, .75)
    assert loss.item() == pytest.approx((ce0 + ce1) / 2, rel=1e-6)
    assert m["count"] == [2]
    # t=0: tie argmax (0 == 0); t=1: drafter 1 vs teacher 0.
    assert m["acc"] == [0.5]


def test_mask_is_shifted_with_target():
    t = 6
    loss_mask = torch.zeros(1, t, dtype=torch.long)
    loss_mask[0, 4] = 1  # only token 4 is trained
    m0 = step_loss_mask(loss_mask, ones(t), ones(t), 0)
    m1 = step_loss_mask(loss_mask, ones(t), ones(t), 1)
    assert m0[0].nonzero().flatten().tolist() == [2]  # step 0 at t predicts t+2
    assert m1[0].nonzero().flatten().tolist() == [1]  # step 1 at t predicts t+3

    torch.manual_seed(0)
    teacher = torch.randn(1, t, 5)
    logits = [torch.randn(1, t, 5), torch.randn(1, t, 5)]
    base, _ = ttt_loss(logits, teacher, ones(t), loss_mask, ones(t))
    moved = [x.clone() for x in logits]
    moved[0][0, 4, 0] += 10.0  # index 4 (where the mask itself is 1) carries no loss at step 0
    moved[1][0, 2, 0] += 10.0
    same, _ = ttt_loss(moved, teacher, ones(t), loss_mask, ones(t))
    assert same.item() == base.item()
    moved[0][0, 2, 0] += 10.0
    changed, _ = ttt_loss(moved, teacher, ones(t), loss_mask, ones(t))
    assert changed.item() != base.item()


def test_masked_positions_get_no_gradient_and_normalisation_by_count():
    torch.manual_seed(1)
    t = 8
    teacher = torch.randn(2, t, 4)
    logits = torch.randn(2, t, 4, requires_grad=True)
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0], [0] * 8])
    valid = torch.ones(2, t, dtype=torch.bool)
    loss, m = ttt_loss([logits], teacher, torch.ones(2, t, dtype=torch.bool), loss_mask, valid)
    loss.backward()
    grad_rows = logits.grad.abs().sum(-1).nonzero().tolist()
    assert grad_rows == [[0, 1], [0, 2], [0, 3]] and m["count"] == [3]
    # Same first row alone: the all-masked second row must not dilute the mean.
    alone, _ = ttt_loss(
        [logits[:1].detach()], teacher[:1], torch.ones(1, t, dtype=torch.bool), loss_mask[:1], valid[:1]
    )
    assert alone.item() == pytest.approx(loss.item(), rel=1e-6)


def test_padding_and_out_of_vocab_carry_no_loss():
    t = 6
    loss_mask = torch.ones(1, t, dtype=torch.long)
    valid = torch.tensor([[1, 1, 1, 1, 0, 0]], dtype=torch.bool)  # sample length 4
    in_vocab = torch.tensor([[1, 1, 0, 1, 1, 1]], dtype=torch.bool)  # greedy token at index 2 not drafted
    mask = step_loss_mask(loss_mask, valid, in_vocab, 0)
    # t=0 (target 2, teacher 1): ok; t=1 (teacher 2) OOV; t=2 would predict 4 = padding.
    assert mask[0].nonzero().flatten().tolist() == [0]
    assert step_loss_mask(loss_mask, valid, in_vocab, 2).sum() == 0  # t+4 >= length 4
    _, m = ttt_loss([torch.zeros(1, t, 3)] * 3, torch.zeros(1, t, 3), in_vocab, loss_mask, valid)
    assert m["count"] == [1, 0, 0] and m["loss"][1] == 0.0


def test_step_weights_and_conditional_accuracy():
    t, d = 5, 3
    teacher = torch.zeros(1, t, d)
    teacher[..., 0] = 5.0  # teacher argmax is always draft id 0
    right = torch.zeros(1, t, d)
    right[..., 0] = 5.0
    wrong = torch.zeros(1, t, d)
    wrong[..., 1] = 5.0
    step1 = right.clone()
    step1[0, 1] = wrong[0, 1]  # step 1 wrong at index 1
    step0 = right.clone()
    step0[0, 0] = wrong[0, 0]  # step 0 wrong at index 0
    lm = torch.ones(1, t, dtype=torch.long)
    loss, m = ttt_loss([step0, step1], teacher, ones(t), lm, ones(t), step_weight=0.5)
    assert m["count"] == [3, 2]  # step 0: t in 0..2; step 1: t in 0..1
    assert m["acc"] == pytest.approx([2 / 3, 1 / 2])
    assert m["cond_count"] == [3, 1]  # index 0 fails step 0, so only index 1 conditions step 1
    assert m["cond_acc"] == pytest.approx([2 / 3, 0.0])
    # index 0 fails step 0; index 1 passes step 0 only; index 2's step 1 would predict past the end
    assert m["accept_run"].tolist() == [[0, 1, 1, 0, 0]]
    assert loss.item() == pytest.approx(m["loss"][0] + 0.5 * m["loss"][1], rel=1e-6)


def test_teacher_from_final_matches_full_logits():
    torch.manual_seed(2)
    v, h = 50, 8
    final = torch.randn(2, 7, h)
    head = torch.randn(v, h)
    draft_ids = torch.tensor([1, 4, 9, 20, 33])
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft_ids] = True
    teacher, in_vocab = teacher_from_final(final, head, draft_ids, t2d, chunk=3)
    full = final @ head.T  # [B, T, V]
    torch.testing.assert_close(teacher, full[..., draft_ids])
    assert torch.equal(in_vocab, t2d[full.argmax(-1)])


def test_simulated_tau():
    assert simulated_tau([]) == 1.0
    assert simulated_tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert simulated_tau([1.0] * 7) == 8.0


@pytest.mark.parametrize("chunk", [3, 1024])
@pytest.mark.parametrize("cached_teacher", [False, True])
def test_chunked_loss_equals_reference_path(chunk, cached_teacher):
    """ttt_loss_chunked (logits and teacher per block of rows, gradients in forward) == ttt_loss over
    full [B, T, D] logits and teacher_from_final: loss, metrics and gradients."""
    from eyas.train.loss import step_counts, teacher_in_vocab, ttt_loss_chunked

    torch.manual_seed(5)
    b, t, h, v, steps = 2, 9, 8, 50, 3
    draft_ids = torch.tensor([1, 4, 9, 20, 33, 41])
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft_ids] = True
    head = torch.randn(v, h)
    head[draft_ids] *= 3  # most greedy tokens inside the draft vocab
    final = torch.randn(b, t, h)
    norm = torch.nn.RMSNorm(h, eps=1e-5)
    weight = torch.randn(len(draft_ids), h, requires_grad=True)
    hidden0 = torch.randn(steps, b, t, h, requires_grad=True)
    loss_mask = (torch.rand(b, t) > 0.3).long()
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 6:] = False

    teacher, in_vocab = teacher_from_final(final, head, draft_ids, t2d)
    logits = [norm(hidden0[k]) @ weight.T for k in range(steps)]
    want, wm = ttt_loss(logits, teacher, in_vocab, loss_mask, valid)
    want.backward()
    want_grads = (hidden0.grad.clone(), weight.grad.clone(), norm.weight.grad.clone())
    for p in (hidden0, weight, norm.weight):
        p.grad = None

    got_in_vocab = teacher_in_vocab(final, head, t2d, chunk=4)
    assert torch.equal(got_in_vocab, in_vocab)
    assert step_counts(loss_mask, valid, in_vocab, steps) == wm["count"]
    cached = final @ head[draft_ids].T if cached_teacher else None  # [B, T, D]
    got, gm = ttt_loss_chunked(
        list(hidden0),
        norm,
        weight,
        final,
        head[draft_ids],
        in_vocab,
        loss_mask,
        valid,
        chunk=chunk,
        teacher_logits=cached,
    )
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for key in ("count", "cond_count"):
        assert gm[key] == wm[key], key
    for key in ("loss", "acc", "cond_acc"):
        assert gm[key] == pytest.approx(wm[key], rel=1e-5), key
    assert min(wm["count"]) > 0 and 0 < wm["acc"][0] < 1
    for g, w in zip((hidden0.grad, weight.grad, norm.weight.grad), want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
