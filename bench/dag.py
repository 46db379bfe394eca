"""Time `snakemake -n` (DAG build + dry-run listing) for a config with many shards.

    .venv/bin/python bench/dag.py --shards 10000 --repeats 3 --out bench/results/dag.json

Writes the wall time of each repeat, the jobs the dry run listed by rule, the machine, and the
command that made it. The config is the default one with `tokenize.train_shards + eval_shards =
--shards` (1% eval), so the dry run lists one extract job per shard.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from dryrun import planned_jobs  # noqa: E402

REPO = Path(__file__).parents[1]


def shard_config(shards: int) -> str:
    eval_shards = max(1, shards // 100)
    return f"tokenize:\n  train_shards: {shards - eval_shards}\n  eval_shards: {eval_shards}\n"


def dry_run(shards: int, workdir: Path) -> tuple[float, float, dict[str, int]]:
    config = workdir / "shards.yaml"
    config.write_text(shard_config(shards))
    cmd = [sys.executable, "-m", "snakemake", "-n", "-q", "rules", "-d", str(workdir)]
    cmd += ["--configfile", str(config)]
    start, cpu_start = time.monotonic(), _children_cpu()
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds, cpu = time.monotonic() - start, _children_cpu() - cpu_start
    if result.returncode != 0:
        raise SystemExit(result.stdout + result.stderr)
    return seconds, cpu, planned_jobs(result.stdout + result.stderr)


def _children_cpu() -> float:
    """CPU seconds (user + system) of finished child processes: on a shared machine the wall time
    includes waiting for other people's work, the CPU time does not."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    times, cpus, jobs = [], [], {}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            seconds, cpu, jobs = dry_run(args.shards, Path(tmp))
        times.append(round(seconds, 2))
        cpus.append(round(cpu, 2))
        total = sum(jobs.values())
        print(f"{args.shards} shards: {seconds:.1f} s wall, {cpu:.1f} s CPU, {total} jobs", flush=True)
    result = {
        "command": "python bench/dag.py " + " ".join(sys.argv[1:]),
        "shards": args.shards,
        "seconds": times,
        "median_s": sorted(times)[len(times) // 2],
        "cpu_seconds": cpus,
        "load_average_1min_at_end": round(os.getloadavg()[0], 1),
        "jobs": jobs,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
