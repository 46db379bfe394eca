"""The dry-run DAG of the CPU default and of the GPU recipe: GPU jobs ask for a GPU and a bounded
number of cores (CPU stages run beside them), and the throughput table has a benchmark of every job."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from dryrun import job_details, planned_jobs

pytestmark = pytest.mark.workflow

REPO = Path(__file__).parents[1]
CORES = 16
GPU_RULES = {"prompts", "regenerate", "extract", "train", "served", "evaluate"}  # config/gpu-smollm2.yaml


def dry_run(workdir: Path, *config: str) -> tuple[list[dict], dict[str, int]]:
    cmd = [sys.executable, "-m", "snakemake", "-n", "--forceall", "-d", str(workdir), "--cores", str(CORES)]
    cmd += ["--resources", "gpu=1", *config]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return job_details(output), planned_jobs(output)


@pytest.fixture(scope="module")
def gpu_recipe(tmp_path_factory):
    return dry_run(tmp_path_factory.mktemp("gpu"), "--configfile", str(REPO / "config" / "gpu-smollm2.yaml"))


@pytest.fixture(scope="module")
def cpu_default(tmp_path_factory):
    return dry_run(tmp_path_factory.mktemp("cpu"))


def test_gpu_jobs_ask_for_a_gpu_and_leave_cores_to_cpu_stages(gpu_recipe):
    jobs, _ = gpu_recipe
    on_gpu = {j["rule"] for j in jobs if int(j["resources"].get("gpu", 0)) > 0}
    assert on_gpu == GPU_RULES, on_gpu
    for job in jobs:
        if job["rule"] in GPU_RULES:
            assert job["threads"] <= CORES // 2, job  # half the cores or fewer: tokenize, validate fit beside
    # each CPU job fits beside the widest GPU job (validate, the widest, scans with 8 threads)
    # extraction's host side compresses and writes chunks on all but one of its threads
    assert {j["threads"] for j in jobs if j["rule"] == "extract"} == {8}
    widest_gpu_job = max(j["threads"] for j in jobs if j["rule"] in GPU_RULES)
    assert max(j["threads"] for j in jobs if j["rule"] not in GPU_RULES) <= CORES - widest_gpu_job


def test_cpu_jobs_keep_every_core(cpu_default):
    jobs, _ = cpu_default
    threads = {j["rule"]: j["threads"] for j in jobs}
    assert threads["train"] == CORES and threads["evaluate"] == CORES, threads
    assert threads["extract"] == 2, threads  # the forward and one writer; shards run side by side
    assert all(int(j["resources"].get("gpu", 0)) == 0 for j in jobs)


@pytest.mark.parametrize("run", ["cpu_default", "gpu_recipe"])
def test_throughput_table_has_a_benchmark_of_every_job(run, request):
    jobs, counts = request.getfixturevalue(run)
    (report,) = [j for j in jobs if j["rule"] == "report_figures"]
    prefix = "results/benchmarks/"
    stages = Counter(
        Path(p.removeprefix(prefix)).parts[0].removesuffix(".tsv")
        for p in report["input"]
        if p.startswith(prefix)
    )
    expected = {rule: n for rule, n in counts.items() if rule not in ("all", "report_figures")}
    assert stages == expected
    if run == "gpu_recipe":
        # one regenerate job for both splits (its engines start once)
        assert stages["regenerate"] == 1 and stages["validate"] == 2 and stages["served"] == 1
        assert stages["prompts"] == 1
