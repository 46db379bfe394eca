"""A disk too small for a job's outputs is refused before the job works, naming what it needs and what
is free (eyas.core.diskspace): the extraction's hidden store, training's checkpoints. The free-space
reading is set by the test; the estimates and the stage code run as they are."""

from __future__ import annotations

import re

import pytest
from faultkit import LAYER_IDS
from modelkit import tiny_drafter_config

from eyas.config import ExtractSettings, SglangSettings
from eyas.core import diskspace
from eyas.core.diskspace import DiskSpaceError, check_fits
from eyas.extract.job import stored_bytes
from eyas.extract.stage import run_extract
from eyas.model.drafter import Eagle3Drafter
from eyas.store import read_token_shard
from eyas.store.size import estimated_store_bytes
from eyas.train import distributed
from eyas.train.checkpoint import CHECKPOINTS_ON_DISK, Checkpointer, checkpoint_bytes

NEEDS = re.compile(r"needs ~(\d+\.\d\d) GiB at (\S+), but only (\d+\.\d\d) GiB is free there")


def _free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(diskspace, "free_bytes", lambda path: free)


def test_check_fits_names_both_numbers(tmp_path, monkeypatch):
    _free(monkeypatch, 3 * 2**30)
    check_fits(tmp_path / "out", 3 * 2**30, "job")  # exactly fits
    with pytest.raises(DiskSpaceError, match=r"job: needs ~3\.50 GiB at .*out, but only 3\.00 GiB is free"):
        check_fits(tmp_path / "out", int(3.5 * 2**30), "job")


def test_free_bytes_reads_the_nearest_existing_folder(tmp_path):
    assert diskspace.free_bytes(tmp_path / "not" / "yet" / "made") == diskspace.free_bytes(tmp_path) > 0


def test_extraction_refused_before_it_starts_when_the_store_will_not_fit(
    tmp_path, monkeypatch, token_shard_path, tiny_model_dir, ledger
):
    tokens = int(read_token_shard(token_shard_path).sample_offsets[-1])
    need = estimated_store_bytes(tokens, 64, len(LAYER_IDS) + 1, "bf16")
    settings = ExtractSettings(device="cpu", token_budget=96)
    kwargs = dict(
        engine_settings=SglangSettings(),
        aux_layer_ids=LAYER_IDS,
        model_id="tiny",
        trust_remote_code=False,
        threads=1,
    )
    out = tmp_path / "hidden" / "shard-00000.zarr"
    with ledger.case(
        "bad_input", "extract onto a disk too small for its store", "refused naming need and free"
    ):
        _free(monkeypatch, need - 1)
        with pytest.raises(DiskSpaceError) as err:
            run_extract(token_shard_path, out, tiny_model_dir, settings, **kwargs)
        message = str(err.value)
        match = NEEDS.search(message)
        assert match and match.group(2) == str(out), message
        assert f"bf16 hidden store of {tokens:,} tokens (3 taps + final, hidden 64)" in message
        assert not out.exists() and not any(out.parent.glob("*"))  # nothing written, not even a temp dir
        _free(monkeypatch, need)
        run_extract(token_shard_path, out, tiny_model_dir, settings, **kwargs)
        assert stored_bytes(out) > 0


def _drafter() -> Eagle3Drafter:
    cfg = tiny_drafter_config(hidden_size=64, intermediate_size=128, vocab_size=512, draft_vocab_size=256)
    return Eagle3Drafter(cfg)


def test_training_refused_when_its_checkpoints_will_not_fit(tmp_path, monkeypatch, ledger):
    model = _drafter()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    need = CHECKPOINTS_ON_DISK * checkpoint_bytes(model) + 2 * weights
    assert checkpoint_bytes(model) == weights + 2 * sum(
        p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
    )
    checkpointer = Checkpointer(tmp_path / "train" / "drafter", "fp", {}, distributed.World())
    with ledger.case(
        "bad_input", "train onto a disk too small for its checkpoints", "refused naming need and free"
    ):
        _free(monkeypatch, need - 1)
        with pytest.raises(DiskSpaceError, match=NEEDS.pattern):
            checkpointer.check_disk(model)
        _free(monkeypatch, need)
        checkpointer.check_disk(model)
    # A checkpoint an earlier run left (resumed from, replaced in turn) is already on the disk.
    checkpointer.dir.mkdir(parents=True)
    (checkpointer.dir / "model.safetensors").write_bytes(b"\0" * 4096)
    _free(monkeypatch, need - 4096)
    checkpointer.check_disk(model)  # fits: what is there already counts as taken
