"""Training faults: a loss that turns NaN/Inf, corrupt or truncated checkpoints, a full disk while a
checkpoint is saved, SIGTERM (cluster preemption) mid-run. Every case ends in a clean stop with an
error naming the step and file, or in a resume whose result equals an uninterrupted run's bitwise.

The training data is the tiny target's own greedy text (`tests/trainkit.py`, the `data` fixture).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainkit import csv_rows, inputs, run, settings

from eyas.model.drafter import Eagle3Drafter
from eyas.train.checkpoint import CheckpointError, previous_dir, verify_checkpoint
from eyas.train.job import EXIT_PREEMPTED, train_job
from eyas.train.step import NonFiniteLoss
from eyas.train.trainer import train

torch.set_num_threads(1)


def weights(path) -> dict:
    return Eagle3Drafter.from_pretrained(path).state_dict()


def assert_same_weights(a, b) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_nan_loss_stops_at_that_step_naming_the_last_good_checkpoint(data, tmp_path, ledger):
    # lr 1e8 (warm-up 2.5e7, 5e7, ...): AdamW moves each weight by ~lr per step; the gradient norm is
    # NaN by step 3 (measured: step 2's loss is still finite)
    s = settings(lr=1e8, warmup_steps=4, max_steps=30, epochs=10, checkpoint_every=2)
    with ledger.case("fault", "loss turns NaN/Inf (absurd lr)", "stop at that step; names last checkpoint"):
        with pytest.raises(NonFiniteLoss) as err:
            run(data, tmp_path, s)
        message = str(err.value)
        bad = int(re.search(r"at step (\d+)", message).group(1))
        logged = csv_rows(tmp_path / "log.csv.partial")
        assert logged == bad - 1 and bad > 2, (logged, message)  # every step before it, none after
        ckpt = tmp_path / "drafter-checkpoint"
        saved = (bad - 1) // 2 * 2  # the last multiple of checkpoint_every before the bad step
        assert f"last good checkpoint: {ckpt} (step {saved})" in message, message
        state = torch.load(ckpt / "train_state.pt", weights_only=True)
        assert state["step"] == saved and all(math.isfinite(r[3]) for r in state["log_rows"])
        assert all(torch.isfinite(t).all() for t in weights(ckpt).values())
        assert not (tmp_path / "drafter").exists()  # no output that looks finished


# --------------------------------------------------------------------------- corrupt checkpoints
RESUME = dict(max_steps=7, epochs=4, checkpoint_every=2)


@pytest.fixture(scope="module")
def crashed(data, tmp_path_factory) -> dict:
    """An uninterrupted run, and one stopped after step 5 (latest checkpoint step 4, previous step 2)."""
    from eyas.train.csvlog import TrainLog

    root = tmp_path_factory.mktemp("crashed")
    run(data, root / "reference", settings(**RESUME))
    append = TrainLog.append

    def crash(self, row: list) -> None:
        append(self, row)
        if row[0] == 5:
            raise KeyboardInterrupt

    TrainLog.append = crash
    try:
        with pytest.raises(KeyboardInterrupt):
            run(data, root / "crashed", settings(**RESUME))
    finally:
        TrainLog.append = append
    ckpt = root / "crashed" / "drafter-checkpoint"
    assert torch.load(ckpt / "train_state.pt", weights_only=True)["step"] == 4
    assert torch.load(previous_dir(ckpt) / "train_state.pt", weights_only=True)["step"] == 2
    return {"reference": root / "reference", "crashed": root / "crashed"}


def _cut(ckpt):
    f = ckpt / "train_state.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return f, "cannot be loaded"


def _zero(ckpt):  # a run of zeros inside the weights (the safetensors header stays valid)
    f = ckpt / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 4096] = bytes(4096)
    f.write_bytes(bytes(raw))
    return f, "sha256 differs"


def _wrong_step(ckpt):  # a stale train_state.pt (step 2's) in the step-4 checkpoint
    f = ckpt / "train_state.pt"
    f.write_bytes((previous_dir(ckpt) / "train_state.pt").read_bytes())
    return f, "field 'step' is 2"


@pytest.mark.parametrize("damage", [_cut, _zero, _wrong_step], ids=["truncated", "zeroed", "wrong_step"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(
    data, crashed, tmp_path, caplog, ledger, damage
):
    out = tmp_path / "run"
    shutil.copytree(crashed["crashed"], out)
    ckpt = out / "drafter-checkpoint"
    name = {_cut: "truncated", _zero: "zeroed", _wrong_step: "at the wrong step"}[damage]
    with ledger.case("fault", f"latest checkpoint {name}", "resume from the previous one, named; equal"):
        bad_file, problem = damage(ckpt)
        with caplog.at_level(logging.WARNING, logger="eyas.train"):
            stats = run(data, out, settings(**RESUME))
        warning = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
        assert f"{bad_file}: " in warning and problem in warning, warning
        assert f"resuming from the previous checkpoint {previous_dir(ckpt)} (step 2)" in warning, warning
        assert stats["resumed_from_step"] == 2 and stats["steps"] == 7  # not from zero
        assert (out / "log.csv").read_bytes() == (crashed["reference"] / "log.csv").read_bytes()
        assert_same_weights(out / "drafter", crashed["reference"] / "drafter")
        assert not any(p.name.startswith("drafter-checkpoint") for p in out.iterdir())  # all removed


def test_every_checkpoint_corrupt_restarts_from_zero_and_says_so(data, crashed, tmp_path, caplog, ledger):
    out = tmp_path / "run"
    shutil.copytree(crashed["crashed"], out)
    ckpt = out / "drafter-checkpoint"
    with ledger.case("fault", "latest and previous checkpoints corrupt", "error names both; restart equal"):
        _cut(ckpt)
        _cut(previous_dir(ckpt))
        with caplog.at_level(logging.WARNING, logger="eyas.train"):
            stats = run(data, out, settings(**RESUME))
        errors = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
        assert "no usable checkpoint, starting from step 0" in errors, errors
        assert f"{ckpt / 'train_state.pt'}: cannot be loaded" in errors
        assert f"{previous_dir(ckpt) / 'train_state.pt'}: cannot be loaded" in errors
        assert stats["resumed_from_step"] == 0 and stats["steps"] == 7
        assert_same_weights(out / "drafter", crashed["reference"] / "drafter")


# --------------------------------------------------------------------------- disk full
@pytest.mark.parametrize("fails_in", ["model.safetensors", "train_state.pt"])
def test_disk_full_during_a_checkpoint_save_keeps_the_checkpoints_before_it(
    data, crashed, tmp_path, ledger, fails_in, monkeypatch
):
    """A real full disk (a tmpfs with room for two checkpoints and part of a third; needs root):
    the third save fails in the weights or in the train state; both earlier checkpoints stay whole,
    nothing partial is left, and a resume from them on a roomier disk equals an uninterrupted run."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    one = crashed["crashed"] / "drafter-checkpoint"
    sizes = {f.name: f.stat().st_size for f in one.iterdir()}
    size = sum(sizes.values())
    # free space left after two checkpoints: half the weights, or the weights and half the train state
    spare = sizes["model.safetensors"] // 2
    if fails_in == "train_state.pt":
        spare = sizes["model.safetensors"] + sizes["config.json"] + sizes["train_state.pt"] // 2
    mount = tmp_path / "small"
    mount.mkdir()
    kib = (2 * size + spare) // 1024 + 16  # + a few pages of directory entries
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    s = settings(**{**RESUME, "checkpoint_every": 1})
    # The disk fills during the run (another job writing beside it, say), after the start's pre-flight
    # check passed: that check (tests/faults/test_disk_preflight.py) would refuse this small disk at once.
    monkeypatch.setattr("eyas.train.checkpoint.check_fits", lambda *args: None)
    try:
        kwargs = {**inputs(data, tmp_path / "full"), "out_dir": str(mount / "drafter")}
        ckpt = mount / "drafter-checkpoint"
        with ledger.case("fault", f"disk full writing checkpoint {fails_in}", "earlier checkpoints intact"):
            with pytest.raises(CheckpointError) as err:
                train(s, **kwargs)
            message = str(err.value)
            assert message.startswith(f"{ckpt}: writing the checkpoint of step 3 failed"), message
            assert "No space left on device" in message, message
            assert sorted(p.name for p in mount.iterdir()) == [ckpt.name, previous_dir(ckpt).name]
            assert verify_checkpoint(ckpt)["step"] == 2 and verify_checkpoint(previous_dir(ckpt))["step"] == 1
            Eagle3Drafter.from_pretrained(ckpt)
            roomy = tmp_path / "roomy"
            roomy.mkdir()
            for p in mount.iterdir():
                shutil.copytree(p, roomy / p.name)
        # (outside the case: the resume below proves what the case claims)
    finally:
        if subprocess.run(["umount", str(mount)]).returncode:
            subprocess.run(["umount", "-l", str(mount)])  # a file still open: detach it anyway
    stats = run(data, roomy, s)
    assert stats["resumed_from_step"] == 2 and stats["steps"] == 7
    assert_same_weights(roomy / "drafter", crashed["reference"] / "drafter")


# --------------------------------------------------------------------------- preemption (SIGTERM)
# The worker is held after step 2 is logged; the test sends SIGTERM, then lets it go on. Step 3 runs
# with the request (periodic checkpoints every 5 steps: the one at step 3 is the SIGTERM's), the run
# checkpoints after it and exits 143; the rerun resumes at step 3.
PREEMPT = {**RESUME, "checkpoint_every": 5}


def _spec(data, out, tmp_path, s) -> tuple:
    spec, stats_path = tmp_path / "spec.json", tmp_path / "stats.json"
    body = {"settings": dataclasses.asdict(s), "inputs": inputs(data, out), "stats_path": str(stats_path)}
    spec.write_text(json.dumps(body))
    return spec, stats_path


def _wait_rows(path, rows: int, proc, log) -> None:
    deadline = time.monotonic() + 180
    while csv_rows(path) < rows:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"training did not reach step {rows}"
        time.sleep(0.05)


def _preempted_checkpoint(out) -> None:
    """What a preempted run left: a checkpoint at step 3 that verifies, no output."""
    ckpt = out / "drafter-checkpoint"
    assert verify_checkpoint(ckpt)["step"] == 3 and not previous_dir(ckpt).exists()
    assert csv_rows(out / "log.csv.partial") == 3 and not (out / "drafter").exists()


def test_sigterm_checkpoints_after_the_step_in_progress_and_the_rerun_resumes_there(
    data, crashed, tmp_path, ledger
):
    s = settings(**PREEMPT)
    out = tmp_path / "run"
    spec, stats_path = _spec(data, out, tmp_path, s)
    log = tmp_path / "worker.log"
    with ledger.case("fault", "SIGTERM mid-run (one process)", "checkpoint at the next step; resume equal"):
        with open(log, "w") as fh:
            worker = Path(__file__).parents[1] / "train_worker.py"
            proc = subprocess.Popen([sys.executable, str(worker), str(spec), "2", "hold"], stderr=fh)
        _wait_rows(out / "log.csv.partial", 2, proc, log)
        proc.send_signal(signal.SIGTERM)
        Path(f"{spec}.go").touch()
        assert proc.wait(timeout=120) == EXIT_PREEMPTED, log.read_text()[-3000:]
        assert "stopped on SIGTERM after step 3 of 7" in log.read_text()
        _preempted_checkpoint(out)
        proc = subprocess.run([sys.executable, "-m", "eyas.train.job", str(spec)], capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        stats = json.loads(stats_path.read_text())
        assert stats["resumed_from_step"] == 3 and stats["steps"] == 7
        assert (out / "log.csv").read_bytes() == (crashed["reference"] / "log.csv").read_bytes()
        assert_same_weights(out / "drafter", crashed["reference"] / "drafter")


def _rank_pid(spec, rank: int) -> int:
    """The pid of torchrun's rank `rank` running `spec` (its environment says RANK)."""
    for proc_dir in Path("/proc").iterdir():
        try:
            if proc_dir.name.isdigit() and str(spec).encode() in (proc_dir / "cmdline").read_bytes():
                if f"RANK={rank}".encode() in (proc_dir / "environ").read_bytes().split(b"\0"):
                    return int(proc_dir.name)
        except OSError:
            continue
    raise AssertionError(f"no rank {rank} of {spec}")


def test_sigterm_to_one_torchrun_rank_stops_both_at_the_same_step(data, tmp_path, ledger):
    """2 ddp ranks: only rank 1 gets SIGTERM; the request rides on the step's all-reduce, so both
    save one checkpoint after step 3 and stop; the rerun resumes there and equals an uninterrupted run."""
    s = settings(**PREEMPT, nproc=2)
    train_job(s, inputs(data, tmp_path / "reference"), str(tmp_path / "reference.log"))
    out = tmp_path / "run"
    spec, stats_path = _spec(data, out, tmp_path, s)
    log = tmp_path / "torchrun.log"
    with ledger.case("fault", "SIGTERM to one torchrun rank", "all ranks stop at one step; resume equal"):
        worker = Path(__file__).parents[1] / "train_worker.py"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        with open(log, "w") as fh:
            proc = subprocess.Popen([*cmd, str(worker), str(spec), "2", "hold"], stdout=fh, stderr=fh)
        _wait_rows(out / "log.csv.partial", 2, proc, log)
        os.kill(_rank_pid(spec, 1), signal.SIGTERM)
        time.sleep(0.5)  # the signal is handled in the rank's main thread, at its next bytecode
        Path(f"{spec}.go").touch()
        assert proc.wait(timeout=180) != 0
        text = log.read_text()
        assert text.count("stopped on SIGTERM after step 3 of 7") == 2, text[-3000:]  # both ranks
        _preempted_checkpoint(out)
        stats = train_job(s, inputs(data, out), str(tmp_path / "rerun.log"))
        assert stats["resumed_from_step"] == 3 and stats["steps"] == 7
        assert (out / "log.csv").read_bytes() == (tmp_path / "reference" / "log.csv").read_bytes()
        assert_same_weights(out / "drafter", tmp_path / "reference" / "drafter")


LAUNCHER = r"""
import json, sys
from eyas.config import TrainSettings
from eyas.train.job import train_job
spec = json.loads(open(sys.argv[1]).read())
train_job(TrainSettings(**spec["settings"]), spec["inputs"], sys.argv[2])
"""


def test_sigterm_to_the_launcher_reaches_the_torchrun_ranks(data, tmp_path, ledger):
    """The train rule's process runs torchrun (`launch.launch`): SIGTERM to it is passed on to the
    torchrun agent, which passes it to both ranks; they stop after the same step with the run's only
    checkpoint (no periodic ones), and the launcher fails with `Preempted` naming the log."""
    s = settings(max_steps=60, epochs=30, checkpoint_every=0, nproc=2)
    out = tmp_path / "run"
    spec, _ = _spec(data, out, tmp_path, s)
    log, launch_log = tmp_path / "launcher.log", tmp_path / "torchrun.log"
    with ledger.case("fault", "SIGTERM to the torchrun launcher", "ranks checkpoint at one step; Preempted"):
        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(spec), str(launch_log)], stderr=fh)
        _wait_rows(out / "log.csv.partial", 2, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) != 0
        text = log.read_text()
        preempted = r"Preempted: train: torchrun's 2 ranks stopped on SIGTERM \(exit \d+\); see "
        assert re.search(preempted + re.escape(str(launch_log)), text), text
        steps = re.findall(r"stopped on SIGTERM after step (\d+) of 60", launch_log.read_text())
        assert len(steps) == 2 and steps[0] == steps[1], launch_log.read_text()[-3000:]  # both, one step
        saved = verify_checkpoint(out / "drafter-checkpoint")["step"]
        assert saved == int(steps[0]) == csv_rows(out / "log.csv.partial") < 60
