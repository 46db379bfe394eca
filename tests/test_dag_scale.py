"""A 10,000-shard config builds its DAG: the dry run completes and lists one extract job per shard.

How long it takes is measured in bench/dag.py (bench/results/dag.json), not asserted here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", output.split("Job stats:", 1)[1], flags=re.M))
    assert counts["extract"] == "10000" and counts["train"] == "1" and counts["evaluate"] == "1", counts
