"""Loader and trainer on a tiny real target: stores made from the tiny Llama's own greedy text."""

from __future__ import annotations

import csv
import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from eyas.config import TrainSettings
from eyas.model.drafter import Eagle3Drafter
from eyas.provenance import LAYER_ID_CONVENTION, model_hash, sha256_array
from eyas.store import ProvenanceError, hidden_store_writer, read_token_shard, write_token_shard
from eyas.train import trainer as trainer_mod
from eyas.train.loader import PairedLoader
from eyas.train.trainer import lr_factor, train
from eyas.vocab import build_draft_vocab, save_draft_vocab

torch.set_num_threads(1)
LAYERS = [0, 1, 2]


@pytest.fixture(scope="module")
def sharp_target(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny Llama with its (tied) embedding scaled up, so the teacher is peaked, not uniform."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(tiny_model_dir))
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(40.0)
    out = tmp_path_factory.mktemp("sharp_target")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def data(sharp_target, tmp_path_factory):
    """Two (token shard, hidden store) pairs of greedy continuations + a draft vocab."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("train_data")
    model = LlamaForCausalLM.from_pretrained(str(sharp_target)).eval()
    mhash = model_hash(sharp_target)
    prov = {"model_id": "tiny", "tokenizer_hash": "tok", "chat_template_hash": "tpl"}
    rng = np.random.default_rng(0)
    shards, stores = [], []
    for shard_index in range(2):
        samples = []
        for _ in range(5):
            prompt = torch.as_tensor(rng.integers(0, 49152, 4))[None]
            with torch.no_grad():
                ids = model.generate(prompt, max_new_tokens=int(rng.integers(16, 28)), do_sample=False)[0]
            mask = np.r_[np.zeros(4), np.ones(len(ids) - 4)].astype(np.uint8)
            samples.append((ids.numpy().astype(np.int32), mask))
        tok_path = root / f"tok-{shard_index}.zarr"
        write_token_shard(tok_path, samples, [f"s{i}" for i in range(5)], prov)
        shard = read_token_shard(tok_path)
        hid_path = root / f"hid-{shard_index}.zarr"
        attrs = {
            **prov,
            "model_hash": mhash,
            "layer_ids": LAYERS,
            "layer_id_convention": LAYER_ID_CONVENTION,
            "tokens_checksum": sha256_array(shard.input_ids),
        }
        with hidden_store_writer(hid_path, shard.sample_offsets, 64, 3, attrs) as writer:
            for s in range(shard.num_samples):
                ids, _ = shard.sample(s)
                with torch.no_grad():
                    out = model(torch.as_tensor(ids, dtype=torch.long)[None], output_hidden_states=True)
                aux = torch.cat([out.hidden_states[v + 1][0] for v in LAYERS], dim=-1)
                writer.write_sample(s, bf16(aux), bf16(out.hidden_states[-1][0]))
        shards.append(str(tok_path))
        stores.append(str(hid_path))
    d2t, t2d, stats = build_draft_vocab(shards, 49152, 64)
    vocab = root / "vocab.safetensors"
    save_draft_vocab(vocab, d2t, t2d, stats, tokenizer_hash="tok")
    expected = {"model_hash": mhash, "layer_ids": LAYERS, "tokenizer_hash": "tok", "model_id": "tiny"}
    return {
        "shards": shards,
        "stores": stores,
        "vocab": str(vocab),
        "expected": expected,
        "model": str(sharp_target),
    }


def bf16(x: torch.Tensor) -> np.ndarray:
    from eyas.store import bf16_to_uint16

    return bf16_to_uint16(x)


def settings(**overrides) -> TrainSettings:
    base = dict(
        epochs=20,
        max_steps=None,
        lr=3e-3,
        warmup_steps=2,
        weight_decay=0.0,
        grad_clip=1.0,
        token_budget=64,
        ttt_steps=3,
        step_weight=0.8,
        seed=0,
        device="cpu",
        dtype="float32",
        checkpoint_every=2,
        draft_vocab_size=64,
        threads=1,
        progress=False,
        select_by_tau=False,
    )
    base.update(overrides)
    return TrainSettings(**base)


def inputs(data, out: Path, heldout: bool = False) -> dict:
    """Keyword arguments of `train` (JSON-able, also the CLI spec's `inputs`)."""
    return dict(
        token_shards=data["shards"],
        hidden_stores=data["stores"],
        vocab_path=data["vocab"],
        model_dir=data["model"],
        out_dir=str(out / "drafter"),
        log_path=str(out / "log.csv"),
        expected_provenance=data["expected"],
        heldout={"token_shards": data["shards"][1:], "hidden_stores": data["stores"][1:]}
        if heldout
        else None,
    )


def run(data, out: Path, s: TrainSettings, heldout: bool = False) -> dict:
    return train(s, **inputs(data, out, heldout))


def test_loader_plan_is_deterministic_and_within_budget(data):
    loader = PairedLoader(data["shards"], data["stores"], 64, seed=3, expected=data["expected"], prefetch=0)
    plan0 = loader.plan(0)
    assert [b.tolist() for b in plan0] == [b.tolist() for b in loader.plan(0)]
    assert [b.tolist() for b in plan0] != [b.tolist() for b in loader.plan(1)]
    assert sorted(np.concatenate(plan0).tolist()) == list(range(10))  # every sample once per epoch
    for rows in plan0:
        assert len(rows) == 1 or len(rows) * loader.samples[rows, 2].max() <= 64
    prefetched = list(PairedLoader(data["shards"], data["stores"], 64, 3, data["expected"]).epoch(0, skip=1))
    plain = list(loader.epoch(0))[1:]
    assert len(prefetched) == len(plain)
    for a, b in zip(prefetched, plain, strict=True):
        assert torch.equal(a.aux, b.aux) and torch.equal(a.input_ids, b.input_ids)
        assert a.aux.shape[-1] == 3 * 64 and bool((a.input_ids[~a.valid] == 0).all())


def test_loader_refuses_mismatched_pairs(data):
    with pytest.raises(ProvenanceError, match="model_hash"):
        PairedLoader(data["shards"], data["stores"], 64, 0, {**data["expected"], "model_hash": "other"})
    with pytest.raises(ProvenanceError, match="sample_offsets|tokens_checksum"):
        PairedLoader(data["shards"][::-1], data["stores"], 64, 0, data["expected"])


def test_training_reduces_loss_and_writes_outputs(data, tmp_path):
    stats = run(data, tmp_path, settings(max_steps=40, checkpoint_every=0))
    with open(tmp_path / "log.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 40 == stats["steps"]
    losses = [float(r["loss"]) for r in rows]
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    assert float(rows[-1]["acc_0"]) > float(rows[0]["acc_0"])
    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert cfg["layer_ids"] == LAYERS and cfg["model_hash"] == data["expected"]["model_hash"]
    assert cfg["draft_vocab_size"] == 64 and "draft_vocab_hash" in cfg
    assert (tmp_path / "drafter" / "train_state.pt").exists()
    assert not (tmp_path / "drafter-checkpoint").exists() and not (tmp_path / "log.csv.partial").exists()
    Eagle3Drafter.from_pretrained(tmp_path / "drafter")
    assert stats["tokens"] > 0 and stats["tokens_per_s"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16 autocast: the CPU default with native bf16
def test_resume_after_crash_matches_uninterrupted_run(data, tmp_path, monkeypatch, dtype):
    s = settings(max_steps=5, epochs=3, dtype=dtype)
    run(data, tmp_path / "a", s)

    def crash(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer_mod, "_after_step", crash)
    with pytest.raises(KeyboardInterrupt):
        run(data, tmp_path / "b", s)
    ckpt = tmp_path / "b" / "drafter-checkpoint"
    state = torch.load(ckpt / "train_state.pt", weights_only=True)
    assert state["step"] == 2
    # The checkpoint's weights reload exactly.
    reloaded = Eagle3Drafter.from_pretrained(ckpt)
    reloaded.save_pretrained(tmp_path / "copy")
    again = Eagle3Drafter.from_pretrained(tmp_path / "copy")
    for name, t in reloaded.state_dict().items():
        assert torch.equal(t, again.state_dict()[name])
    monkeypatch.setattr(trainer_mod, "_after_step", lambda step: None)
    stats = run(data, tmp_path / "b", s)
    assert stats["resumed_from_step"] == 2 and stats["steps"] == 5
    a = Eagle3Drafter.from_pretrained(tmp_path / "a" / "drafter").state_dict()
    b = Eagle3Drafter.from_pretrained(tmp_path / "b" / "drafter").state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    with open(tmp_path / "b" / "log.csv") as fh:
        assert [int(r["step"]) for r in csv.DictReader(fh)] == [1, 2, 3, 4, 5]


def test_changed_settings_do_not_resume(data, tmp_path, monkeypatch):
    monkeypatch.setattr(
        trainer_mod,
        "_after_step",
        lambda step: (_ for _ in ()).throw(KeyboardInterrupt) if step == 3 else None,
    )
    with pytest.raises(KeyboardInterrupt):
        run(data, tmp_path, settings(max_steps=4))
    monkeypatch.setattr(trainer_mod, "_after_step", lambda step: None)
    stats = run(data, tmp_path, settings(max_steps=4, lr=1e-4))
    assert stats["resumed_from_step"] == 0


def test_vocab_tokenizer_mismatch_refused(data, tmp_path):
    from eyas.vocab import load_draft_vocab

    d2t, t2d, meta = load_draft_vocab(data["vocab"])
    save_draft_vocab(tmp_path / "v.safetensors", d2t, t2d, meta["stats"], tokenizer_hash="other")
    with pytest.raises(ProvenanceError, match="tokenizer_hash"):
        train(
            settings(max_steps=1),
            token_shards=data["shards"],
            hidden_stores=data["stores"],
            vocab_path=str(tmp_path / "v.safetensors"),
            model_dir=data["model"],
            out_dir=str(tmp_path / "d"),
            log_path=str(tmp_path / "log.csv"),
            expected_provenance=data["expected"],
        )


def test_lr_schedule():
    assert lr_factor(0, 4, 20) == 0.25 and lr_factor(3, 4, 20) == 1.0
    assert lr_factor(4, 4, 20) == 1.0 and lr_factor(19, 4, 20) < 0.02
    assert lr_factor(12, 4, 20) == pytest.approx(0.5)


@pytest.mark.parametrize("init_head", [True, False])
def test_head_init_from_target(data, init_head):
    from eyas.store import HiddenStore
    from eyas.target import load_embed_and_head, load_target_tensor
    from eyas.vocab import load_draft_vocab

    d2t, t2d, _ = load_draft_vocab(data["vocab"])
    attrs = HiddenStore(data["stores"][0]).attrs
    model, _ = trainer_mod._build_model(data["model"], attrs, d2t, t2d, 0, init_head)
    _, head = load_embed_and_head(data["model"])
    rows = head[torch.arange(len(d2t)) + d2t].float()  # [D, H] target head rows of the draft vocab
    norm = load_target_tensor(data["model"], "model.norm.weight").float()
    assert torch.equal(model.lm_head.weight, rows) is init_head
    if init_head:  # (the tiny target's norm is all ones, like a fresh drafter's: nothing to tell apart)
        assert torch.equal(model.norm.weight, norm)


def _spawn(spec_path: Path, *extra: str) -> subprocess.Popen:
    worker = Path(__file__).with_name("train_worker.py")
    return subprocess.Popen([sys.executable, str(worker), str(spec_path), *extra], stderr=subprocess.PIPE)


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def test_sigkill_mid_run_then_restart_gives_the_same_loss_curve_bitwise(data, tmp_path):
    """A CPU training process SIGKILLed two steps after a checkpoint resumes from it; its log.csv and
    epochs.csv (held-out tau per epoch) and weights equal those of an uninterrupted run, bit for bit."""
    s = settings(max_steps=9, epochs=3, checkpoint_every=3, select_by_tau=True)
    run(data, tmp_path / "a", s, heldout=True)

    out = tmp_path / "b"
    spec = tmp_path / "spec.json"
    stats_path = tmp_path / "stats.json"
    spec.write_text(
        json.dumps(
            {
                "settings": dataclasses.asdict(s),
                "inputs": inputs(data, out, heldout=True),
                "stats_path": str(stats_path),
            }
        )
    )
    proc = _spawn(spec, "5")  # blocks after step 5: the last checkpoint is at step 3
    partial = out / "log.csv.partial"
    deadline = time.monotonic() + 120
    while _rows(partial) < 5:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "worker did not reach step 5"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    state = torch.load(out / "drafter-checkpoint" / "train_state.pt", weights_only=True)
    assert state["step"] == 3 and not (out / "drafter").exists() and not stats_path.exists()
    assert set(state["rng"]) >= {"torch", "numpy", "python"} and "optimizer" in state

    proc = _spawn(spec)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    stats = json.loads(stats_path.read_text())
    assert stats["resumed_from_step"] == 3 and stats["steps"] == 9
    for name in ("log.csv", "epochs.csv"):
        assert (out / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    assert _rows(out / "log.csv") == 9 and _rows(out / "epochs.csv") >= 2
    a = Eagle3Drafter.from_pretrained(tmp_path / "a" / "drafter").state_dict()
    b = Eagle3Drafter.from_pretrained(out / "drafter").state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_step_groups_partition_the_plan_with_a_padded_tail():
    from eyas.train.distributed import padded_slots, rank_share, step_groups

    plan = [np.array([i]) for i in range(7)]
    groups = step_groups(plan, world_size=2, accum=2)
    assert [len(g) for g in groups] == [4, 4] and padded_slots(7, 2, 2) == 1
    shares = [mb for r in range(2) for g in groups for mb in rank_share(g, r, 2)]
    real = sorted(int(mb[0]) for mb in shares if mb is not None)
    assert real == list(range(7)) and sum(mb is None for mb in shares) == 1  # each once, tail padded
    assert rank_share(groups[0], 1, 2)[0][0] == 2  # rank 1 reads the group's second half


def test_ddp_two_processes_gloo_match_one_process_at_the_same_global_batch(data, tmp_path):
    """torchrun with 2 CPU ranks (gloo, accum 1) == 1 process accumulating 2 micro-batches per step."""
    from eyas.train.cli import train_job

    s = settings(max_steps=None, epochs=2, checkpoint_every=0)
    one = run(data, tmp_path / "one", dataclasses.replace(s, grad_accum=2))
    two = train_job(
        dataclasses.replace(s, nproc=2), inputs(data, tmp_path / "two"), str(tmp_path / "launch.log")
    )
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["steps"] == one["steps"] and two["tokens"] == one["tokens"]
    for e1, e2 in zip(one["epochs"], two["epochs"], strict=True):
        # every one of the 10 samples used exactly once per epoch (the trainer checks and raises
        # otherwise); an odd micro-batch count is padded with an empty one, not dropped
        assert e1["samples"] == e2["samples"] == 10 and e1["complete"] and e2["complete"]
        assert e1["padded_microbatches"] == e2["padded_microbatches"]
    assert any(e["padded_microbatches"] for e in two["epochs"])
    with open(tmp_path / "one" / "log.csv") as fa, open(tmp_path / "two" / "log.csv") as fb:
        a, b = list(csv.DictReader(fa)), list(csv.DictReader(fb))
    assert len(a) == len(b) == one["steps"]
    for ra, rb in zip(a, b, strict=True):
        assert float(ra["loss"]) == pytest.approx(float(rb["loss"]), rel=1e-4, abs=1e-5)
        assert ra["acc_0"] == rb["acc_0"] and ra["tokens"] == rb["tokens"]
    wa = Eagle3Drafter.from_pretrained(tmp_path / "one" / "drafter").state_dict()
    wb = Eagle3Drafter.from_pretrained(tmp_path / "two" / "drafter").state_dict()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-5)
