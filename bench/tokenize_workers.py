"""The tokenize stage (eyas.data.tokenize.tokenize_split) on 1..N worker processes, side by side: the
seconds, tokens a second, and whether the shards, rejects and stats equal the one-process run's.

The input is a prepared split repeated `--repeat` times (ids made unique), so a small real split
gives a load the size of the GPU recipe's.

    python bench/tokenize_workers.py --conversations results/prepared/train.jsonl \
        --model results/assets/model \
        --repeat 20 --workers 1 2 --out bench/results/tokenize-cpu.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from eyas.data.tokenize import tokenize_split
from eyas.store import read_token_shard, shard_name

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from gpubench import machine, write_json  # noqa: E402


def repeated(conversations: Path, times: int, out: Path) -> int:
    """The split's records `times` over, with ids made unique; returns the record count."""
    records = [json.loads(line) for line in conversations.read_text().splitlines() if line.strip()]
    with open(out, "w") as fh:
        for n in range(times):
            for record in records:
                fh.write(json.dumps({**record, "id": f"{record['id']}#{n}"}, ensure_ascii=False) + "\n")
    return times * len(records)


def outputs(folder: Path, shards: int) -> dict:
    """What a run wrote: each shard's arrays and attrs, the rejects' bytes, the stats (but `workers`,
    the one field that names the run, not its outputs)."""
    stats = json.loads((folder / "stats.json").read_text())
    stats.pop("workers")
    result = {"rejects": (folder / "rejects.jsonl").read_bytes(), "stats": stats}
    for i in range(shards):
        shard = read_token_shard(folder / shard_name(i))
        result[i] = (shard.input_ids.tobytes(), shard.loss_mask.tobytes(), shard.sample_offsets.tobytes(),
                     json.dumps(shard.attrs, sort_keys=True))  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", required=True, help="a prepared split (results/prepared/*.jsonl)")
    parser.add_argument("--model", required=True, help="the target's model directory (its tokenizer)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="eyas-tokenize-bench-"))
    try:
        source = root / "split.jsonl"
        records = repeated(Path(args.conversations), args.repeat, source)
        runs, first = [], None
        for workers in args.workers:
            folder = root / f"workers-{workers}"
            folder.mkdir()
            started = time.perf_counter()
            stats = tokenize_split(
                str(source), args.model, [str(folder / shard_name(i)) for i in range(args.shards)],
                str(folder / "rejects.jsonl"), str(folder / "stats.json"), split="train",
                max_length=args.max_length, model_id="bench", workers=workers,
            )  # fmt: skip
            seconds = time.perf_counter() - started
            written = outputs(folder, args.shards)
            first = first or written
            speedup = round(runs[0]["seconds"] / seconds, 2) if runs else 1.0
            runs.append({"workers": workers, "seconds": round(seconds, 2), "tokens": stats["tokens"],
                         "tokens_per_s": round(stats["tokens"] / seconds), "same_as_first": written == first,
                         "speedup_vs_first": speedup})  # fmt: skip
            print(json.dumps(runs[-1]), flush=True)
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert all(run["same_as_first"] for run in runs), "the outputs differ across worker counts"
    write_json(Path(args.out), {
        "what": "tokenize_split on a prepared split repeated --repeat times; outputs compared byte for byte",
        "records": records, "kept": stats["kept"], "rejected": stats["rejected"],
        "machine": {**machine(), "numpy": np.__version__},
        "runs": runs,
    })  # fmt: skip


if __name__ == "__main__":
    main()
