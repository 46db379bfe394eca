"""Killed runs recover with `--rerun-incomplete` (set in profiles/default/), on the real workflow.

Two ways a run dies while an extraction job runs:
- the whole job is killed (node lost, `scancel`): nothing that looks finished is left (outputs are
  atomic), and the rerun makes the store again, bitwise equal;
- only Snakemake dies (login session lost) while the job finishes on its own: the store exists but
  Snakemake never recorded it as complete, so without `--rerun-incomplete` Snakemake refuses to go on;
  with it (the default profile) it reruns exactly that job.
Either way a killed Snakemake leaves its lock: `snakemake --unlock` first, as the README says.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zarr
from dryrun import planned_jobs

pytestmark = pytest.mark.workflow

REPO = Path(__file__).parents[1]
CONFIG = REPO / "tests" / "workflow" / "config.yaml"
STORE = "results/hidden/train/shard-00000.zarr"
LOG = "results/logs/extract/train-00000.log"


def command(workdir: Path, *args: str) -> list[str]:
    small = workdir / "small.yaml"  # fewer conversations than the workflow test: a quicker extraction
    small.write_text("data: {max_conversations: 10}\ntokenize: {train_shards: 1}\n")
    config = ["--configfile", str(CONFIG), str(small)]
    return [sys.executable, "-m", "snakemake", "-d", str(workdir), *config, "--cores", "2", *args]


def snakemake(workdir: Path, *args: str, ok: bool = True) -> str:
    result = subprocess.run(command(workdir, *args), cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert (result.returncode == 0) == ok, output[-6000:]
    return output


def start(workdir: Path, *args: str) -> subprocess.Popen:
    # its own process group: the job's processes can be killed with it, and only they
    return subprocess.Popen(
        command(workdir, *args),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_until(condition, what: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def aux(workdir: Path) -> bytes:
    return zarr.open_group(workdir / STORE, mode="r")["aux"][:].tobytes()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("rerun")
    snakemake(workdir, STORE)  # model, data, tokens and one finished store
    return workdir


def test_killed_job_leaves_nothing_finished_and_reruns_to_the_same_store(workdir):
    before = aux(workdir)
    (workdir / LOG).unlink()
    run = start(workdir, "--forcerun", STORE)
    wait_until(lambda: (workdir / LOG).exists(), "the extraction job to start")
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    wait_until(lambda: group_gone(run.pid), "the killed job's processes to exit")
    assert not (workdir / STORE).exists()  # atomic output: a killed job leaves no finished-looking store

    snakemake(workdir, "--unlock")
    assert planned_jobs(snakemake(workdir, "-n", STORE)) == {"extract": 1}
    snakemake(workdir, STORE)
    assert aux(workdir) == before
    assert planned_jobs(snakemake(workdir, "-n", STORE)) == {}


def test_killed_snakemake_marks_the_job_incomplete_and_rerun_incomplete_redoes_it(workdir):
    before = aux(workdir)
    (workdir / LOG).unlink()
    run = start(workdir, "--forcerun", STORE)
    wait_until(lambda: (workdir / LOG).exists(), "the extraction job to start")
    os.kill(run.pid, signal.SIGKILL)  # Snakemake only: the job's script runs on and finishes
    run.wait()
    wait_until(lambda: group_gone(run.pid), "the orphaned job to finish")
    assert aux(workdir) == before  # the job completed, but Snakemake never recorded it

    snakemake(workdir, "--unlock")
    refused = snakemake(workdir, "-n", "--workflow-profile", "none", STORE, ok=False)
    assert "IncompleteFilesException" in refused and STORE in refused
    # profiles/default sets rerun-incomplete: the same command plans exactly that job again
    assert planned_jobs(snakemake(workdir, "-n", STORE)) == {"extract": 1}
    snakemake(workdir, STORE)
    assert aux(workdir) == before
    assert planned_jobs(snakemake(workdir, "-n", STORE)) == {}


# --------------------------------------------------------------------------- evaluation sets, one job each
SUMMARY = "results/eval/summary.json"


def _sets_config(workdir: Path, *names: str) -> str:
    sets = ", ".join(["heldout", *(f"{{name: {n}, path: {n}.jsonl, format: alpaca}}" for n in names)])
    path = workdir / f"sets-{'-'.join(names) or 'none'}.yaml"
    path.write_text(f"evaluate: {{sets: [{sets}]}}\n")
    return str(path)


def _dry_run(workdir: Path, config: str, *args: str) -> str:
    cmd = [sys.executable, "-m", "snakemake", "-d", str(workdir), "--configfile", config, "--cores", "2"]
    result = subprocess.run([*cmd, *args, SUMMARY], cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def test_adding_or_removing_a_set_reruns_only_its_job_and_the_merge(tmp_path):
    """Every job up to the summary recorded as done (`--touch`, on stand-in outputs: Snakemake keeps the
    params it would rerun on), then a set added: its specdec job and the merge are planned, not the other
    sets' jobs ("params have changed" was the reason before); a set removed: only the merge."""
    for name in ("mine", "other"):
        (tmp_path / f"{name}.jsonl").write_text('{"instruction": "Say hi", "output": "Hi"}\n')
    config = _sets_config(tmp_path, "mine")
    outputs = set()
    for line in _dry_run(tmp_path, config, "-n", "--forceall").splitlines():
        if line.startswith("    output: "):
            outputs.update(line.removeprefix("    output: ").split(", "))
    for output in outputs:  # directory() outputs (model, token shards, stores, drafter) have no suffix
        path = tmp_path / output
        if path.suffix in (".json", ".jsonl", ".csv", ".safetensors", ".png"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("stand-in\n")
        else:
            path.mkdir(parents=True, exist_ok=True)
    _dry_run(tmp_path, config, "--touch")
    assert planned_jobs(_dry_run(tmp_path, config, "-n")) == {}
    added = planned_jobs(_dry_run(tmp_path, _sets_config(tmp_path, "mine", "other"), "-n"))
    assert added == {"specdec": 1, "evaluate": 1}, added
    removed = planned_jobs(_dry_run(tmp_path, _sets_config(tmp_path), "-n"))
    assert removed == {"evaluate": 1}, removed
