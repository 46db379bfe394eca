"""Report figures: tau table, loss curve and stage throughput from real-format inputs."""

from __future__ import annotations

import csv

import pytest
from figkit import assert_figure_png, series

from eyas.evaluate.report import (
    plot_loss,
    plot_throughput,
    read_benchmarks,
    read_loss_log,
    tau_table,
    write_tsv,
)

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def bench(path, s, rss, cpu):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{s}\t0:00:01\t{rss}\t1\t1\t1\t0\t0\t0\t{cpu}\n")
    return str(path)


def test_benchmarks_aggregate_per_stage(tmp_path):
    root = tmp_path / "benchmarks"
    paths = [
        bench(root / "prepare.tsv", 1.5, 100.0, 1.0),
        bench(root / "extract" / "train-00000.tsv", 10.0, 900.0, 18.0),
        bench(root / "extract" / "train-00001.tsv", 12.0, 950.0, 20.0),
    ]
    rows = {r["stage"]: r for r in read_benchmarks(root, paths)}
    assert rows["extract"] == {
        "stage": "extract",
        "jobs": 2,
        "wall_s": 22.0,
        "cpu_s": 38.0,
        "max_rss_mb": 950.0,
    }
    assert rows["prepare"]["jobs"] == 1
    shown = plot_throughput(list(rows.values()), tmp_path / "t.png")
    write_tsv(list(rows.values()), tmp_path / "t.tsv")
    assert_figure_png(tmp_path / "t.png", (10, 4))
    time_bars = series(shown, "Time per stage")["bars"]
    assert [b["values"] for b in time_bars] == [[1.5, 22.0], [1.0, 38.0]]  # wall s, CPU s per stage
    assert series(shown, "Peak memory")["bars"][0]["values"] == [100.0, 950.0]
    with open(tmp_path / "t.tsv") as fh:
        table = list(csv.DictReader(fh, delimiter="\t"))
    assert [r["stage"] for r in table] == ["prepare", "extract"] and table[1]["wall_s"] == "22.000"
    (root / "bad.tsv").write_text("s\tcpu_time\n1\t1\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: benchmark lacks column\(s\) \['max_rss'\]"):
        read_benchmarks(root, [str(root / "bad.tsv")])


def test_loss_log_and_tau_table(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("step,epoch,lr,loss,acc_0,acc_1,tokens,grad_norm\n1,0,0.001,5.0,0.1,0.05,100,1.0\n"
                   "2,0,0.001,4.0,0.2,0.1,200,0.9\n")  # fmt: skip
    columns = read_loss_log(log)
    assert columns["loss"] == [5.0, 4.0] and columns["acc_1"] == [0.05, 0.1]
    shown = plot_loss(columns, tmp_path / "loss.png")
    assert_figure_png(tmp_path / "loss.png", (10, 4))
    (loss_line,) = series(shown, "Training loss")["lines"]
    assert (loss_line["x"], loss_line["y"]) == ([1.0, 2.0], [5.0, 4.0])
    by_step = {line["label"]: line["y"] for line in series(shown, "accuracy by TTT step")["lines"]}
    assert by_step == {"step 1": [0.1, 0.2], "step 2": [0.05, 0.1]}
    log.write_text("step,loss\n1,nan-ish\n")
    with pytest.raises(ValueError, match="column 'loss' is not numeric"):
        read_loss_log(log)
    summary = {
        "table": [
            {"set": "heldout", "drafter": "trained", "tau": 2.5, "simulated_tau": 2.8, "speedup": 1.4,
             "spec_tokens_per_s": 30.0, "acceptance_by_position": [0.7, 0.5]},
        ]
    }  # fmt: skip
    (row,) = tau_table(summary)
    assert row["accept_pos2"] == 0.5 and row["simulated_tau"] == 2.8
    assert (row["backend"], row["k"], row["tokens_per_s_batched"]) == ("hf", 2, None)


def test_benchmarks_of_every_stage_keep_pipeline_order(tmp_path):
    """The stages rules/common.smk's benchmark_files() lists beyond the core ones: fetches, regenerate
    per split, validate per store, exports; one row each, in the order given."""
    root = tmp_path / "benchmarks"
    names = [
        "fetch_data/alpaca_en_demo.json.tsv",
        "prepare.tsv",
        "regenerate/train.tsv",
        "regenerate/eval.tsv",
        "validate/train-00000.tsv",
        "validate/eval-00000.tsv",
        "export_sglang.tsv",
    ]
    paths = [bench(root / name, float(n + 1), 10.0, 1.0) for n, name in enumerate(names)]
    rows = read_benchmarks(root, paths)
    assert [r["stage"] for r in rows] == ["fetch_data", "prepare", "regenerate", "validate", "export_sglang"]
    assert {r["stage"]: (r["jobs"], r["wall_s"]) for r in rows}["regenerate"] == (2, 7.0)
    assert {r["stage"]: (r["jobs"], r["wall_s"]) for r in rows}["validate"] == (2, 11.0)
