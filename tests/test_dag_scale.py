"""A 10,000-shard config builds its DAG: the dry run completes and lists one extract job per shard.

How long it takes is measured in bench/dag.py (bench/results/dag.json), not asserted here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dryrun import planned_jobs

pytestmark = pytest.mark.workflow

REPO = Path(__file__).parents[1]


def test_dry_run_of_10000_shards_lists_every_extract_job(tmp_path):
    config = tmp_path / "shards.yaml"
    config.write_text("tokenize:\n  train_shards: 9900\n  eval_shards: 100\n")
    cmd = [sys.executable, "-m", "snakemake", "-n", "-q", "rules", "-d", str(tmp_path)]
    cmd += ["--configfile", str(config)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    counts = planned_jobs(output)
    assert counts["extract"] == 10000 and counts["train"] == 1 and counts["evaluate"] == 1, counts


def test_planned_jobs_reads_the_job_stats_table_and_refuses_other_output():
    table = ["Job stats:", "job        count", "-------  -------", "extract        3", "train          1"]
    output = "\n".join(["Building DAG of jobs...", *table, "total          4", "", "Reasons:"])
    assert planned_jobs(output) == {"extract": 3, "train": 1}
    assert planned_jobs("Nothing to be done (all requested files are present).") == {}
    with pytest.raises(ValueError, match="Job stats"):
        planned_jobs("WorkflowError: something else")


def test_served_backend_plans_one_served_job_beside_the_hf_sets(tmp_path):
    """evaluate.backend both: one `served` job for every set and k, the HF `specdec` job per set
    (prompt files included), one `regenerate` job for both splits through SGLang; sglang alone: no
    specdec job."""
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"instruction": "Say hi"}\n')
    config = tmp_path / "served.yaml"
    config.write_text(
        "evaluate:\n  backend: both\n  num_draft_tokens: [3, 5]\n"
        f"  sets: [heldout, {{name: mine, path: {prompts}, format: alpaca}}]\n"
        "regenerate: {enabled: true, backend: sglang}\n"
    )
    cmd = [sys.executable, "-m", "snakemake", "-n", "-q", "rules", "-d", str(tmp_path)]
    result = subprocess.run([*cmd, "--configfile", str(config)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    counts = planned_jobs(result.stdout + result.stderr)
    assert counts["served"] == 1 and counts["specdec"] == 2 and counts["regenerate"] == 1, counts
    config.write_text(config.read_text().replace("backend: both", "backend: sglang"))
    result = subprocess.run([*cmd, "--configfile", str(config)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    counts = planned_jobs(result.stdout + result.stderr)
    assert counts["served"] == 1 and "specdec" not in counts and counts["evaluate"] == 1, counts
