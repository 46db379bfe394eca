"""Diversity of target-written prompts against the demo prompts, side by side.

    python bench/prompt_quality.py --prompts results/prompts/target.jsonl --out bench/results/X.json
    python bench/prompt_quality.py --write --model results/assets/model --conversations 200 \\
        --backend hf --out bench/results/prompt-quality-cpu-smollm2.json     # write the sample first

`--write` runs the prompts stage's own code (`eyas.regenerate.prompts.run_prompts`, the config's
`prompts` defaults unless given) into `--out-dir` and times it; on a GPU use `--backend sglang`.
Without it, `--prompts` names a file the stage wrote (its `.stats.json` beside it is read too).

For each set (the target's first user turns; the first user turn of every record of the demo files)
it reports: count; distinct n-gram ratio (n = 1..4; a word, or a CJK character, is one unit); exact
duplicate rate (same text up to case and spacing) and near-duplicate rate (Jaccard of unit 3-grams
>= 0.7 with an earlier prompt, MinHash LSH confirmed exactly: `eyas.regenerate.filters`); length in
units (percentiles); language mix (Chinese when >= 30% of the letters are CJK); tool-use share (records
with tool schemas); the 15 most frequent opening bigrams; and a seeded random sample, verbatim. As
distinct and duplicate ratios grow and shrink with a set's size, `demo_same_size` measures a seeded
random subset of the demo prompts as large as the target's set.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from eyas.config import PromptSettings, RegenerateSettings, SglangSettings
from eyas.data.formats import RecordRejected, normalize_record
from eyas.data.prepare import read_records
from eyas.regenerate.filters import DuplicateFilter, distinct_ngram_ratio, language, units

# the allowed demo files with prompts of their own (identity's are templates of one question)
DEMO_FILES = [
    "alpaca_en_demo.json",
    "alpaca_zh_demo.json",
    "glaive_toolcall_en_demo.json",
    "glaive_toolcall_zh_demo.json",
]


def first_turns(path: Path, *, demo: bool) -> list[tuple[str, bool]]:
    """(first user turn, has tools) of every record of `path` (demo files: those that normalize)."""
    out = []
    for raw in read_records(path):
        record = raw.record
        if demo:
            try:
                record = normalize_record(raw.record, raw.source)
            except RecordRejected:
                continue
        first = next(m["content"] for m in record["messages"] if m["role"] == "user")
        out.append((first, record.get("tools") is not None))
    return out


def measure(items: list[tuple[str, bool]], *, sample: int, seed: int) -> dict:
    texts = [t for t, _ in items]
    lengths = np.array([len(units(t)) for t in texts] or [0])
    duplicates, exact, near = DuplicateFilter(0.7), 0, 0
    for i, text in enumerate(texts):
        found = duplicates.check(text)
        exact += found is not None and found[0] == "duplicate"
        near += found is not None and found[0] == "near_duplicate"
        duplicates.add(str(i), text)
    openings = Counter(" ".join(units(t)[:2]) for t in texts)
    n = len(texts) or 1
    return {
        "count": len(texts),
        "distinct_ngram_ratio": {str(k): round(distinct_ngram_ratio(texts, k), 4) for k in (1, 2, 3, 4)},
        "exact_duplicate_rate": round(exact / n, 4),
        "near_duplicate_rate": round(near / n, 4),  # near but not exact
        "length_units": {
            "mean": round(float(lengths.mean()), 1),
            **{f"p{q}": float(np.percentile(lengths, q)) for q in (0, 10, 50, 90, 100)},
        },
        "language_share": {"zh": round(sum(language(t) == "zh" for t in texts) / n, 4)},
        "tool_use_share": round(sum(tools for _, tools in items) / n, 4),
        "top_opening_bigrams": [[b, c, round(c / n, 4)] for b, c in openings.most_common(15)],
        "sample": random.Random(seed).sample(texts, min(sample, len(texts))),
    }


def write_sample(args) -> tuple[Path, float]:
    from eyas.regenerate.prompts import run_prompts

    given = {
        k: getattr(args, k)
        for k in (
            "conversations",
            "turns",
            "backend",
            "temperature",
            "seed",
            "max_new_tokens",
            "max_tokens",
            "batch_size",
            "opener_share",
            "chinese_share",
        )
        if getattr(args, k) is not None
    }
    settings = PromptSettings(**given, device=args.device)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tool_files = [
        Path(args.data_dir) / f for f in ("glaive_toolcall_en_demo.json", "glaive_toolcall_zh_demo.json")
    ]
    start = time.perf_counter()
    run_prompts(
        out / "target.jsonl",
        out / "target.rejects.jsonl",
        out / "target.stats.json",
        args.model,
        tool_files,
        settings=settings,
        answer_settings=RegenerateSettings(temperature=0.7),
        engine_settings=SglangSettings(),
    )
    return out / "target.jsonl", time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", help="a prompts file the stage wrote (not with --write)")
    ap.add_argument("--write", action="store_true", help="write the sample with the stage's code first")
    ap.add_argument("--model", help="--write: the target's model dir")
    ap.add_argument("--out-dir", default="results/prompts-bench", help="--write: where the sample goes")
    for name, kind in (
        ("conversations", int),
        ("turns", int),
        ("temperature", float),
        ("seed", int),
        ("max-new-tokens", int),
        ("max-tokens", int),
        ("batch-size", int),
        ("opener-share", float),
        ("chinese-share", float),
    ):
        ap.add_argument(f"--{name}", type=kind, help="--write: prompts setting (default: the config's)")
    ap.add_argument("--backend", choices=["hf", "sglang"], help="--write: prompts.backend")
    ap.add_argument("--device", default="auto", help="--write, hf: device")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--data-dir", default="results/assets/data", help="the fetched demo files")
    ap.add_argument("--sample", type=int, default=12, help="prompts quoted verbatim per set")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.write == bool(args.prompts) or (args.write and not args.model):
        ap.error("give --prompts FILE, or --write with --model")
    import logging

    import torch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    seconds = None
    prompts = Path(args.prompts) if args.prompts else None
    if args.write:
        prompts, seconds = write_sample(args)
    stats_file = prompts.with_name(prompts.name.replace(".jsonl", ".stats.json"))
    demo = [item for name in DEMO_FILES for item in first_turns(Path(args.data_dir) / name, demo=True)]
    result = {
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "threads": args.threads,
        },
        "write_seconds": round(seconds, 1) if seconds is not None else None,
        "stage_stats": json.loads(stats_file.read_text()) if stats_file.exists() else None,
        "target": measure(first_turns(prompts, demo=False), sample=args.sample, seed=0),
        "demo": {"files": DEMO_FILES, **measure(demo, sample=args.sample, seed=0)},
    }
    # distinct and duplicate ratios depend on the set's size: the demo prompts again, as many as the target's
    size = min(result["target"]["count"], len(demo))
    same = random.Random(0).sample(demo, size)
    result["demo_same_size"] = {k: v for k, v in measure(same, sample=0, seed=0).items() if k != "sample"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    for key in (
        "count",
        "distinct_ngram_ratio",
        "exact_duplicate_rate",
        "near_duplicate_rate",
        "language_share",
        "tool_use_share",
    ):
        print(f"{key:22} target {result['target'][key]}  demo (same size) {result['demo_same_size'][key]}")


if __name__ == "__main__":
    main()
