"""Read Snakemake's dry-run output (`snakemake -n`): the jobs it would run, by rule."""

from __future__ import annotations

import re


def planned_jobs(output: str) -> dict[str, int]:
    """{rule: count} from the `Job stats` table of a dry run's output; {} when nothing is to be done."""
    if "Job stats:" not in output:
        if "Nothing to be done" in output:
            return {}
        raise ValueError(f"no 'Job stats' table in the dry-run output: {output[-500:]!r}")
    table = output.split("Job stats:", 1)[1]
    jobs = {}
    for line in table.splitlines()[3:]:  # after the header: "job  count", a rule of dashes
        match = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not match or match.group(1) == "total":
            break
        jobs[match.group(1)] = int(match.group(2))
    return jobs


def job_details(output: str) -> list[dict]:
    """Each job of a dry run's output (`snakemake -n`, not `-q`): {rule, threads, resources, input}."""
    jobs = []
    for block in re.split(r"^rule ", output, flags=re.M)[1:]:
        job = {"rule": block.split(":", 1)[0], "threads": 1, "resources": {}, "input": []}
        for line in block.splitlines()[1:]:
            key, _, value = line.strip().partition(": ")
            if key == "threads":
                job["threads"] = int(value)
            elif key == "resources":
                job["resources"] = dict(item.split("=", 1) for item in value.split(", ") if "=" in item)
            elif key == "input":
                job["input"] = value.split(", ")
            elif not line.startswith(" "):
                break
        jobs.append(job)
    return jobs
