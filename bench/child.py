"""One benchmark case in a fresh interpreter, so that no state (CUDA caches, cuDNN plans, the allocator,
torch's thread pool) carries from one case to the next; shared by bench/train.py and
bench/train_shapes.py."""

from __future__ import annotations

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
