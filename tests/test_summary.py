"""summary.json fields and the acceptance PNG, from real evaluate_specdec reports on the tiny target."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from figkit import assert_figure_png, series

from eyas.evaluate.specdec import evaluate_specdec
from eyas.evaluate.summary import SUMMARY_FORMAT, plot_acceptance, write_summary
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import read_config

AUX = [0, 1, 2]
OFFLINE = {
    "ttt_steps": 3,
    "num_samples": 4,
    "num_tokens": 40,
    "num_batches": 1,
    "count": [23, 20, 0],
    "accuracy": [0.6, 0.5, None],  # a step without positions reports None
    "cond_count": [23, 14, 0],
    "conditional_accuracy": [0.6, 0.4, None],
    "loss": [2.0, 2.5, None],
    "simulated_tau": 1.84,
    "simulated_tau_by_k": [1.6, 1.84, 1.84],
    "walked_tau_by_k": [1.5, 1.7, 1.7],
    "seconds": 0.1,
}


def inputs(trained: dict, untrained: dict, humaneval: dict | None = None) -> dict:
    specdec = {"heldout": {"trained": trained, "untrained": untrained}}
    if humaneval:
        specdec["humaneval"] = humaneval
    return {
        "offline": {"trained": OFFLINE, "untrained": {**OFFLINE, "simulated_tau": 1.1}},
        "specdec": specdec,
    }


@pytest.fixture(scope="module")
def reports(tiny_model_dir):
    torch.set_num_threads(1)
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        drafter = Eagle3Drafter(DrafterConfig.from_target_config(read_config(tiny_model_dir), 1024, AUX))
        out.append(
            evaluate_specdec(
                tiny_model_dir,
                drafter,
                [[1, 42, 977], [5, 6, 7, 8]],
                max_new_tokens=6,
                num_draft_tokens=2,
                eos_token_ids={2},
                aux_layer_ids=AUX,
            )
        )
    return out


def test_writes_json_and_png(tmp_path, reports):
    trained, untrained = reports
    out_json, out_plot = tmp_path / "eval" / "summary.json", tmp_path / "eval" / "acceptance.png"
    meta = {"model_id": "tiny", "drafter": "results/train/drafter"}
    summary = write_summary(out_json, out_plot, **inputs(trained, untrained), meta=meta)
    on_disk = json.loads(out_json.read_text())
    assert on_disk == summary
    assert on_disk["format"] == SUMMARY_FORMAT and on_disk["meta"] == meta
    head = on_disk["headline"]
    assert head["tau"] == trained["tau"] and head["tau_untrained"] == untrained["tau"]
    assert head["speedup"] == trained["speedup"] and head["simulated_tau"] == 1.84
    assert head["greedy_equal"] is True and head["greedy_mismatches"] == 0
    assert on_disk["specdec"]["acceptance_by_position"] == trained["acceptance_by_position"]
    assert len(on_disk["specdec_untrained"]["acceptance_by_position"]) == 2
    assert "per_prompt" not in on_disk["specdec"]
    assert on_disk["offline"]["accuracy"] == [0.6, 0.5, None]
    rows = {(r["set"], r["drafter"]): r for r in on_disk["table"]}
    assert (
        rows["heldout", "untrained"]["simulated_tau"] == 1.1
        and rows["heldout", "trained"]["tau"] == head["tau"]
    )
    # the offline figures at the row's k = 2 (index 1 of the by-k lists)
    assert (rows["heldout", "trained"]["walked_tau_k"], rows["heldout", "trained"]["simulated_tau_k"]) == (
        1.7,
        1.84,
    )
    assert head["tau_by_set"] == {"heldout": {"trained": trained["tau"], "untrained": untrained["tau"]}}
    assert sorted(p.name for p in out_json.parent.iterdir()) == ["acceptance.png", "summary.json"]

    assert_figure_png(out_plot, (10, 4))
    shown = plot_acceptance(on_disk, tmp_path / "again.png")  # the same figure, with what it plotted
    assert (tmp_path / "again.png").read_bytes() == out_plot.read_bytes()
    real = {line["label"].split(" (")[0]: line["y"] for line in series(shown, "Real speculative")["lines"]}
    for name, report in (("trained", trained), ("untrained", untrained)):
        want = [math.nan if a is None else a for a in report["acceptance_by_position"]]
        np.testing.assert_equal(real[name], want)  # NaN where a position was never attempted
    offline = {line["label"]: line["y"] for line in series(shown, "Offline")["lines"]}
    assert offline["accuracy"][:2] == [0.6, 0.5] and math.isnan(offline["accuracy"][2])


def test_mismatches_and_nan_are_reported(tmp_path, reports):
    trained = {**reports[0], "tau": float("nan")}
    trained["greedy_equal"] = {**trained["greedy_equal"], "mismatch_count": 1, "mismatches": [{"prompt": 1}]}
    summary = write_summary(
        tmp_path / "s.json",
        tmp_path / "a.png",
        **inputs(trained, reports[1]),
        meta={},
    )
    assert summary["headline"]["greedy_equal"] is False and summary["headline"]["greedy_mismatches"] == 1
    assert summary["headline"]["tau"] is None  # NaN is not JSON
    assert json.loads((tmp_path / "s.json").read_text())["specdec"]["tau"] is None


def test_bad_inputs_name_the_field(tmp_path, reports):
    trained, untrained = reports
    incomplete = {k: v for k, v in trained.items() if k != "speedup"}
    with pytest.raises(ValueError, match=r"specdec\[heldout\]\[trained\] lacks field.*speedup"):
        write_summary(
            tmp_path / "s.json",
            tmp_path / "a.png",
            **inputs(incomplete, untrained),
            meta={},
        )
    with pytest.raises(ValueError, match="drafts per pass differ.*baselines must match"):
        write_summary(
            tmp_path / "s.json",
            tmp_path / "a.png",
            **inputs(trained, {**untrained, "num_draft_tokens": 5}),
            meta={},
        )
    assert not list(tmp_path.iterdir())  # nothing written on a refusal


def test_several_sets_and_baselines(tmp_path, reports):
    trained, untrained = reports
    other = {"trained": untrained, "untrained": trained, "fp8_store": trained}
    summary = write_summary(
        tmp_path / "s.json", tmp_path / "a.png", **inputs(trained, untrained, other), meta={}
    )
    assert summary["headline"]["set"] == "heldout" and summary["headline"]["tau"] == trained["tau"]
    assert summary["headline"]["tau_by_set"]["humaneval"]["fp8_store"] == trained["tau"]
    assert len(summary["table"]) == 5
    assert [r["simulated_tau"] for r in summary["table"] if r["drafter"] == "fp8_store"] == [
        None
    ]  # no offline run
    with pytest.raises(ValueError, match="humaneval.*lacks the untrained"):
        write_summary(
            tmp_path / "s.json",
            tmp_path / "a.png",
            **inputs(trained, untrained, {"trained": trained}),
            meta={},
        )


def test_without_the_untrained_control_its_fields_are_null(tmp_path, reports):
    trained, _ = reports
    specdec = {"heldout": {"trained": trained}, "humaneval": {"trained": trained}}
    out_plot = tmp_path / "a.png"
    summary = write_summary(
        tmp_path / "s.json", out_plot, offline={"trained": OFFLINE}, specdec=specdec, meta={}
    )
    head = summary["headline"]
    assert head["tau"] == trained["tau"] and head["tau_untrained"] is None
    assert head["speedup_untrained"] is None and summary["specdec_untrained"] is None
    assert {r["drafter"] for r in summary["table"]} == {"trained"} and out_plot.stat().st_size > 0
    with pytest.raises(ValueError, match="heldout.*lacks the trained"):
        write_summary(tmp_path / "s.json", out_plot, offline={"trained": OFFLINE},
                      specdec={"heldout": {"other": trained}}, meta={})  # fmt: skip
