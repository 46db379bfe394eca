"""The GPU recipe's settings through Snakemake on the CPU, before a GPU campaign spends device time on them.

`config/gpu-smollm2.yaml` with `tests/workflow/gpu-recipe-on-cpu.yaml` over it: Hugging Face engines on
the CPU, tiny sizes, every other setting the recipe's. A combination that had never run under Snakemake
cost a campaign its train job on 2026-12-07 (the reader processes' forkserver re-ran the train script).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import zarr

pytestmark = pytest.mark.workflow

REPO = Path(__file__).parents[1]
CONFIGS = [REPO / "config" / "gpu-smollm2.yaml", REPO / "tests" / "workflow" / "gpu-recipe-on-cpu.yaml"]


def test_the_gpu_recipe_settings_run_through_snakemake_on_the_cpu(tmp_path):
    cmd = [sys.executable, "-m", "snakemake", "-d", str(tmp_path), "--cores", "2", "--configfile"]
    result = subprocess.run([*cmd, *map(str, CONFIGS)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    results = tmp_path / "results"

    prompts = json.loads((results / "prompts" / "target.stats.json").read_text())
    assert prompts["conversations"] == 6 and prompts["kept"] + prompts["rejected"] == 6
    regenerated = json.loads((results / "regenerated" / "train.stats.json").read_text())
    assert regenerated["samples_written"] == 2 * regenerated["regenerated"] > 0

    store = zarr.open_group(results / "hidden" / "train" / "shard-00000.zarr", mode="r")
    assert store["aux"].dtype == "uint8"  # fp8 e4m3 bits
    assert store.attrs["storage"] == "fp8_e4m3"

    train_log = (results / "logs" / "train.log").read_text()
    stats = json.loads(train_log.rsplit("train: ", 1)[1].splitlines()[0])
    assert stats["steps"] == 3
    assert len(stats["epochs"][0]["walked_tau_by_k"]) == 3  # held-out metrics ran, one per TTT step
    assert (results / "train" / "drafter" / "model.safetensors").is_file()
    summary = json.loads((results / "eval" / "summary.json").read_text())
    assert summary["meta"]["sets"]["heldout"]["prompts"] >= 1
    assert set(summary["headline"]["tau_by_set"]) == {"heldout", "humaneval"}
