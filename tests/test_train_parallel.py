"""Data parallelism on CPU (gloo, 2 torchrun processes): `ddp` and `fsdp` against one process at the
same global batch, and an `fsdp` run killed with SIGKILL and restarted against an uninterrupted one."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from trainkit import csv_rows, inputs, run, settings

from eyas.model.drafter import Eagle3Drafter
from eyas.train.job import train_job

torch.set_num_threads(1)


def test_step_groups_partition_the_plan_with_a_padded_tail():
    from eyas.train.distributed import padded_slots, rank_share, step_groups

    plan = [np.array([i]) for i in range(7)]
    groups = step_groups(plan, world_size=2, accum=2)
    assert [len(g) for g in groups] == [4, 4] and padded_slots(7, 2, 2) == 1
    shares = [mb for r in range(2) for g in groups for mb in rank_share(g, r, 2)]
    real = sorted(int(mb[0]) for mb in shares if mb is not None)
    assert real == list(range(7)) and sum(mb is None for mb in shares) == 1  # each once, tail padded
    assert rank_share(groups[0], 1, 2)[0][0] == 2  # rank 1 reads the group's second half


@pytest.mark.parametrize(
    "parallel, accum, compiled", [("ddp", 1, False), ("fsdp", 2, False), ("fsdp", 2, True)]
)
def test_two_processes_match_one_process_at_the_same_global_batch(data, tmp_path, parallel, accum, compiled):
    """torchrun with 2 CPU ranks == 1 process accumulating 2 x accum micro-batches per step. The fsdp
    case also accumulates (gradient sync only on a step's last backward), runs empty slots as
    zero-loss micro-batches, and picks the best epoch by held-out tau on gathered weights; compiled
    (train.compile, lse attention), each rank runs its own compiled steps on FSDP's gathered weights."""
    tau = parallel == "fsdp"
    s = settings(max_steps=None, epochs=2, checkpoint_every=0, select_by_tau=tau)
    if compiled:
        s = dataclasses.replace(s, compile=True, tree_attention="lse")
    one = run(data, tmp_path / "one", dataclasses.replace(s, grad_accum=2 * accum), heldout=tau)
    two = train_job(
        dataclasses.replace(s, nproc=2, grad_accum=accum, parallel=parallel),
        inputs(data, tmp_path / "two", heldout=tau),
        str(tmp_path / "launch.log"),
    )
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["steps"] == one["steps"] and two["tokens"] == one["tokens"]
    for e1, e2 in zip(one["epochs"], two["epochs"], strict=True):
        # every one of the 10 samples used exactly once per epoch (the trainer checks and raises
        # otherwise); a micro-batch count that does not fill the last step is padded, not dropped
        assert e1["samples"] == e2["samples"] == 10 and e1["complete"] and e2["complete"]
        assert e1["padded_microbatches"] == e2["padded_microbatches"]
        if tau:
            assert e1["simulated_tau"] == pytest.approx(e2["simulated_tau"], rel=1e-4)
    assert any(e["padded_microbatches"] for e in two["epochs"])
    with open(tmp_path / "one" / "log.csv") as fa, open(tmp_path / "two" / "log.csv") as fb:
        a, b = list(csv.DictReader(fa)), list(csv.DictReader(fb))
    assert len(a) == len(b) == one["steps"]
    for ra, rb in zip(a, b, strict=True):
        assert float(ra["loss"]) == pytest.approx(float(rb["loss"]), rel=1e-4, abs=1e-5)
        assert float(ra["grad_norm"]) == pytest.approx(float(rb["grad_norm"]), rel=1e-4, abs=1e-6)
        assert ra["acc_0"] == rb["acc_0"] and ra["tokens"] == rb["tokens"]
    wa = Eagle3Drafter.from_pretrained(tmp_path / "one" / "drafter").state_dict()
    wb = Eagle3Drafter.from_pretrained(tmp_path / "two" / "drafter").state_dict()
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-5)


def _torchrun_worker(spec: Path, stall_at: int, log: Path) -> subprocess.Popen:
    """2 ranks of tests/train_worker.py under torchrun."""
    worker = Path(__file__).with_name("train_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    with open(log, "w") as out:
        return subprocess.Popen(
            [*cmd, str(worker), str(spec), str(stall_at)], stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _kill_every_process_of(spec: Path) -> None:
    """SIGKILL torchrun and its ranks (they run in sessions of their own, so not by process group):
    every process whose command line names `spec`."""
    pids = []
    for proc_dir in Path("/proc").iterdir():
        try:
            if proc_dir.name.isdigit() and str(spec).encode() in (proc_dir / "cmdline").read_bytes():
                pids.append(int(proc_dir.name))
        except OSError:  # ended meanwhile
            continue
    assert len(pids) >= 3, pids  # torchrun + 2 ranks
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "ranks still alive after SIGKILL"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:  # a killed child of another process lingers as a zombie until reaped: that is dead
        return (Path(f"/proc/{pid}") / "stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_fsdp_sigkill_mid_run_then_restart_gives_the_same_run_bitwise(data, tmp_path):
    """Both fsdp ranks SIGKILLed after step 5 (checkpoint at 4: the sharded AdamW state gathered to
    rank 0 and saved whole); the restart scatters it again and continues as if never stopped."""
    s = settings(max_steps=7, epochs=4, checkpoint_every=2, nproc=2, parallel="fsdp")
    train_job(s, inputs(data, tmp_path / "a"), str(tmp_path / "a.log"))

    out = tmp_path / "b"
    spec, stats_path = tmp_path / "spec.json", tmp_path / "stats.json"
    spec.write_text(
        json.dumps(
            {"settings": dataclasses.asdict(s), "inputs": inputs(data, out), "stats_path": str(stats_path)}
        )
    )
    proc = _torchrun_worker(spec, 5, tmp_path / "killed.log")
    deadline = time.monotonic() + 180
    while csv_rows(out / "log.csv.partial") < 5:
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "ranks did not reach step 5"
        time.sleep(0.1)
    _kill_every_process_of(spec)  # torchrun and both ranks at once, like a lost node
    proc.wait()
    state = torch.load(out / "drafter-checkpoint" / "train_state.pt", weights_only=True)
    assert state["step"] == 4 and not (out / "drafter").exists() and not stats_path.exists()
    assert set(state["optimizer"]["state"]) >= {"drafter.fc.weight", "drafter.lm_head.weight"}

    stats = train_job(s, inputs(data, out), str(tmp_path / "b.log"))
    assert stats["resumed_from_step"] == 4 and stats["steps"] == 7
    assert (out / "log.csv").read_bytes() == (tmp_path / "a" / "log.csv").read_bytes()
    a = Eagle3Drafter.from_pretrained(tmp_path / "a" / "drafter").state_dict()
    b = Eagle3Drafter.from_pretrained(out / "drafter").state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
