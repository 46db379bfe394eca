"""One benchmark case in a fresh interpreter, so that no state (CUDA caches, cuDNN plans, the allocator,
torch's thread pool) carries from one case to the next; shared by bench/train.py and
bench/train_shapes.py.

    .venv/bin/python bench/child.py MODULE FUNCTION [--kwargs JSON] [--threads N]

runs one case by hand (e.g. `train case_baseline --kwargs '{"device_name": "cpu"}'`) and prints its JSON
result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def run_in_child(module: str, function: str, kwargs: dict, threads: int | None = None) -> dict:
    """`module.function(**kwargs)` (a module of bench/) in a child interpreter: its JSON result, or
    `{"error": "oom" | "failed", "detail": <last line of stderr>}`: a crash is reported, not hidden."""
    here = str(Path(__file__).parent)
    set_threads = f"import torch; torch.set_num_threads({threads});" if threads else ""
    code = (
        f"import json, sys; {set_threads} sys.path.insert(0, {here!r}); import {module} as b;"
        f"print('RESULT', json.dumps(b.{function}(**{kwargs!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
    status = "oom" if "out of memory" in proc.stderr.lower() else "failed"
    return {"error": status, "detail": tail[0][:400]}


def main() -> None:
    ap = argparse.ArgumentParser(description="Run one bench case (MODULE.FUNCTION) in a fresh interpreter.")
    ap.add_argument("module", help="a module of bench/, e.g. train")
    ap.add_argument("function", help="the function of that module to call")
    ap.add_argument("--kwargs", default="{}", help="its keyword arguments, as a JSON object")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in the child")
    args = ap.parse_args()
    print(json.dumps(run_in_child(args.module, args.function, json.loads(args.kwargs), args.threads)))


if __name__ == "__main__":
    main()
