"""Cluster preemption of training through a real SLURM: `scontrol requeue` of a running train job.

SLURM ends the running job with SIGTERM and, KillWait seconds later (30 s by default), SIGKILL, and
puts it back in the queue (https://slurm.schedmd.com/scontrol.html, `requeue`;
https://slurm.schedmd.com/slurm.conf.html#OPT_KillWait). The train job must checkpoint on the SIGTERM
within that grace period and exit; the requeued run must resume from that checkpoint, not from zero,
and end with the weights of an uninterrupted run, bitwise on CPU.

The job is the training CLI (`eyas.train.job`, what the train rule runs) under `tests/train_worker.py`,
held after step 2 so the requeue lands mid-run at a known step: it goes on once its SIGTERM handler
has logged the request. Needs the single-node SLURM of `tests/cluster/slurm_up.sh` and EYAS_SLURM=1
(`.ci/run` does both); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train_faults import PREEMPT, _spec, assert_same_weights
from trainkit import csv_rows, run, settings

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.environ.get("EYAS_SLURM") != "1", reason="needs EYAS_SLURM=1 and a running SLURM"),
]
REPO = Path(__file__).parents[2]
DEADLINE_S = 300


@pytest.fixture(autouse=True)
def _slurm_to_itself(slurm_lock):  # pytest-xdist may run the cluster test beside this file
    with slurm_lock():
        yield


def _scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True
    )
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def _wait(what: str, ready, job_id: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        state = _scontrol_job(job_id).get("JobState")
        assert state not in {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}, (what, state)
        assert time.monotonic() < deadline, f"SLURM job {job_id}: no {what} after {DEADLINE_S} s ({state})"
        time.sleep(0.2)


def test_scontrol_requeue_mid_training_resumes_from_the_sigterm_checkpoint(data, tmp_path, ledger):
    torch.set_num_threads(1)
    s = settings(**PREEMPT)
    run(data, tmp_path / "reference", s)
    out = tmp_path / "run"
    spec, stats_path = _spec(data, out, tmp_path, s)
    job_log = tmp_path / "slurm-%j.out"
    worker = REPO / "tests" / "train_worker.py"
    submit = [
        "sbatch", "--parsable", "--requeue", "--job-name=eyas-preempt", f"--chdir={REPO}",
        "--ntasks=1", "--cpus-per-task=1", "--mem=2000", "--time=10", f"--output={job_log}",
        "--open-mode=append",  # both runs' output in one file
        f"--wrap=exec {sys.executable} {worker} {spec} 2 hold",
    ]  # fmt: skip
    with ledger.case(
        "fault", "SLURM scontrol requeue mid-training", "SIGTERM checkpoint; requeued run equal"
    ):
        started = time.monotonic()
        job_id = (
            subprocess.run(submit, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
        )
        try:
            _wait("step 2", lambda: csv_rows(out / "log.csv.partial") >= 2, job_id)
            subprocess.run(["scontrol", "requeue", job_id], check=True)
            log = Path(str(job_log).replace("%j", job_id))
            _wait(
                "SIGTERM in the job's log",
                lambda: log.exists() and "SIGTERM received" in log.read_text(),
                job_id,
            )
            Path(f"{spec}.go").touch()  # the held step goes on; the next one stops with a checkpoint
            # SLURM holds a requeued job back for a while (measured: 150 s with SLURM 22.05 here);
            # making it eligible at once keeps the test short, and changes nothing it checks
            again = {"PENDING", "RUNNING", "COMPLETED"}
            _wait("the requeued job", lambda: _scontrol_job(job_id).get("JobState") in again, job_id)
            if _scontrol_job(job_id).get("JobState") == "PENDING":
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
            _wait("completion", lambda: _scontrol_job(job_id).get("JobState") == "COMPLETED", job_id)
        finally:
            subprocess.run(["scancel", job_id], check=False)
        seconds = time.monotonic() - started
        info = _scontrol_job(job_id)
        assert info["Restarts"] == "1", info
        stats = json.loads(stats_path.read_text())
        assert stats["resumed_from_step"] == 3 and stats["steps"] == 7, stats  # resumed, not from zero
        assert (out / "log.csv").read_bytes() == (tmp_path / "reference" / "log.csv").read_bytes()
        assert_same_weights(out / "drafter", tmp_path / "reference" / "drafter")
        assert not (out / "drafter-checkpoint").exists()
        assert "stopped on SIGTERM after step 3 of 7" in log.read_text()  # the first run, in time
    print(f"\nSLURM preemption test: {seconds:.0f} s from sbatch to the requeued run's end")


# The same preemption, of the train job that Snakemake's SLURM executor submitted (`--profile
# profiles/slurm`), while that Snakemake waits: SLURM restarts the job under the same id, the executor
# sees it queued and running again, and the restarted job resumes from the SIGTERM checkpoint. The
# reference is the same train job run locally, uninterrupted, on a copy of the SLURM run's inputs.
WORKFLOW_CONFIG = REPO / "tests" / "workflow" / "config.yaml"
# all 6 epochs (24 steps, ~1-4 s each: time to land mid-run); the only checkpoint is the SIGTERM one
ALL_EPOCHS = "train={max_steps: null, checkpoint_every: 1000}"
TRAIN = "results/train/log.csv"


def _snakemake(workdir: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "snakemake", "-d", str(workdir), "--configfile", str(WORKFLOW_CONFIG),
        "--config", ALL_EPOCHS, *args, TRAIN,
    ]  # fmt: skip


def _train_job_id(workdir: Path) -> str | None:
    """The SLURM id of the executor's train job in `workdir` (its comment names the rule)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%k|%Z"], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        job_id, comment, job_dir = line.split("|")
        if comment == "rule_train" and Path(job_dir) == workdir:
            return job_id
    return None


def _requeue_train_mid_run(workdir: Path, snakemake: subprocess.Popen) -> str:
    deadline = time.monotonic() + 2 * DEADLINE_S
    partial = workdir / "results" / "train" / "log.csv.partial"
    while (job_id := _train_job_id(workdir)) is None or csv_rows(partial) < 2:
        assert snakemake.poll() is None, "Snakemake ended before the train job ran"
        assert time.monotonic() < deadline, "no train job at step 2 in time"
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    again = {"PENDING", "RUNNING", "COMPLETED"}
    _wait("the requeued job", lambda: _scontrol_job(job_id).get("JobState") in again, job_id)
    if _scontrol_job(job_id).get("JobState") == "PENDING":  # held back ~150 s otherwise (above)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
    return job_id


def test_requeue_of_the_train_job_snakemake_submitted_resumes_through_snakemake(tmp_path, ledger):
    workdir, reference = tmp_path / "slurm", tmp_path / "reference"
    profiles = ("--profile", "profiles/slurm", "--profile", "tests/cluster/site")
    with ledger.case(
        "fault",
        "SLURM requeue of the train job Snakemake's SLURM executor submitted",
        "the same Snakemake run ends with the restarted job resumed from the SIGTERM checkpoint",
    ):
        output = tmp_path / "snakemake.out"
        with open(output, "w") as out:
            run_ = subprocess.Popen(_snakemake(workdir, *profiles), cwd=REPO, stdout=out, stderr=out)
            try:
                job_id = _requeue_train_mid_run(workdir, run_)
                assert run_.wait(timeout=2 * DEADLINE_S) == 0, output.read_text()[-6000:]
            finally:
                if run_.poll() is None:
                    run_.kill()
        assert _scontrol_job(job_id)["Restarts"] == "1"
        text = output.read_text()
        assert text.count("rule train:") == 1, text[-6000:]  # one submission: SLURM restarted it
        log = (workdir / "results" / "logs" / "train.log").read_text()
        header = (
            f"--- SLURM job {job_id}, restart 1: SLURM requeued this job (preemption, `scontrol requeue`) ---"
        )
        assert log.splitlines()[0] == header, log[:2000]
        resumed = re.search(r"resuming from \S*drafter-checkpoint at step (\d+)", log)
        assert resumed, log[-4000:]
        stats = json.loads(re.search(r"train: (\{.*\})", log).group(1))
        # resumed mid-run from the checkpoint only SIGTERM writes here, not from zero
        assert 0 < stats["resumed_from_step"] == int(resumed.group(1)) < stats["steps"] == 24, stats
        assert not (workdir / "results" / "train" / "drafter-checkpoint").exists()

        # the uninterrupted reference: the same job, locally, on a copy of the run's inputs
        shutil.copytree(workdir, reference, symlinks=True, ignore=shutil.ignore_patterns("locks"))
        shutil.rmtree(reference / "results" / "train")
        done = subprocess.run(_snakemake(reference, "--cores", "2"), cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        assert re.findall(r"^(?:local)?rule (\w+):", done.stdout + done.stderr, re.M) == [
            "train"
        ]  # only it reran
        assert (workdir / TRAIN).read_bytes() == (reference / TRAIN).read_bytes()
        assert_same_weights(workdir / "results/train/drafter", reference / "results/train/drafter")
