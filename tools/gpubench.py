"""Shared pieces of the benches. For the GPU campaign's (bench/gpu/generation.py, extraction.py): variant
parsing, child runs timed from outside (a fresh process per variant, so start-up and imports count as
they do in a pipeline job; the script itself in a hidden child mode). For those and the CPU benches
bench/validate.py and bench/tokenize_workers.py: the result JSON with the command that made it
(`write_json`), and the host's block in it (`machine`)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path


def command_line() -> str:
    return shlex.join([sys.executable, *sys.argv])


def parse_variants(entries: list[str], defaults: dict[str, dict]) -> dict[str, dict]:
    """`NAME` (one of `defaults`) or `NAME=JSON` (settings overrides) per entry; all defaults if none."""
    if not entries:
        return dict(defaults)
    variants = {}
    for entry in entries:
        name, sep, text = entry.partition("=")
        if not sep:
            if name not in defaults:
                raise SystemExit(f"--variant {name}: not one of {sorted(defaults)}; or give NAME=JSON")
            variants[name] = defaults[name]
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"--variant {name}: not JSON: {err}") from None
        if not isinstance(value, dict):
            raise SystemExit(f"--variant {name}: expected a JSON object, got {text}")
        variants[name] = value
    return variants


def run_child(args: list[str], log: Path, timeout: float) -> dict:
    """`python THIS_SCRIPT args...` in a process of its own; its wall seconds, exit code and the JSON it
    wrote to the path after `--result`."""
    result = Path(args[args.index("--result") + 1])
    result.unlink(missing_ok=True)
    began = time.perf_counter()
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    with open(log, "w") as fh:
        try:
            command = [sys.executable, sys.argv[0], *args]
            run = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout)
            code = run.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.perf_counter() - began
    out = {"process_seconds": wall, "exit_code": code, "log": str(log)}
    if result.exists():
        out |= json.loads(result.read_text())
    else:
        out["error"] = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
    return out


def run_or_child(ap: argparse.ArgumentParser, argv, run, children: dict, child_flags, required) -> None:
    """Parse `argv` and run the script: `run(args)`, which needs the flags named in `required`; or, when
    `run_child` re-runs the script (its first argument a mode of `children`: mode -> function), that
    mode's function. The mode and the child-only flags `child_flags` are hidden from --help."""
    ap.add_argument("mode", nargs="?", default="run", choices=["run", *children], help=argparse.SUPPRESS)
    for flag in child_flags:
        ap.add_argument(flag, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mode in children:
        return children[args.mode](args)
    if any(getattr(args, name) is None for name in required):
        ap.error(" and ".join(f"--{name.replace('_', '-')}" for name in required) + " are required")
    return run(args)


def write_json(path: Path, data: dict) -> None:
    """`data` with the command line, written whole (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"command": command_line(), **data}, indent=2) + "\n")
    tmp.replace(path)


def machine() -> dict:
    """The host a bench ran on, for its result JSON: CPU count, platform and Python version."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
