"""Compare two results trees of the same job, made by two checkouts (a refactor's behaviour check).

Every file present in either tree is classed as: `identical` (same bytes), `equal_less_timing` (JSON or
a JSON-lines file whose parsed contents are equal once timing and host fields are dropped), `differs`,
or `only_in_a` / `only_in_b`. Logs and Snakemake benchmark files are listed apart (`skipped`): they hold
timings and process ids by nature. Zarr stores are compared chunk file by chunk file like any file.

    python tools/compare_runs.py A/results B/results --out comparison.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Keys whose values measure time or memory of the run (a speedup is a ratio of two timings): they
# differ between any two runs.
TIMING_MARKERS = (
    "seconds", "per_s", "wall", "elapsed", "time", "duration", "rss", "started", "finished", "speedup",
)  # fmt: skip
SKIPPED_DIRS = ("logs", "benchmarks", ".snakemake")


def is_timing_key(key: str) -> bool:
    low = key.lower()
    return low.endswith("_s") or any(marker in low for marker in TIMING_MARKERS)


def drop_timing(value):
    if isinstance(value, dict):
        return {k: drop_timing(v) for k, v in value.items() if not is_timing_key(k)}
    if isinstance(value, list):
        return [drop_timing(v) for v in value]
    return value


def parsed(path: Path):
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def equal_less_timing(path_a: Path, path_b: Path) -> bool:
    return drop_timing(parsed(path_a)) == drop_timing(parsed(path_b))


def compare(a: Path, b: Path) -> dict:
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    out = {k: [] for k in ("identical", "equal_less_timing", "differs", "only_in_a", "only_in_b", "skipped")}
    for rel in sorted(files_a | files_b, key=str):
        if rel.parts[0] in SKIPPED_DIRS:
            out["skipped"].append(str(rel))
        elif rel not in files_b:
            out["only_in_a"].append(str(rel))
        elif rel not in files_a:
            out["only_in_b"].append(str(rel))
        elif (a / rel).read_bytes() == (b / rel).read_bytes():
            out["identical"].append(str(rel))
        elif rel.suffix in (".json", ".jsonl") and drop_timing(parsed(a / rel)) == drop_timing(
            parsed(b / rel)
        ):
            out["equal_less_timing"].append(str(rel))
        else:
            out["differs"].append(str(rel))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--out", type=Path, help="write the classification (and the command) as JSON")
    args = parser.parse_args(argv)
    result = compare(args.a, args.b)
    counts = {k: len(v) for k, v in result.items()}
    print(json.dumps(counts))
    for rel in result["differs"] + result["only_in_a"] + result["only_in_b"]:
        print("  not equal:", rel)
    if args.out:
        record = {"command": " ".join(["python", *sys.argv]), "counts": counts, **result}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if not (result["differs"] or result["only_in_a"] or result["only_in_b"]) else 1


if __name__ == "__main__":
    sys.exit(main())
