"""The sweep's figures from a training run's epochs.csv, and the tau-vs-data points and plot made of them
(bench/studies/recipe_sweep.py, bench/studies/plot_tau_vs_data.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eyas.train.csvlog import write_epochs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def studies():
    sys.path.insert(0, str(ROOT / "bench" / "studies"))
    try:
        import plot_tau_vs_data
        import recipe_sweep
    finally:
        sys.path.pop(0)
    return recipe_sweep, plot_tau_vs_data


def epoch(n: int, sim: float, walked: list[float]) -> dict:
    return {"epoch": n, "step": 10 * (n + 1), "complete": True, "samples": 4, "padded_microbatches": 0,
            "simulated_tau": sim, "conditional_accuracy": [0.5, 0.4, 0.3], "accuracy": [0.5, 0.3, 0.2],
            "walked_tau_by_k": walked}  # fmt: skip


def test_the_kept_epochs_walked_tau_reaches_the_tau_vs_data_points(tmp_path, studies):
    recipe_sweep, plot_tau_vs_data = studies
    csv_path = tmp_path / "epochs.csv"
    # the second epoch has the best simulated tau, so training keeps it
    write_epochs(csv_path, [epoch(0, 1.6, [1.3, 1.4, 1.45]), epoch(1, 1.9, [1.4, 1.55, 1.6]),
                            epoch(2, 1.8, [1.5, 1.6, 1.7])], 3)  # fmt: skip
    figures = recipe_sweep.best_epoch(csv_path)
    assert figures["sim_tau_by_epoch"] == [1.6, 1.9, 1.8] and figures["best_sim_tau"] == 1.9
    assert figures["best_walked_tau_by_k"] == [1.4, 1.55, 1.6]
    assert figures["walked_tau_by_k_by_epoch"][2] == [1.5, 1.6, 1.7]

    report = tmp_path / "recipe-curve.json"
    variants = {
        "tb-100": {**figures, "served_tau": {"3": 1.5, "5": 1.52}, "train_seconds": 10.0},
        "tb-50": {**figures, "best_walked_tau_by_k": None, "served_tau": {"3": 1.4}},  # an older report
        "tb-25": {**figures},  # not served: left out
    }
    report.write_text(json.dumps({"status": "done", "variants": variants}))
    found = plot_tau_vs_data.points([report])
    assert [p["percent"] for p in found] == [50, 100]
    assert found[1]["walked_tau"] == {"3": 1.6, "5": None}  # k = 5: past the 3 TTT steps measured
    assert found[0]["walked_tau"] == {"3": None}
    plot_tau_vs_data.plot(found, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
