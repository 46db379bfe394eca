"""Loader and trainer on a tiny real target (stores of its own greedy text: trainkit.py), one process."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from trainkit import LAYERS, csv_rows, inputs, run, settings, spawn_worker

from eyas.data.vocab import save_draft_vocab
from eyas.export import export_sglang
from eyas.model.drafter import Eagle3Drafter
from eyas.store import ProvenanceError
from eyas.store.writer import write_token_shard
from eyas.train import drafter_setup
from eyas.train.csvlog import TrainLog
from eyas.train.loader import SORT_WINDOW, PairedLoader, conversation_kept, plan_batches, sort_window
from eyas.train.trainer import loader_readers, lr_factor, train

torch.set_num_threads(1)


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
        assert not a.aux[~a.valid].any() and not a.final[~a.valid].any()  # padding is zeros


def test_large_budgets_fill_their_batches_with_little_padding():
    # chat-like lengths (mean ~330, a long tail): a 64-sample window holds ~21k tokens, so at a 32k budget
    # every window was one or two batches padded to its longest (45% real, bench/loader_padding.py)
    lengths = np.random.default_rng(0).lognormal(5.5, 0.8, 20_000).clip(3, 2048).astype(np.int64)
    plan = plan_batches(lengths, 32768, seed=0, epoch=0)
    assert sorted(np.concatenate(plan).tolist()) == list(range(len(lengths)))
    real = sum(int(lengths[rows].sum()) for rows in plan)
    padded = sum(len(rows) * int(lengths[rows].max()) for rows in plan)
    assert all(len(rows) == 1 or len(rows) * lengths[rows].max() <= 32768 for rows in plan)
    assert real / padded > 0.85 and real / len(plan) > 0.75 * 32768
    # small budgets keep the 64-sample windows (the CPU default's 512-token batches)
    assert sort_window(lengths, 512) == SORT_WINDOW and sort_window(lengths, 32768) > 1000


def test_loader_pads_rows_to_a_multiple_with_zeros(data):
    # the drafter's rows are independent of their padding (tests/test_drafter.py); here: same content
    plain = PairedLoader(data["shards"], data["stores"], 64, 3, data["expected"], prefetch=0)
    padded = PairedLoader(
        data["shards"], data["stores"], 64, 3, data["expected"], prefetch=0, pad_multiple=24
    )
    for a, b in zip(plain.epoch(0), padded.epoch(0), strict=True):
        t = a.aux.shape[1]
        assert b.aux.shape[1] % 24 == 0 and t <= b.aux.shape[1] < t + 24
        assert torch.equal(b.aux[:, :t], a.aux) and torch.equal(b.final[:, :t], a.final)
        assert torch.equal(b.input_ids[:, :t], a.input_ids) and torch.equal(b.loss_mask[:, :t], a.loss_mask)
        assert torch.equal(b.valid[:, :t], a.valid) and not b.valid[:, t:].any()
        assert not b.aux[:, t:].any() and not b.final[:, t:].any() and not b.input_ids[:, t:].any()
        assert torch.equal(a.lengths, b.lengths)
    with pytest.raises(ValueError, match="pad_multiple=0"):
        PairedLoader(data["shards"], data["stores"], 64, 3, data["expected"], pad_multiple=0)


def test_loader_reads_the_same_batches_in_worker_processes(data):
    """Readers in processes (train.loader_processes) hand over the threads' batches, in plan order,
    epoch after epoch from the same workers, and a pass left half-read does not leak into the next."""
    threads = PairedLoader(data["shards"], data["stores"], 64, 3, data["expected"], readers=2)
    procs = PairedLoader(data["shards"], data["stores"], 64, 3, data["expected"], readers=2, processes=True)
    fields = ("aux", "final", "input_ids", "loss_mask", "valid", "lengths")
    for epoch in (0, 1):
        if epoch == 1:
            next(iter(procs.epoch(1)))  # abandoned after one batch
        plan = procs.plan(epoch)
        got = list(procs.batches([None, *plan[:3], None, *plan[3:]]))
        want = list(threads.batches([None, *plan[:3], None, *plan[3:]]))
        assert len(got) == len(want) == len(plan) + 2 and got[0] is None and got[4] is None
        for a, b in zip(got, want, strict=True):
            if b is not None:
                assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)
    assert procs._workers is not None and len(list(procs.batches([]))) == 0
    procs.close()
    assert procs._workers is None and len(list(procs.batches(procs.plan(0)[:2]))) == 2  # started again
    procs.close()


def _fp8_copy(store_path: str, out) -> str:
    """The bf16 store at `store_path` re-stored as fp8 e4m3 (same attrs and samples)."""
    from eyas.store import HiddenStore, hidden_store_writer
    from eyas.store.quant import fp8_quantize

    store = HiddenStore(store_path)
    taps = len(store.attrs["layer_ids"])
    hidden = store.final.shape[1]
    with hidden_store_writer(out, store.sample_offsets, hidden, taps, store.attrs, storage="fp8_e4m3") as w:
        for s in range(store.num_samples):
            aux, final = store.sample(s)  # [T, K*H], [T, H] bf16
            states = torch.cat([aux.view(len(aux), taps, hidden), final[:, None]], dim=1)  # [T, K+1, H]
            bits, scale = fp8_quantize(states)
            w.write_sample(
                s, bits[:, :taps].reshape(len(aux), -1).numpy(), bits[:, taps].numpy(), scale.numpy()
            )
    return str(out)


def test_loader_hands_fp8_stores_over_as_bits_dequantized_on_the_device(data, tmp_path):
    from eyas.store import HiddenStore

    fp8 = [_fp8_copy(path, tmp_path / f"fp8-{i}.zarr") for i, path in enumerate(data["stores"])]

    def check_values(loader, stores, batch, rows):
        moved = batch.to("cpu", torch.float32)
        assert moved.scale is None and moved.aux.dtype == moved.final.dtype == torch.float32
        for row, (pair, sample, length) in enumerate(loader.samples[rows].tolist()):
            aux, final = stores[pair].sample(sample)  # bf16, or float32 dequantized on the host
            assert torch.equal(moved.aux[row, :length], aux.float())
            assert torch.equal(moved.final[row, :length], final.float())
        assert not moved.aux[~moved.valid].any() and not moved.final[~moved.valid].any()  # padding: zeros

    loader = PairedLoader(data["shards"], fp8, 64, 3, data["expected"], prefetch=0, pad_multiple=8)
    stores = [HiddenStore(path) for path in fp8]
    for batch, rows in zip(loader.epoch(0), loader.plan(0), strict=True):
        assert batch.aux.dtype == batch.final.dtype == torch.uint8 and batch.scale.dtype == torch.float32
        assert batch.scale.shape == (*batch.final.shape[:2], 4)  # 3 taps and the final state
        check_values(loader, stores, batch, rows)
    # an fp8 store beside a bf16 one: a batch drawing on both is dequantized on the host (float32)
    mixed_paths = [fp8[0], data["stores"][1]]
    mixed = PairedLoader(data["shards"], mixed_paths, 64, 3, data["expected"], prefetch=0)
    kinds = {(0,): torch.uint8, (1,): torch.bfloat16, (0, 1): torch.float32}
    seen = set()
    for batch, rows in zip(mixed.epoch(0), mixed.plan(0), strict=True):
        pairs = tuple(np.unique(mixed.samples[rows, 0]).tolist())
        assert batch.aux.dtype == kinds[pairs] and (batch.scale is not None) == (pairs == (0,))
        check_values(mixed, [HiddenStore(path) for path in mixed_paths], batch, rows)
        seen.add(pairs)
    assert (0, 1) in seen
    with pytest.raises(ValueError, match="has no fp8 bits"):
        HiddenStore(data["stores"][0]).stored_sample_into(0, *(torch.empty(0),) * 3)


def test_data_fraction_keeps_nested_conversation_subsets():
    ids = [f"conv-{i}" for i in range(2000)]
    kept = {f: {c for c in ids if conversation_kept(c, f, seed=0)} for f in (0.25, 0.5, 1.0)}
    assert kept[0.25] < kept[0.5] < kept[1.0] == set(ids)  # nested, and 1.0 keeps everything
    assert abs(len(kept[0.25]) / 2000 - 0.25) < 0.04 and abs(len(kept[0.5]) / 2000 - 0.5) < 0.04
    # samples of one conversation (regenerated "<id>#s<n>") stay together
    assert all(conversation_kept(f"{c}#s3", 0.5, 0) == (c in kept[0.5]) for c in ids)
    assert kept[0.5] != {c for c in ids if conversation_kept(c, 0.5, seed=1)}  # the seed picks


def test_loader_data_fraction_drops_whole_conversations(data):
    full = PairedLoader(data["shards"], data["stores"], 64, 0, data["expected"], prefetch=0)
    half = PairedLoader(data["shards"], data["stores"], 64, 0, data["expected"], prefetch=0, fraction=0.5)
    ids = [f"s{i}" for i in range(5)]  # both shards use the ids s0..s4
    kept = [i for i in ids if conversation_kept(i, 0.5, 0)]
    assert 0 < len(kept) < 5
    assert len(half.samples) == 2 * len(kept) and half.skipped_by_fraction == 2 * (5 - len(kept))
    assert len(half.samples) + half.skipped_by_fraction == len(full.samples)
    assert sorted(half.samples[:, 1].tolist()) == sorted(2 * [int(i[1:]) for i in kept])


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
    tokens = sum(int(zarr.open_group(p, mode="r").attrs["num_tokens"]) for p in data["stores"])
    assert cfg["train_stores"] == {
        "count": 2, "tokens": tokens, "storage": ["bf16"], "backend": [], "compute_dtype": []
    }  # fmt: skip
    assert (tmp_path / "drafter" / "train_state.pt").exists()
    assert not (tmp_path / "drafter-checkpoint").exists() and not (tmp_path / "log.csv.partial").exists()
    Eagle3Drafter.from_pretrained(tmp_path / "drafter")
    assert stats["tokens"] > 0 and stats["tokens_per_s"] > 0
    phases, first = stats["phase_seconds"], stats["first_step_seconds"]  # the steps' seconds by phase
    assert set(phases) == set(first) == {"loader_wait", "forward_backward", "clip", "update"}
    assert min(phases.values()) >= 0 and phases["forward_backward"] > 0 and first["forward_backward"] > 0
    assert sum(phases.values()) + sum(first.values()) == pytest.approx(stats["seconds"], abs=0.01)
    paces = [(e["seconds"], e["tokens_per_s"], e["loader_wait_seconds"]) for e in stats["epochs"]]
    assert paces and all(s > 0 and r > 0 and 0 <= w <= s for s, r, w in paces)  # each epoch's pace
    assert sum(s for s, _, _ in paces) >= stats["seconds"] - 0.01  # epochs hold the steps (and more)


def test_a_wider_draft_mlp_is_trained_saved_and_exported_at_its_width(data, tmp_path):
    """train.intermediate_size: the drafter, its saved config and the SGLang export (whose config.json
    SGLang builds the draft layer from) all carry the asked MLP width, not the target's."""
    target_width = json.loads((Path(data["model"]) / "config.json").read_text())["intermediate_size"]
    wide = 3 * target_width
    run(data, tmp_path, settings(max_steps=4, checkpoint_every=0, intermediate_size=wide))
    model = Eagle3Drafter.from_pretrained(tmp_path / "drafter")
    assert model.config.intermediate_size == wide
    assert tuple(model.layers[0].mlp.gate_proj.weight.shape) == (wide, model.config.hidden_size)
    export_sglang(tmp_path / "drafter", tmp_path / "export")
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["intermediate_size"] == wide


@pytest.mark.parametrize(
    "dtype, layer",  # bf16 autocast: the CPU default with native bf16; the MLA layer with EAGLE-3.1 options
    [
        ("float32", {}),
        ("bfloat16", {}),
        ("float32", {"drafter": "mla", "fc_norm": True, "norm_output": True}),
    ],
)
def test_resume_after_crash_matches_uninterrupted_run(data, tmp_path, monkeypatch, dtype, layer):
    s = settings(max_steps=5, epochs=3, dtype=dtype, **layer)
    run(data, tmp_path / "a", s)

    append = TrainLog.append

    def crash(self, row: list) -> None:  # killed right after step 3 is logged, before any checkpoint
        append(self, row)
        if row[0] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(TrainLog, "append", crash)
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
    monkeypatch.undo()
    stats = run(data, tmp_path / "b", s)
    assert stats["resumed_from_step"] == 2 and stats["steps"] == 5
    assert Eagle3Drafter.from_pretrained(tmp_path / "b" / "drafter").config.attention == (
        layer.get("drafter", "llama")
    )
    a = Eagle3Drafter.from_pretrained(tmp_path / "a" / "drafter").state_dict()
    b = Eagle3Drafter.from_pretrained(tmp_path / "b" / "drafter").state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    with open(tmp_path / "b" / "log.csv") as fh:
        assert [int(r["step"]) for r in csv.DictReader(fh)] == [1, 2, 3, 4, 5]


def _killed_at_step_3(data, tmp_path, monkeypatch) -> None:
    """A 4-step run killed as step 3 is logged: it leaves the checkpoint of step 2 to resume from."""

    def crash(self, row: list) -> None:
        if row[0] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(TrainLog, "append", crash)
    with pytest.raises(KeyboardInterrupt):
        run(data, tmp_path, settings(max_steps=4))
    monkeypatch.undo()


def test_changed_settings_do_not_resume(data, tmp_path, monkeypatch):
    _killed_at_step_3(data, tmp_path, monkeypatch)
    stats = run(data, tmp_path, settings(max_steps=4, lr=1e-4))
    assert stats["resumed_from_step"] == 0


def test_more_loader_readers_still_resume_the_same_run(data, tmp_path, monkeypatch):
    """The readers change how batches are read, never which: a checkpoint resumes across their count
    (and across the other settings that leave the maths alone, NOT_FINGERPRINTED)."""
    _killed_at_step_3(data, tmp_path, monkeypatch)
    stats = run(data, tmp_path, settings(max_steps=4, loader_readers=3, checkpoint_every=3))
    assert stats["resumed_from_step"] == 2 and stats["steps"] == 4


def test_reader_processes_outlive_the_sigterm_a_cluster_sends_every_process_of_its_job(data):
    """SLURM preempts a job by signalling all its processes; the trainer's handler then saves a
    checkpoint after the step in progress (eyas.train.preemption), for which its readers must live on."""
    procs = PairedLoader(data["shards"], data["stores"], 64, 3, data["expected"], readers=2, processes=True)
    plan = procs.plan(0)
    batches = procs.batches(plan)
    next(batches), next(batches)  # batch i comes from worker i % 2: both workers are up
    workers = procs._workers.data._iterator._workers
    for worker in workers:
        os.kill(worker.pid, signal.SIGTERM)
    time.sleep(1.0)
    assert all(worker.is_alive() for worker in workers)
    assert len(list(batches)) == len(plan) - 2 > 0
    procs.close()


def test_training_with_reader_processes_logs_the_same_steps(data, tmp_path):
    """train.loader_processes reads the same batches: the same losses, bit for bit on CPU."""
    run(data, tmp_path / "t", settings(max_steps=4, loader_readers=2))
    run(data, tmp_path / "p", settings(max_steps=4, loader_readers=2, loader_processes=True))
    logs = [(tmp_path / name / "log.csv").read_text() for name in ("t", "p")]
    assert logs[0] == logs[1] and len(logs[0].splitlines()) == 5


def test_loader_readers_asked_or_from_the_device_and_threads():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert loader_readers(cpu, 16) == 1 and loader_readers(gpu, 16) == 4 and loader_readers(gpu, 4) == 2
    assert loader_readers(cpu, 16, asked=3) == 3 and loader_readers(gpu, 16, asked=1) == 1


def test_a_checkpoint_of_another_batch_plan_does_not_resume(data, tmp_path, monkeypatch):
    # its step counts batches of the plan it was made with: another plan would skip other samples
    from eyas.train import drafter_setup, loader

    _killed_at_step_3(data, tmp_path, monkeypatch)
    monkeypatch.setattr(drafter_setup, "BATCH_PLAN", loader.BATCH_PLAN + 1)
    assert run(data, tmp_path, settings(max_steps=4))["resumed_from_step"] == 0


def test_vocab_tokenizer_mismatch_refused(data, tmp_path):
    from eyas.data.vocab import load_draft_vocab

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


def test_stores_summary_names_every_storage_and_backend():
    attrs = [
        {"num_tokens": 10, "backend": "sglang", "storage": "fp8_e4m3", "compute_dtype": "bfloat16"},
        {"num_tokens": 5, "backend": "hf", "compute_dtype": "bfloat16"},  # before the storage field
    ]
    assert drafter_setup.stores_summary(attrs) == {
        "count": 2,
        "tokens": 15,
        "storage": ["bf16", "fp8_e4m3"],
        "backend": ["hf", "sglang"],
        "compute_dtype": ["bfloat16"],
    }


def test_lr_schedule():
    assert lr_factor(0, 4, 20) == 0.25 and lr_factor(3, 4, 20) == 1.0
    assert lr_factor(4, 4, 20) == 1.0 and lr_factor(19, 4, 20) < 0.02
    assert lr_factor(12, 4, 20) == pytest.approx(0.5)


@pytest.mark.parametrize("init_head", [True, False])
def test_head_init_from_target(data, init_head):
    from eyas.data.vocab import load_draft_vocab
    from eyas.model.target import load_embed_and_head, load_target_tensor
    from eyas.store import HiddenStore

    d2t, t2d, _ = load_draft_vocab(data["vocab"])
    attrs = HiddenStore(data["stores"][0]).attrs
    model, _ = drafter_setup._build_model(
        data["model"], attrs, d2t, t2d, settings(init_head_from_target=init_head)
    )
    _, head = load_embed_and_head(data["model"])
    rows = head[torch.arange(len(d2t)) + d2t].float()  # [D, H] target head rows of the draft vocab
    norm = load_target_tensor(data["model"], "model.norm.weight").float()
    assert torch.equal(model.lm_head.weight, rows) is init_head
    if init_head:  # (the tiny target's norm is all ones, like a fresh drafter's: nothing to tell apart)
        assert torch.equal(model.norm.weight, norm)


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
    proc = spawn_worker(spec, "5")  # blocks after step 5: the last checkpoint is at step 3
    partial = out / "log.csv.partial"
    deadline = time.monotonic() + 120
    while csv_rows(partial) < 5:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "worker did not reach step 5"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    state = torch.load(out / "drafter-checkpoint" / "train_state.pt", weights_only=True)
    assert state["step"] == 3 and not (out / "drafter").exists() and not stats_path.exists()
    assert set(state["rng"]) >= {"torch", "numpy", "python"} and "optimizer" in state

    proc = spawn_worker(spec)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    stats = json.loads(stats_path.read_text())
    assert stats["resumed_from_step"] == 3 and stats["steps"] == 9
    for name in ("log.csv", "epochs.csv"):
        assert (out / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    assert csv_rows(out / "log.csv") == 9 and csv_rows(out / "epochs.csv") >= 2
    a = Eagle3Drafter.from_pretrained(tmp_path / "a" / "drafter").state_dict()
    b = Eagle3Drafter.from_pretrained(out / "drafter").state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("samples", [[], [([5, 6], [0, 1])]], ids=["no-sample", "too-short"])
def test_an_empty_heldout_split_is_refused_before_the_first_step(data, tmp_path, samples):
    """A split that drew no eval conversation (tiny data, a small data.eval_fraction), or none the loader
    can measure, used to fail at the end of the first epoch with a message about 'token shards'; now
    the run stops before it starts."""
    empty = tmp_path / "eval-empty.zarr"
    attrs = dict(zarr.open_group(data["shards"][1], mode="r").attrs)
    arrays = [(np.array(ids, dtype=np.int32), np.array(mask, dtype=bool)) for ids, mask in samples]
    write_token_shard(empty, arrays, [f"c{i}" for i in range(len(arrays))], attrs)
    kwargs = inputs(data, tmp_path / "out", heldout=True)
    kwargs["heldout"]["token_shards"] = [str(empty)]
    with pytest.raises(ValueError, match=r"held-out token shards have no samples \(.*eval-empty\.zarr\)"):
        train(settings(max_steps=2, select_by_tau=True), **kwargs)
    assert not (tmp_path / "out" / "log.csv").exists()
