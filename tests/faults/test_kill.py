"""SIGKILL at chosen points of extraction and training, then rerun: nothing half-done is ever taken
for done, and the rerun's result is complete and bitwise equal to an uninterrupted run.

The victims are forked from one child process (`faultkit.ZYGOTE`, so torch is imported once); each
pauses at its point and announces its pid, and the test kills it with SIGKILL (no cleanup handlers
run, as with the OOM killer or a lost node). All victims run at once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from faultkit import EXTRACT_KW, ZYGOTE

from eyas.extract.hf_backend import extract_shard
from eyas.validate import StoreInvalid, validate_store

EXTRACT_POINTS = ("mid_batch", "mid_write", "finalize", "replace_old")
READY_TIMEOUT_S = 300
TRAIN_SETTINGS = dict(
    epochs=4, max_steps=6, lr=3e-3, warmup_steps=1, token_budget=256, ttt_steps=2, seed=0, device="cpu",
    dtype="float32", checkpoint_every=2, progress=False, select_by_tau=False,
)  # fmt: skip


def _train_inputs(root: Path, token_shard_path: Path, reference_store: Path, tiny_model_dir: Path) -> dict:
    from eyas.data.vocab import build_draft_vocab, save_draft_vocab

    attrs = zarr.open_group(reference_store, mode="r").attrs
    d2t, t2d, stats = build_draft_vocab([str(token_shard_path)], 49152, 64)
    vocab = root / "vocab.safetensors"
    save_draft_vocab(vocab, d2t, t2d, stats, tokenizer_hash=attrs["tokenizer_hash"])
    return {
        "token_shards": [str(token_shard_path)],
        "hidden_stores": [str(reference_store)],
        "vocab_path": str(vocab),
        "model_dir": str(tiny_model_dir),
        "threads": 1,
        "expected_provenance": {"model_id": "tiny", "layer_ids": EXTRACT_KW["layer_ids"]},
    }


@pytest.fixture(scope="module")
def killed(tmp_path_factory, token_shard_path, tiny_model_dir, reference_store) -> dict:
    """Run every victim at once, SIGKILL each at its point; returns what each left behind."""
    root = tmp_path_factory.mktemp("killed")
    jobs, outs = [], {}
    for point in EXTRACT_POINTS:
        out = root / point / "shard-00000.zarr"
        out.parent.mkdir()
        if point == "replace_old":  # a finished store is already there (a forced rerun)
            shutil.copytree(reference_store, out)
        outs[point] = out
        args = [str(token_shard_path), str(out), str(tiny_model_dir)]
        jobs.append({"point": point, "call": "extract", "args": args, "kwargs": EXTRACT_KW})
    train_inputs = _train_inputs(root, token_shard_path, reference_store, tiny_model_dir)
    train_kwargs = {
        **train_inputs,
        "out_dir": str(root / "train" / "drafter"),
        "log_path": str(root / "train" / "log.csv"),
    }
    jobs.append(
        {"point": "mid_checkpoint", "call": "train", "settings": TRAIN_SETTINGS, "kwargs": train_kwargs}
    )
    for job in jobs:
        job["ready"] = str(root / f"{job['point']}.ready")
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE, json.dumps(jobs)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pending = {job["point"]: Path(job["ready"]) for job in jobs}
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while pending:
            for point, ready in list(pending.items()):
                if ready.exists() and ready.read_text():
                    os.kill(int(ready.read_text()), signal.SIGKILL)
                    del pending[point]
            if zygote.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        out, err = zygote.communicate(timeout=60)
    finally:
        if zygote.poll() is None:
            zygote.kill()
    assert not pending, f"victims never reached their point: {sorted(pending)}\n{err}"
    codes = json.loads(out.strip().splitlines()[-1])
    return {"codes": codes, "outs": outs, "train": train_kwargs, "train_inputs": train_inputs, "stderr": err}


def assert_same_store(path: Path, reference: Path) -> None:
    got, want = zarr.open_group(path, mode="r"), zarr.open_group(reference, mode="r")
    assert dict(got.attrs) == dict(want.attrs)
    for name in ("aux", "final", "sample_offsets"):
        assert np.array_equal(got[name][:], want[name][:]), name


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("point", EXTRACT_POINTS)
def test_extract_killed_then_rerun_is_bitwise_equal(
    point, killed, token_shard_path, tiny_model_dir, reference_store, ledger, one_thread
):
    out = killed["outs"][point]
    with ledger.case("fault", f"SIGKILL extract {point}", "no store marked complete; rerun bitwise equal"):
        assert killed["codes"][point] == -signal.SIGKILL, killed["stderr"]
        if point == "replace_old":
            # The old store was moved aside before it was deleted: what sits at the path is whole.
            validate_store(token_shard_path, out)
            assert_same_store(out, reference_store)
        else:
            assert not out.exists(), f"{point}: a killed job left {out}"
        leftovers = [p.name for p in out.parent.iterdir() if p.name != out.name]
        assert all(".tmp-" in n or ".old-" in n for n in leftovers), leftovers  # never a store's name
        extract_shard(str(token_shard_path), str(out), str(tiny_model_dir), **EXTRACT_KW)
        validate_store(token_shard_path, out)
        assert_same_store(out, reference_store)


def test_train_killed_mid_checkpoint_keeps_the_previous_one(killed, tmp_path, ledger, one_thread):
    from eyas.config import TrainSettings
    from eyas.model.drafter import Eagle3Drafter
    from eyas.train.checkpoint import checkpoint_dir
    from eyas.train.trainer import train

    settings = TrainSettings(**TRAIN_SETTINGS)
    kwargs = killed["train"]
    with ledger.case("fault", "SIGKILL train mid-checkpoint", "previous checkpoint usable; resume equal"):
        assert killed["codes"]["mid_checkpoint"] == -signal.SIGKILL, killed["stderr"]
        ckpt = checkpoint_dir(kwargs["out_dir"])
        assert not Path(kwargs["out_dir"]).exists()
        state = torch.load(ckpt / "train_state.pt", map_location="cpu", weights_only=True)
        assert state["step"] == 2  # the first checkpoint, whole; the half-written second is not in place
        Eagle3Drafter.from_pretrained(ckpt)
        stats = train(settings, **kwargs)
        assert stats["resumed_from_step"] == 2 and stats["steps"] == 6
        reference = tmp_path / "uninterrupted"
        train(
            settings,
            **killed["train_inputs"],
            out_dir=str(reference / "drafter"),
            log_path=str(reference / "log.csv"),
        )
        a = Eagle3Drafter.from_pretrained(reference / "drafter").state_dict()
        b = Eagle3Drafter.from_pretrained(kwargs["out_dir"]).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_disk_full_on_the_store_path(tmp_path, token_shard_path, tiny_model_dir, ledger, one_thread):
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        out = mount / "shard-00000.zarr"
        with ledger.case("fault", "disk full on the store path", "clear error; no store, no leftovers"):
            with pytest.raises(Exception) as err:  # noqa: B017 (the type is the writer's; the text is checked)
                extract_shard(str(token_shard_path), str(out), str(tiny_model_dir), **EXTRACT_KW)
            chain, exc = [], err.value
            while exc is not None:
                chain += [str(exc), *getattr(exc, "__notes__", [])]
                exc = exc.__cause__ or exc.__context__
            text = " | ".join(chain)
            assert "No space left on device" in text and str(out) in text, text
            assert not out.exists() and list(mount.iterdir()) == []  # the partial tmp store was removed
        with ledger.case("fault", "disk full writing a manifest", "clear error; no manifest"):
            from eyas.validate import write_manifest

            big = {"pad": "x" * (200 << 10)}
            with pytest.raises(OSError, match="No space left"):
                write_manifest(mount / "m.json", big)
            assert not (mount / "m.json").exists()
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_killed_store_never_passes_validation(tmp_path, token_shard_path, reference_store, ledger):
    """A store directory cut short (as a kill without atomic rename would leave) fails validation."""
    partial = tmp_path / "shard-00000.zarr"
    shutil.copytree(reference_store, partial)
    for chunk in sorted((partial / "final" / "c").rglob("*"))[-2:]:
        if chunk.is_file():
            chunk.unlink()
    with ledger.case("fault", "store with lost chunks", "validation refuses"):
        with pytest.raises(StoreInvalid, match="chunks missing on disk"):
            validate_store(token_shard_path, partial)
