"""What the checkpoint checksums cost: `eyas.train.checkpoint.save_checkpoint` of a drafter and its AdamW
state, timed as it is (weights, `torch.save` of the train state, fsync, sha256 of every file) and with the
sha256 pass replaced by a constant, at a named drafter shape (bench/train.py's SHAPES).

    python bench/checkpoint_hash.py --shape smollm2 --repeats 3 --out bench/results/checkpoint-hash-cpu.json
    python bench/checkpoint_hash.py --shape 8b --repeats 2 --out checkpoint-hash-8b.json

Both variants write the same files; the difference of their medians is the checksum's cost. The sha256
runs over files just written (in the page cache), so it measures hashing, not the disk.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train import SHAPES, _drafter  # noqa: E402 - bench/train.py: the drafter at a named shape

from eyas.train import checkpoint  # noqa: E402


def _state(model) -> dict:
    """A train state as the trainer saves it: AdamW's moments of every trained weight, materialized."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    return {"step": 1, "optimizer": optimizer.state_dict(), "fingerprint": "bench"}


def _time_save(model, state: dict, folder: Path, hashed: bool) -> float:
    original = checkpoint._sha256
    if not hashed:
        checkpoint._sha256 = lambda path: "0" * 64
    try:
        start = time.perf_counter()
        checkpoint.save_checkpoint(folder / "checkpoint", model, {}, state)
        return time.perf_counter() - start
    finally:
        checkpoint._sha256 = original


def _sha256_rate(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb") as fh:
        hashlib.file_digest(fh, "sha256")
    return path.stat().st_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where checkpoints are written (a temp dir)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = _drafter(SHAPES[args.shape], torch.device("cpu"))
    state = _state(model)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        times = {"hashed": [], "unhashed": []}
        for _ in range(args.repeats):
            for variant in times:
                times[variant].append(_time_save(model, state, folder, variant == "hashed"))
        files = sorted((folder / "checkpoint").iterdir())
        sizes = {f.name: f.stat().st_size for f in files}
        rate = min(_sha256_rate(f) for f in files if f.stat().st_size > 2**20)
    hashed, unhashed = statistics.median(times["hashed"]), statistics.median(times["unhashed"])
    result = {
        "command": " ".join(["python", *sys.argv]),
        "shape": args.shape,
        "machine": f"{platform.machine()}, {platform.processor() or '?'}",
        "torch": torch.__version__,
        "checkpoint_bytes": sum(sizes.values()),
        "files": sizes,
        "save_seconds": times,
        "median_hashed_s": hashed,
        "median_unhashed_s": unhashed,
        "sha256_cost_s": hashed - unhashed,
        "sha256_share_of_save": (hashed - unhashed) / hashed,
        "sha256_gb_per_s_page_cache": rate / 1e9,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "files"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
