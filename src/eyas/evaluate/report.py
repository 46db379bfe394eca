"""Figures and tables of the Snakemake report: tau per set and drafter, loss curve, stage throughput.

Pure readers (`tau_table`, `read_loss_log`, `read_benchmarks`) turn results into rows; the writers
render them as TSV and PNG (matplotlib object API on an Agg canvas), each atomically.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from pathlib import Path

from eyas.core.acceptance import at_chain_length
from eyas.core.atomic import atomic_file
from eyas.evaluate.figures import new_figure, save_figure

BENCHMARK_COLUMNS = ("s", "max_rss", "cpu_time")  # wall seconds, peak RSS (MB), CPU seconds


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_tsv(rows: list[dict], out: str | os.PathLike) -> None:
    if not rows:
        raise ValueError(f"{out}: no rows to write")
    with atomic_file(out) as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _fmt(v) for k, v in row.items()} for row in rows)


# --------------------------------------------------------------------------- tau
def tau_table(summary: dict) -> list[dict]:
    """One row per (set, drafter, backend, k): real tau, simulated tau over all TTT steps and walked tau
    at k (offline, held-out stores: `evaluate_offline`), speed
    at batch size 1 and, served, at the engine's concurrency. Rows of the HF loop come from `table`
    (unless only SGLang served, when `table` restates served figures), served rows from `served`."""
    offline = summary.get("offline_by_drafter") or {}
    hf_rows = [] if summary.get("meta", {}).get("backend") == "sglang" else summary["table"]
    served_rows = (summary.get("served") or {}).get("table") or []
    width = max((len(r["acceptance_by_position"] or []) for r in [*hf_rows, *served_rows]), default=0)
    rows = []
    for row, backend in [*((r, "hf") for r in hf_rows), *((r, "sglang") for r in served_rows)]:
        acc = list(row["acceptance_by_position"] or [])
        served = backend == "sglang"
        k = row["k"] if served else len(acc)
        drafter_offline = offline.get(row["drafter"], {})
        rows.append(
            {
                "set": row["set"],
                "drafter": row["drafter"],
                "backend": backend,
                "k": k,
                "tau": row["tau"],
                "simulated_tau": drafter_offline.get("simulated_tau") if served else row["simulated_tau"],
                "walked_tau": at_chain_length(drafter_offline.get("walked_tau_by_k"), k),
                "speedup": row["speedup_bs1"] if served else row["speedup"],
                "spec_tokens_per_s": row["tokens_per_s_bs1"] if served else row["spec_tokens_per_s"],
                "tokens_per_s_batched": row.get("tokens_per_s_batched"),
                "speedup_batched": row.get("speedup_batched"),
                **{f"accept_pos{i + 1}": acc[i] if i < len(acc) else None for i in range(width)},
            }
        )
    return rows


def plot_tau(summary: dict, out: str | os.PathLike) -> list[dict]:
    """PNG: real tau per set and drafter (bars) | simulated vs real tau per drafter (primary set); with a
    served evaluation also served tau by k per set and drafter | tokens/s at batch size 1 and at the
    engine's concurrency, plain beside each drafter at the first k."""
    served = summary.get("served")
    fig = new_figure(20 if served else 10, 4)
    axes = fig.subplots(1, 4 if served else 2)
    left, right = axes[0], axes[1]
    sets = list(summary["sets"])
    drafters = list(dict.fromkeys(d for s in sets for d in summary["sets"][s]))
    width = 0.8 / len(drafters)
    for j, drafter in enumerate(drafters):
        taus = [summary["sets"][s].get(drafter, {}).get("tau") for s in sets]
        xs = [i + (j - (len(drafters) - 1) / 2) * width for i in range(len(sets))]
        left.bar(xs, [math.nan if t is None else t for t in taus], width, label=drafter)
    left.set_xticks(range(len(sets)), sets)
    left.set(title="Real tau (tokens per target verify pass)", ylabel="tau")
    left.legend()
    primary = summary["headline"]["set"]
    for row in summary["table"]:
        offline = row.get("walked_tau_k")
        if row["set"] == primary and row["tau"] is not None and offline is not None:
            right.plot(offline, row["tau"], "o")
            right.annotate(row["drafter"], (offline, row["tau"]), textcoords="offset points", xytext=(4, 4))
    k = summary["specdec"]["num_draft_tokens"]
    right.plot([1, k + 1], [1, k + 1], ":", color="grey", label="real = walked")
    right.set(title=f"Walked vs real tau at k = {k} ({primary})", xlabel="walked tau (offline, held-out)",
              ylabel="real tau")  # fmt: skip
    right.legend()
    if served:
        _plot_served(served, axes[2], axes[3])
    for ax in axes:
        ax.grid(alpha=0.3)
    return save_figure(fig, out)


def _plot_served(served: dict, by_k, speed) -> None:
    lines = defaultdict(list)
    for row in served["table"]:
        lines[(row["set"], row["drafter"])].append((row["k"], row["tau"]))
    for (set_name, drafter), points in lines.items():
        ks, taus = zip(*sorted(points), strict=True)
        by_k.plot(ks, [math.nan if t is None else t for t in taus], "o-", label=f"{set_name} / {drafter}")
    by_k.set(title="Served tau by k (SGLang EAGLE-3)", xlabel="k (drafts per verify pass)", ylabel="tau")
    by_k.legend(fontsize="small")
    first_k = min(row["k"] for row in served["table"])
    concurrency = served["settings"]["concurrency"]
    primary = served["table"][0]["set"]
    bars = {"plain": served["plain"][primary]}
    for row in served["table"]:
        if row["set"] == primary and row["k"] == first_k:
            bars[row["drafter"]] = row
    names = list(bars)
    for j, key in enumerate(("tokens_per_s_bs1", "tokens_per_s_batched")):
        xs = [i + (j - 0.5) * 0.4 for i in range(len(names))]
        speed.bar(
            xs, [bars[n][key] for n in names], 0.4, label="batch 1" if j == 0 else f"{concurrency} in flight"
        )
    speed.set_xticks(range(len(names)), names)
    speed.set(title=f"Served tokens/s ({primary}, k = {first_k})", ylabel="tokens/s")
    speed.legend()


# --------------------------------------------------------------------------- loss curve
def read_loss_log(path: str | os.PathLike) -> dict[str, list[float]]:
    """Columns of the trainer's log.csv (step, loss, acc_k, ...) as float lists."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path}: no training steps logged")
    columns = {}
    for name in rows[0]:
        try:
            columns[name] = [float(r[name]) for r in rows]
        except ValueError as err:
            raise ValueError(f"{path}: column {name!r} is not numeric: {err}") from err
    for needed in ("step", "loss"):
        if needed not in columns:
            raise ValueError(f"{path}: no {needed!r} column")
    return columns


def plot_loss(log: dict[str, list[float]], out: str | os.PathLike) -> list[dict]:
    """PNG: training loss | training accuracy per TTT step, against optimizer step."""
    fig = new_figure(10, 4)
    left, right = fig.subplots(1, 2)
    left.plot(log["step"], log["loss"], "-")
    left.set(title="Training loss (weighted TTT soft-CE)", xlabel="step", ylabel="loss")
    for name in sorted(n for n in log if n.startswith("acc_")):
        right.plot(log["step"], log[name], "-", label=f"step {int(name[4:]) + 1}")
    right.set(title="Training accuracy by TTT step", xlabel="step", ylabel="accuracy", ylim=(0, 1.02))
    right.legend(fontsize="small")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return save_figure(fig, out)


# --------------------------------------------------------------------------- stage throughput
def read_benchmarks(root: str | os.PathLike, paths: list[str]) -> list[dict]:
    """Snakemake benchmark TSVs -> one row per stage (the path's first part below `root`): jobs,
    summed wall and CPU seconds, peak RSS."""
    stages: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "wall_s": 0.0, "cpu_s": 0.0, "max_rss_mb": 0.0})
    for path in paths:
        rel = Path(path).relative_to(root)
        stage = rel.parts[0].removesuffix(".tsv")
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if not rows:
            raise ValueError(f"{path}: empty benchmark file")
        for line, row in enumerate(rows, 2):
            missing = [c for c in BENCHMARK_COLUMNS if c not in row]
            if missing:
                raise ValueError(f"{path}:{line}: benchmark lacks column(s) {missing}")
            agg = stages[stage]
            agg["jobs"] += 1
            agg["wall_s"] += float(row["s"])
            agg["cpu_s"] += float(row["cpu_time"])
            agg["max_rss_mb"] = max(agg["max_rss_mb"], float(row["max_rss"]))
    return [{"stage": name, **agg} for name, agg in stages.items()]


def plot_throughput(rows: list[dict], out: str | os.PathLike) -> list[dict]:
    """PNG: wall and CPU seconds per stage | peak memory per stage."""
    fig = new_figure(10, 4)
    left, right = fig.subplots(1, 2)
    names = [r["stage"] for r in rows]
    ys = range(len(rows))
    left.barh([y - 0.2 for y in ys], [r["wall_s"] for r in rows], 0.4, label="wall s")
    left.barh([y + 0.2 for y in ys], [r["cpu_s"] for r in rows], 0.4, label="CPU s")
    left.set_yticks(list(ys), names)
    left.set(title="Time per stage (all its jobs)", xlabel="seconds")
    left.legend()
    right.barh(list(ys), [r["max_rss_mb"] for r in rows], 0.6)
    right.set_yticks(list(ys), names)
    right.set(title="Peak memory per job", xlabel="max RSS (MB)")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="x")
    return save_figure(fig, out)
