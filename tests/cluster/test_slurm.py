"""The tiny workflow on a real SLURM, through `--profile profiles/slurm`, equals a local run.

Needs the single-node SLURM of `tests/cluster/slurm_up.sh` (munge, slurmdbd + mariadb, slurmctld,
slurmd, two fake GPUs as GRES) and `EYAS_SLURM=1`; `.ci/run` does both. Skipped otherwise.
The SLURM run goes through the site profile `tests/cluster/site/` (partition, account, this machine's
sizes), i.e. the documented way to add site settings. Each step's wall time is printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from safetensors.numpy import load_file

REPO = Path(__file__).parents[2]
CONFIG = REPO / "tests" / "workflow" / "config.yaml"
SPLITS = {"train": 2, "eval": 1}  # shards per split in tests/workflow/config.yaml
GPU_RULES = {"extract": 3, "train": 1, "specdec": 2, "evaluate": 1}  # GPU jobs under profiles/slurm

pytestmark = [
    pytest.mark.cluster,
    # Snakemake's timestamp file inside a directory() output is not part of the Zarr hierarchy
    pytest.mark.filterwarnings("ignore:Object at .snakemake_timestamp"),
    pytest.mark.skipif(os.environ.get("EYAS_SLURM") != "1", reason="needs EYAS_SLURM=1 and a running SLURM"),
]


def snakemake(workdir: Path, *args: str) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "snakemake", "-d", str(workdir), "--configfile", str(CONFIG), *args]
    start = time.monotonic()
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    return time.monotonic() - start, output


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request, slurm_lock):
    root = tmp_path_factory.mktemp("cluster")
    local, slurm = root / "local", root / "slurm"
    seconds_local, _ = snakemake(local, "--cores", "2")
    with slurm_lock():
        since = time.strftime("%Y-%m-%dT%H:%M:%S")
        seconds_slurm, output = snakemake(
            slurm, "--profile", "profiles/slurm", "--profile", "tests/cluster/site"
        )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown even under -q, in CI's log
        print(f"\ncluster test: local run {seconds_local:.0f} s, SLURM run {seconds_slurm:.0f} s")
    steps = int(re.findall(r"(\d+) of \1 steps \(100%\) done", output)[-1])
    return local / "results", slurm / "results", since, slurm, steps


def sacct_jobs(since: str, workdir: Path) -> list[dict[str, str]]:
    fields = ["JobID", "JobName", "State", "AllocTRES", "WorkDir"]
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-S", since, "-o", ",".join(fields)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    jobs = [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line]
    return [j for j in jobs if Path(j["WorkDir"]) == workdir]


def test_every_job_ran_as_a_slurm_job_and_gpu_jobs_got_a_gpu(runs):
    _, slurm_results, since, workdir, steps = runs
    jobs = sacct_jobs(since, workdir)
    assert len(jobs) == steps - 1, jobs  # every job but the target rule `all`, which runs in Snakemake
    assert {j["State"] for j in jobs} == {"COMPLETED"}, jobs
    with_gpu = [j for j in jobs if "gres/gpu=1" in j["AllocTRES"]]
    assert len(with_gpu) == sum(GPU_RULES.values()), jobs
    # each extraction job saw exactly the one GPU SLURM bound to it (CUDA_VISIBLE_DEVICES) and claimed it
    for split, shards in SPLITS.items():
        for shard in range(shards):
            log = (slurm_results / "logs" / "extract" / f"{split}-{shard:05d}.log").read_text()
            assert re.search(r"GPU slot\(s\) \['(\d)'\] of \['\1'\]", log), log[-2000:]


def assert_group_equal(a: Path, b: Path) -> None:
    ga, gb = zarr.open_group(a, mode="r"), zarr.open_group(b, mode="r")
    assert dict(ga.attrs) == dict(gb.attrs), (a, b)
    names = sorted(name for name, _ in ga.arrays())
    assert names == sorted(name for name, _ in gb.arrays()) and names, (a, b)
    for name in names:
        x, y = ga[name][:], gb[name][:]
        assert x.dtype == y.dtype and x.shape == y.shape, (a, name)
        assert x.tobytes() == y.tobytes(), f"{a.name}/{name} differs bitwise"


def test_token_and_hidden_stores_equal_the_local_run_bitwise(runs):
    local, slurm, _, _, _ = runs
    for split, shards in SPLITS.items():
        for shard in range(shards):
            name = f"shard-{shard:05d}.zarr"
            assert_group_equal(local / "tokens" / split / name, slurm / "tokens" / split / name)
            assert_group_equal(local / "hidden" / split / name, slurm / "hidden" / split / name)
    for name in ("train.jsonl", "eval.jsonl", "rejects.jsonl", "stats.json"):
        assert (local / "prepared" / name).read_bytes() == (slurm / "prepared" / name).read_bytes(), name
    v_local = load_file(local / "vocab" / "draft_vocab.safetensors")
    v_slurm = load_file(slurm / "vocab" / "draft_vocab.safetensors")
    assert v_local.keys() == v_slurm.keys()
    for key in v_local:
        np.testing.assert_array_equal(v_local[key], v_slurm[key])


def test_drafter_equals_the_local_run_bitwise(runs):
    # CPU training with the same thread count (tests/cluster/site sets train to 2, like --cores 2)
    local, slurm, _, _, _ = runs
    a = load_file(local / "train" / "drafter" / "model.safetensors")
    b = load_file(slurm / "train" / "drafter" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].tobytes() == b[key].tobytes(), key


def test_summary_deterministic_fields_equal_the_local_run(runs):
    local, slurm, _, _, _ = runs
    a = json.loads((local / "eval" / "summary.json").read_text())
    b = json.loads((slurm / "eval" / "summary.json").read_text())
    assert a["headline"]["greedy_equal"] is b["headline"]["greedy_equal"] is True
    for key in ("tau", "tau_untrained", "simulated_tau", "greedy_mismatches"):
        assert a["headline"][key] == b["headline"][key], key
