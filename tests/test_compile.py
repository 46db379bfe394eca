"""train.compile: the compiled TTT steps, tree-attention merge and loss blocks train exactly as eager."""

from __future__ import annotations

import csv
import dataclasses
import functools

import numpy as np
import torch
from modelkit import tiny_drafter_config
from trainkit import run, settings

from eyas.model.drafter import Eagle3Drafter
from eyas.train.loss import teacher_in_vocab
from eyas.train.parallel import Objective


def batch_of(rows: int, length: int, h: int, vocab: int, seed: int):
    """A right-padded batch as the loader hands it over (last row shorter), and its draft-vocab head."""
    from eyas.train.loader import Batch

    g = torch.Generator().manual_seed(seed)
    valid = torch.ones(rows, length, dtype=torch.bool)
    valid[-1, length - 3 :] = False
    return Batch(
        input_ids=torch.randint(0, vocab, (rows, length), generator=g),
        aux=torch.randn(rows, length, 3 * h, generator=g),
        final=torch.randn(rows, length, h, generator=g),
        loss_mask=(torch.rand(rows, length, generator=g) > 0.2).long() * valid,
        valid=valid,
        lengths=valid.sum(1),
    )


def step_of(drafter: Eagle3Drafter, batch, head: torch.Tensor, cached: bool) -> tuple[float, torch.Tensor]:
    """One micro-batch's loss and the drafter's flat gradient, as `step.micro_backward` runs it."""
    steps = 3
    draft_head = head[torch.arange(drafter.config.draft_vocab_size) + drafter.d2t]  # [D, H]
    in_vocab = teacher_in_vocab(batch.final, head, drafter.t2d)
    teacher = batch.final @ draft_head.T if cached else None  # [B, T, D]
    drafter.zero_grad(set_to_none=True)
    loss, _ = Objective(drafter)(
        batch, in_vocab, draft_head, steps=steps, step_weight=0.8, counts=None,
        teacher_logits=teacher, recompute_mlp=False,
    )  # fmt: skip
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in drafter.parameters() if p.grad is not None])
    return float(loss.detach()), grads


def test_compiled_training_step_equals_eager():
    """Loss and gradients of the compiled drafter match eager ones on batches of two shapes (one
    compilation serves both: dynamic shapes), with the teacher cached and computed per block."""
    config = tiny_drafter_config()
    torch.manual_seed(0)
    eager = Eagle3Drafter(config)
    eager.attention_impl = "lse"
    compiled = Eagle3Drafter(config)
    compiled.load_state_dict(eager.state_dict())
    compiled.attention_impl = "lse"
    compiled.compile_steps()
    head = torch.randn(config.vocab_size, config.hidden_size)
    head[: config.draft_vocab_size] *= 3  # most greedy tokens inside the draft vocab
    for seed, (rows, length, cached) in enumerate([(2, 11, True), (3, 7, False), (2, 13, True)]):
        batch = batch_of(rows, length, config.hidden_size, config.vocab_size, seed)
        want_loss, want_grads = step_of(eager, batch, head, cached)
        got_loss, got_grads = step_of(compiled, batch, head, cached)
        assert abs(got_loss - want_loss) <= 1e-5 * abs(want_loss), (rows, length)
        assert (got_grads - want_grads).norm() <= 1e-4 * want_grads.norm(), (rows, length)
        assert want_grads.norm() > 0


def test_compiled_training_run_follows_the_eager_loss_curve(data, tmp_path):
    """A whole `train` run with train.compile (held-out evaluation, checkpoints, the drafter's export)
    logs the eager run's loss curve, and its drafter reloads. Its stats count what dynamo compiled
    and report nothing it gave up on (a recompile-limit fallback to eager would be listed)."""
    base = settings(max_steps=8, checkpoint_every=4, select_by_tau=True, epochs=2, tree_attention="lse")
    torch._dynamo.reset()  # compiled from empty caches, whatever compiled earlier in this process
    curves, stats = [], {}
    for name, compile_steps in (("eager", False), ("compiled", True)):
        variant = dataclasses.replace(base, compile=compile_steps)
        stats[name] = run(data, tmp_path / name, variant, heldout=True)
        with open(tmp_path / name / "log.csv") as fh:
            curves.append([float(r["loss"]) for r in csv.DictReader(fh)])
    assert len(curves[0]) == 8
    assert "compile" not in stats["eager"]
    counted = stats["compiled"]["compile"]
    assert counted["frames"].get("ok", 0) >= 1, counted  # its drafter's steps compile
    assert counted["unimplemented"] == {} and counted["graph_breaks"] == 0, counted
    # every graph inductor compiled was looked up in its cache: a hit, a miss or a bypass, counted
    assert sum(n for name, n in counted["caches"].items() if name.startswith("fxgraph_cache_")) >= 1, counted
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-4)
    Eagle3Drafter.from_pretrained(tmp_path / "compiled" / "drafter")


def test_new_batch_shapes_reuse_the_compiled_graphs(monkeypatch):
    """Dynamic shapes: once the compiled drafter has seen a one-row and a many-row batch (sizes 0 and 1
    specialise), batches of other rows and lengths compile nothing new. The pipeline's batches change
    shape every step; a function past dynamo's recompile limit would run eager from then on. Dynamo's
    guards decide this whatever the backend, so the test compiles with the `eager` backend (fast)."""
    from torch._dynamo.utils import counters

    from eyas.model import compiled

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    compiled.compiled.cache_clear()  # the loss blocks' wrappers, made again under the eager backend
    try:
        config = tiny_drafter_config()
        torch.manual_seed(0)
        drafter = Eagle3Drafter(config)
        drafter.attention_impl = "lse"
        drafter.compile_steps()
        head = torch.randn(config.vocab_size, config.hidden_size)

        def graphs_after(shapes: list[tuple[int, int]], seed: int) -> int:
            for i, (rows, length) in enumerate(shapes):
                step_of(
                    drafter,
                    batch_of(rows, length, config.hidden_size, config.vocab_size, seed + i),
                    head,
                    True,
                )
            return counters["stats"]["unique_graphs"]

        first = graphs_after([(1, 9), (3, 7), (2, 13)], 0)
        later = graphs_after([(4, 5), (1, 17), (5, 11), (2, 6), (1, 8), (3, 15), (6, 4)], 10)
        assert first > 0 and later == first
    finally:  # later tests compile with the real backend again, from empty caches
        compiled.compiled.cache_clear()
        torch._dynamo.reset()
