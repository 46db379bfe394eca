"""What a GPU campaign's `wait` call reports (tools/gpu/run_recipe.sh): the Snakemake run's status table
(each job's rule, start, end and seconds, read from Snakemake's own log) and the GPU's use (sampled by
`nvidia-smi -l 1`: the share of seconds the GPU was busy, and the idle gaps, each with the jobs that ran
during it, so a gap between GPU jobs shows which CPU job it was).

    python3 tools/gpu/campaign.py status RUN [--out status.json]
    python3 tools/gpu/campaign.py usage RUN/gpu.csv [--log RUN/snakemake.out] [--min-gap 10] [--out gpu.json]
    python3 tools/gpu/campaign.py curve-plan RUN --code CODE [--percent 50 25] --out RUN/curve-plan.json

`curve-plan` writes the plan of bench/studies/recipe_sweep.py for the tau-vs-data curve of a finished
run (issue 26): the run's own drafter (`regen-100`; with `--percent 100 ...`, one trained beside the
others on the stores of a run stopped before `train`) and drafters trained on nested subsets of its
training conversations (`train.data_fraction`), all served in one engine on the run's held-out prompts
at the recipe's k values.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^(?:local)?(?:checkpoint|rule) (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished job(?:id:)? (\d+)")
PROGRESS = re.compile(r"^(\d+) of (\d+) steps \((\d+%)\) done$")
ERROR = re.compile(r"^Error in rule (\w+):")


def _time(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")


def read_jobs(log: Path) -> dict:
    """Jobs of a Snakemake log: {jobid: {rule, start, end}}, the last progress line and failed rules."""
    jobs: dict[str, dict] = {}
    now, rule, progress, errors = None, None, None, []
    for line in log.read_text(errors="replace").splitlines():
        if m := STAMP.match(line):
            now = _time(m.group(1))
        elif m := RULE.match(line):
            rule = m.group(1)
        elif (m := JOBID.match(line)) and rule:
            jobs[m.group(1)] = {"rule": rule, "start": now, "end": None}
            rule = None
        elif (m := FINISHED.match(line)) and m.group(1) in jobs:
            jobs[m.group(1)]["end"] = now
        elif m := PROGRESS.match(line):
            progress = {"done": int(m.group(1)), "total": int(m.group(2)), "percent": m.group(3)}
        elif m := ERROR.match(line):
            errors.append(m.group(1))
    return {"jobs": jobs, "progress": progress, "errors": errors}


def status(run: Path) -> dict:
    log = run / "snakemake.out"
    if not log.exists():
        raise SystemExit(f"{log}: no Snakemake log (was the run started?)")
    found = read_jobs(log)
    rows = []
    for jobid, job in found["jobs"].items():
        start, end = job["start"], job["end"]
        seconds = (end - start).total_seconds() if start and end else None
        end_text = str(end) if end else None
        rows.append({"jobid": int(jobid), "rule": job["rule"], "start": str(start), "end": end_text,
                     "seconds": seconds})  # fmt: skip
    finished = "(100%) done" in log.read_text(errors="replace")
    return {"run": str(run), "finished": finished, "progress": found["progress"], "errors": found["errors"],
            "jobs": rows}  # fmt: skip


def print_status(result: dict) -> None:
    progress = result["progress"] or {}
    state = "FINISHED" if result["finished"] else "not finished"
    steps = f"{progress.get('done', 0)} of {progress.get('total', '?')} steps"
    print(f"{result['run']}: {state}, {steps}; errors: {result['errors'] or 'none'}")
    print(f"{'job':>4}  {'rule':<20} {'start':<20} {'seconds':>8}")
    for row in result["jobs"]:
        seconds = f"{row['seconds']:.0f}" if row["seconds"] is not None else "running"
        print(f"{row['jobid']:>4}  {row['rule']:<20} {row['start']:<20} {seconds:>8}")


def read_samples(csv: Path) -> list[tuple[datetime, float]]:
    """(time, GPU utilisation %) per `nvidia-smi --format=csv,noheader,nounits` line; others skipped."""
    samples = []
    for line in csv.read_text(errors="replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"), float(parts[1])))
        except (IndexError, ValueError):
            continue
    return samples


def usage(csv: Path, log: Path | None, min_gap: float) -> dict:
    samples = read_samples(csv)
    if not samples:
        raise SystemExit(f"{csv}: no GPU samples")
    busy = sum(1 for _, u in samples if u > 0)
    gaps, begin = [], None
    for (t, u), nxt in zip(samples, samples[1:] + [None], strict=True):
        if u == 0 and begin is None:
            begin = t
        if begin is not None and (nxt is None or nxt[1] > 0):
            end = nxt[0] if nxt else t
            if (end - begin).total_seconds() >= min_gap:
                gaps.append({"start": str(begin), "end": str(end), "seconds": (end - begin).total_seconds()})
            begin = None
    if log is not None and log.exists():
        jobs = read_jobs(log)["jobs"].values()
        for gap in gaps:
            lo, hi = datetime.fromisoformat(gap["start"]), datetime.fromisoformat(gap["end"])
            gap["jobs"] = sorted({j["rule"] for j in jobs if j["start"] and j["start"] < hi
                                  and (j["end"] is None or j["end"] > lo)})  # fmt: skip
    seconds = (samples[-1][0] - samples[0][0]).total_seconds()
    return {"samples": len(samples), "seconds": seconds, "busy_share": busy / len(samples),
            "mean_utilisation": sum(u for _, u in samples) / len(samples), "min_gap_s": min_gap,
            "idle_gaps": gaps, "idle_seconds_in_gaps": sum(g["seconds"] for g in gaps)}  # fmt: skip


def _plan(run: Path, code: Path, config_file: str, about: str, variants: list[dict]) -> dict:
    """recipe_sweep's plan over `run` (its stores and held-out prompts): the recipe's own evaluate
    settings (k, prompts, tokens), `variants` trained or taken as given."""
    return {
        "about": about,
        "configs": [str(code / "config" / "config.yaml"), str(code / config_file)],
        "heldout": str(run.resolve() / "results" / "prepared" / "eval.jsonl"),
        "variants": variants,
    }


def curve_plan(run: Path, code: Path, config_file: str, percents: list[int]) -> dict:
    """recipe_sweep's plan for the curve of `run` (its stores, drafter and held-out prompts). Without 100
    in `percents` the run's own drafter is the full point; with it, the full drafter is trained here
    too, first, so that a run stopped before `train` gets the whole curve from one process, whose
    trainings after the first reuse its compiled graphs (a pipeline `train` job compiles on its own)."""
    if not all(0 < p <= 100 for p in percents) or len(set(percents)) != len(percents):
        raise ValueError(f"--percent: each must lie in 1..100, once, got {percents}")
    results = run.resolve() / "results"
    if 100 in percents:
        full = {"name": "regen-100", "run": str(results), "train": {}}
    else:
        full = {"name": "regen-100", "drafter": str(results / "train" / "drafter")}
    variants = [full] + [
        {"name": f"regen-{p}", "run": str(results), "train": {"data_fraction": p / 100}}
        for p in percents
        if p != 100
    ]
    about = f"tau against data of the run {run}: its drafter and drafters on nested subsets of its data"
    return _plan(run, code, config_file, about, variants)


def sweep_plan(run: Path, code: Path, config_file: str, variants: list[str]) -> dict:
    """recipe_sweep's plan training every `NAME=JSON` variant (`train` settings over the recipe's) on the
    stores of `run`, which need no trained drafter (e.g. a run stopped before `train`), or with
    `NAME@OTHER_RUN=JSON` on another run's stores (e.g. the same prompts regenerated otherwise: all are
    served on `run`'s held-out prompts). Name them `<series>-<percent>` (with `data_fraction` = percent /
    100) and plot_tau_vs_data.py plots them."""
    planned = []
    for text in variants:
        head, sep, overrides = text.partition("=")
        name, _, other = head.partition("@")
        if not sep or not name:
            raise ValueError(f"--variant {text!r}: give NAME=JSON or NAME@RUN=JSON (train settings)")
        train = json.loads(overrides)
        if not isinstance(train, dict):
            raise ValueError(f"--variant {name}: {overrides!r} is not a JSON object of train settings")
        stores = Path(other) if other else run
        planned.append({"name": name, "run": str(stores.resolve() / "results"), "train": train})
    if len({v["name"] for v in planned}) != len(planned):
        raise ValueError(f"--variant: names must differ, got {[v['name'] for v in planned]}")
    return _plan(run, code, config_file, f"training settings on the stores of the run {run}", planned)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    st = sub.add_parser("status")
    st.add_argument("run", type=Path)
    st.add_argument("--out", type=Path)
    us = sub.add_parser("usage")
    us.add_argument("csv", type=Path)
    us.add_argument("--log", type=Path, help="Snakemake's log: name the jobs running in each idle gap")
    us.add_argument("--min-gap", type=float, default=10.0, help="shortest idle stretch reported, seconds")
    us.add_argument("--out", type=Path)
    cp = sub.add_parser("curve-plan")
    cp.add_argument("run", type=Path)
    cp.add_argument("--code", type=Path, required=True, help="the checkout the recipe ran from")
    cp.add_argument("--config-file", default="config/gpu-smollm2.yaml")
    cp.add_argument("--percent", type=int, nargs="+", default=[50, 25])
    cp.add_argument("--out", type=Path)
    sp = sub.add_parser("sweep-plan")
    sp.add_argument("run", type=Path)
    sp.add_argument("--code", type=Path, required=True, help="the checkout the recipe ran from")
    sp.add_argument("--config-file", default="config/gpu-smollm2.yaml")
    sp.add_argument("--variant", nargs="+", required=True, help="NAME=JSON: train settings over the recipe's")
    sp.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.what == "curve-plan":
        result = curve_plan(args.run, args.code, args.config_file, args.percent)
        print(json.dumps(result, indent=1))
    elif args.what == "sweep-plan":
        result = sweep_plan(args.run, args.code, args.config_file, args.variant)
        print(json.dumps(result, indent=1))
    elif args.what == "status":
        result = status(args.run)
        print_status(result)
    else:
        log = args.log or args.csv.parent / "snakemake.out"
        result = usage(args.csv, log, args.min_gap)
        print(json.dumps({k: v for k, v in result.items() if k != "idle_gaps"}))
        for gap in result["idle_gaps"]:
            print(f"idle {gap['seconds']:.0f} s from {gap['start']}: {', '.join(gap.get('jobs', [])) or '-'}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
