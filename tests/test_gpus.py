"""GPU slot allocator: concurrent processes get distinct devices; a killed holder frees its slot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eyas.core.gpus import claim_gpus, local_run, lock_dir, visible_gpus

# A claimant: takes N GPUs, reports CUDA_VISIBLE_DEVICES in a file named by its pid, then waits for
# the release file to appear (or for a signal).
CLAIMANT = """
import os, sys, time
from pathlib import Path
from eyas.core.gpus import claim_gpus
out, n, timeout = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
try:
    claim_gpus(n, timeout=timeout, poll=0.05)
    tmp = out / f"{os.getpid()}.tmp"
    tmp.write_text(os.environ["CUDA_VISIBLE_DEVICES"])
    tmp.rename(out / f"{os.getpid()}.claimed")  # whole or absent: the test reads it as soon as it exists
except TimeoutError:
    (out / f"{os.getpid()}.timeout").write_text("")
    sys.exit(0)
while not (out / "release").exists():
    time.sleep(0.02)
"""


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_leftover_claimants():
    yield
    while _STARTED:  # a failed test must not leave claimants waiting for their release file
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(tmp_path: Path, n: int, devices: str, timeout: float = 30.0) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices, "EYAS_GPU_LOCK_DIR": str(tmp_path / "locks")}
    env.pop("SLURM_JOB_ID", None)
    proc = subprocess.Popen([sys.executable, "-c", CLAIMANT, str(tmp_path), str(n), str(timeout)], env=env)
    _STARTED.append(proc)
    return proc


def wait_for(path: Path, seconds: float = 30.0) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)
    return path.read_text()


def test_concurrent_processes_get_distinct_slots_and_wait_when_all_are_taken(tmp_path):
    holders = [start(tmp_path, 1, "0,1,2,3") for _ in range(4)]
    claimed = [wait_for(tmp_path / f"{p.pid}.claimed") for p in holders]
    assert sorted(claimed) == ["0", "1", "2", "3"]
    late = start(tmp_path, 1, "0,1,2,3", timeout=0.5)  # all four held: it times out, holding nothing
    assert late.wait(30) == 0 and (tmp_path / f"{late.pid}.timeout").exists()
    (tmp_path / "release").write_text("")
    assert [p.wait(30) for p in holders] == [0, 0, 0, 0]


def test_killed_holder_frees_its_slots(tmp_path):
    holder = start(tmp_path, 2, "3,5")
    assert wait_for(tmp_path / f"{holder.pid}.claimed") == "3,5"
    holder.send_signal(signal.SIGKILL)
    holder.wait(30)
    after = start(tmp_path, 2, "3,5", timeout=10)
    assert wait_for(tmp_path / f"{after.pid}.claimed") == "3,5"
    (tmp_path / "release").write_text("")
    assert after.wait(30) == 0


def test_claim_zero_is_a_no_op_and_too_many_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("EYAS_GPU_LOCK_DIR", str(tmp_path))
    assert claim_gpus(0) == []
    with pytest.raises(RuntimeError, match=r"asks for 2 GPU\(s\).*1 are visible"):
        claim_gpus(2)


def test_visible_gpus_and_lock_dir_follow_the_environment():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]  # CUDA stops at an invalid entry
    assert lock_dir({"EYAS_GPU_LOCK_DIR": "/x"}) == Path("/x")
    assert lock_dir({"EYAS_GPU_LOCK_DIR": "/x", "SLURM_JOB_ID": "7"}) == Path("/x/slurm-7")


def test_local_run_is_false_for_cluster_commands():
    assert local_run(["snakemake", "--cores", "2"])
    assert not local_run(["snakemake", "--profile", "profiles/slurm"])
    assert not local_run(["snakemake", "--executor=slurm"])
    assert not local_run(["snakemake", "-e", "slurm"])
