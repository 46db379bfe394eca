"""Offline metrics over small held-out stores written in the real formats."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from eyas.core.provenance import sha256_array
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import load_embed_and_head, read_config
from eyas.store import ProvenanceError, bf16_to_uint16, hidden_store_writer, uint16_to_bf16, write_token_shard
from eyas.train.heldout import evaluate_offline
from eyas.train.loss import shift_left

AUX = [0, 1, 2]
HIDDEN = 64
LENGTHS = [9, 14, 6, 11]
PROV = {"model_id": "tiny", "layer_ids": AUX}


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_model_dir):
    """One token shard + hidden store; aux = the final state repeated per tap (lets a double be perfect).

    Returns (token shard, hidden store, loss masks, draft vocab target ids covering every teacher argmax).
    """
    root = tmp_path_factory.mktemp("offline")
    gen = np.random.default_rng(0)
    samples, masks = [], []
    for length in LENGTHS:
        ids = gen.integers(0, 49152, length).astype(np.int32)
        mask = (gen.random(length) < 0.7).astype(np.uint8)
        mask[:2] = 0
        samples.append((ids, mask))
        masks.append(mask)
    tok = root / "tokens.zarr"
    write_token_shard(tok, samples, [f"s{i}" for i in range(len(samples))], {"model_id": "tiny"})
    input_ids = np.concatenate([ids for ids, _ in samples])
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    final = bf16_to_uint16(torch.randn(int(offsets[-1]), HIDDEN, generator=torch.Generator().manual_seed(0)))
    hid = root / "hidden.zarr"
    attrs = {**PROV, "tokens_checksum": sha256_array(input_ids)}
    with hidden_store_writer(hid, offsets, HIDDEN, 3, attrs) as writer:
        for s in range(len(LENGTHS)):
            rows = final[offsets[s] : offsets[s + 1]]
            writer.write_sample(s, np.concatenate([rows] * 3, axis=1), rows)
    _, head = load_embed_and_head(tiny_model_dir)
    greedy = (uint16_to_bf16(final).float() @ head.float().T).argmax(-1)  # teacher argmax per token
    extra = torch.arange(0, 49152, 97)
    vocab = torch.unique(torch.cat([greedy, extra]))  # sorted, ascending
    return str(tok), str(hid), masks, vocab


def vocab_tensors(vocab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d2t = vocab - torch.arange(len(vocab))
    t2d = torch.zeros(49152, dtype=torch.bool)
    t2d[vocab] = True
    return d2t, t2d


class TeacherDrafter(nn.Module):
    """Returns the teacher's own logits at each step (step k at t -> teacher at t+1+k): a perfect drafter.

    With `noise`, a deterministic function of each position's state is added, so some positions go
    wrong in the same way however the samples are batched.
    """

    def __init__(self, head: torch.Tensor, vocab: torch.Tensor, noise: float = 0.0):
        super().__init__()
        self.noise = noise
        self.register_buffer(
            "mix", torch.randn(HIDDEN, len(vocab), generator=torch.Generator().manual_seed(1))
        )
        self.config = SimpleNamespace(aux_layer_ids=AUX, hidden_size=HIDDEN)
        self.anchor = nn.Parameter(torch.zeros(1))
        d2t, t2d = vocab_tensors(vocab)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self.register_buffer("rows", head[vocab].float())  # [D, H]

    def ttt_forward(self, aux, input_ids, steps):
        state = aux[..., :HIDDEN]  # [B, T, H]
        logits = state @ self.rows.T + self.noise * torch.sin(state @ self.mix)  # [B, T, D]
        return [shift_left(logits, 1 + k) for k in range(steps)]


def random_drafter(model_dir, vocab: torch.Tensor) -> Eagle3Drafter:
    torch.manual_seed(0)
    drafter = Eagle3Drafter(DrafterConfig.from_target_config(read_config(model_dir), len(vocab), AUX))
    drafter.set_vocab(*vocab_tensors(vocab))
    return drafter


def test_perfect_drafter_scores_one(stores, tiny_model_dir):
    tok, hid, masks, vocab = stores
    _, head = load_embed_and_head(tiny_model_dir)
    out = evaluate_offline(
        TeacherDrafter(head, vocab), [tok], [hid], str(tiny_model_dir), ttt_steps=3, expected_provenance=PROV
    )
    assert out["accuracy"] == [1.0, 1.0, 1.0] and out["conditional_accuracy"] == [1.0, 1.0, 1.0]
    assert out["simulated_tau"] == pytest.approx(4.0)
    # Every teacher argmax is drafted, so step k counts the trained tokens at indices >= 2 + k.
    assert out["count"] == [sum(int(m[2 + k :].sum()) for m in masks) for k in range(3)]
    assert out["num_samples"] == len(LENGTHS) and out["num_tokens"] == sum(LENGTHS)
    assert out["simulated_tau_by_k"] == pytest.approx([2.0, 3.0, 4.0])
    assert out["walked_tau_by_k"] == pytest.approx([perfect_walk_tau(masks, k) for k in (1, 2, 3)])


def perfect_walk_tau(masks: list[np.ndarray], k: int) -> float:
    """Greedy decoding with a drafter that is never wrong, walked one index at a time: a pass at t
    (token t+2 trained) accepts the drafts up to k that stay on trained tokens inside the sample."""
    emitted = passes = 0
    for mask in masks:
        t = 0
        while t + 2 < len(mask):
            if not mask[t + 2]:
                t += 1
                continue
            accepted = 0
            while accepted < k and t + 2 + accepted < len(mask) and mask[t + 2 + accepted]:
                accepted += 1
            emitted, passes, t = emitted + accepted + 1, passes + 1, t + accepted + 1
    return emitted / passes


def test_metrics_do_not_depend_on_batching(stores, tiny_model_dir):
    tok, hid, masks, vocab = stores
    _, head = load_embed_and_head(tiny_model_dir)
    drafter = TeacherDrafter(head, vocab, noise=0.2)
    runs = [
        evaluate_offline(
            drafter, [tok], [hid], str(tiny_model_dir), ttt_steps=2, expected_provenance=PROV, token_budget=b
        )
        for b in (14, 64)
    ]
    assert runs[0]["num_batches"] == len(LENGTHS) and runs[1]["num_batches"] == 1
    for name in ("count", "cond_count", "accuracy", "conditional_accuracy", "walked_tau_by_k"):
        assert runs[0][name] == runs[1][name], name
    assert runs[0]["loss"] == pytest.approx(runs[1]["loss"], rel=1e-5)
    out = runs[0]
    assert all(0.2 < a < 0.9 for a in out["accuracy"])  # the noise makes a part wrong
    assert out["cond_count"][0] == out["count"][0] and out["cond_count"][1] < out["count"][1]
    c1, c2 = out["conditional_accuracy"]
    assert out["simulated_tau"] == pytest.approx(1 + c1 + c1 * c2)


def test_untrained_drafter_runs_near_chance(stores, tiny_model_dir):
    tok, hid, _, vocab = stores
    drafter = random_drafter(tiny_model_dir, vocab)
    out = evaluate_offline(drafter, [tok], [hid], str(tiny_model_dir), ttt_steps=2, expected_provenance=PROV)
    assert out["count"][0] > 0 and out["accuracy"][0] < 0.2 and out["loss"][0] > 0
    assert 1.0 <= out["simulated_tau"] < 1.3


def test_refuses_mismatched_provenance_and_taps(stores, tiny_model_dir):
    tok, hid, _, vocab = stores
    drafter = random_drafter(tiny_model_dir, vocab)
    with pytest.raises(ProvenanceError, match="'model_id'"):
        evaluate_offline(
            drafter, [tok], [hid], str(tiny_model_dir), ttt_steps=1, expected_provenance={"model_id": "other"}
        )
    drafter.config.aux_layer_ids = [1, 2, 3]
    with pytest.raises(ProvenanceError, match="'layer_ids'"):
        evaluate_offline(drafter, [tok], [hid], str(tiny_model_dir), ttt_steps=1, expected_provenance=PROV)
