"""What compiling bytecode costs a fresh process's imports: the same modules imported in new processes
with an empty bytecode cache (every module compiled, as on a fresh GPU machine whose unpacked kit has
no `.pyc`, or in every process where Python writes none), then with the cache the first import wrote,
side by side. Why: `tools/gpu/run_recipe.sh unpack` compiles the kit's sites once, on all cores.

    .venv-sglang/bin/python bench/import_bytecode.py --repeats 2 --out bench/results/import-bytecode-cpu.json

Run it with the interpreter whose packages are to be imported (default modules: what an SGLang
engine's scheduler process imports). The cache goes to a fresh `PYTHONPYCACHEPREFIX` folder, so the
packages' own `__pycache__` is neither read nor touched.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from gpubench import machine, write_json  # noqa: E402

SGLANG_ENGINE = ["sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler"]


def timed_import(modules: list[str], prefix: Path, write: bool) -> dict:
    """Seconds of a new process importing `modules` with its bytecode cache under `prefix`, and the
    bytecode files the cache then holds."""
    env = os.environ | {"PYTHONPYCACHEPREFIX": str(prefix)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    began = time.perf_counter()
    subprocess.run([sys.executable, "-W", "ignore", "-c", code, *modules], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    seconds = time.perf_counter() - began
    return {"seconds": round(seconds, 2), "bytecode_files": sum(1 for _ in prefix.rglob("*.pyc"))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", nargs="+", default=SGLANG_ENGINE)
    ap.add_argument("--repeats", type=int, default=2, help="rounds of (compiling, cached) imports")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rounds = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="eyas-pyc-") as folder:
            prefix = Path(folder)
            no_write = timed_import(args.modules, prefix / "none", write=False)  # compiles, keeps nothing
            compiling = timed_import(args.modules, prefix / "cache", write=True)  # compiles and writes
            cached = timed_import(args.modules, prefix / "cache", write=True)  # reads what it wrote
        rounds.append({"no_bytecode_written": no_write, "compiling": compiling, "cached": cached})
    best = {k: min(r[k]["seconds"] for r in rounds) for k in rounds[0]}
    result = {
        "what": "a new process importing the modules: with no bytecode (compiled on import) against "
        "bytecode written by an earlier process (best of the rounds)",
        "machine": machine(),
        "modules": args.modules,
        "rounds": rounds,
        "best_seconds": best,
        "compile_share_of_import": round(1 - best["cached"] / best["compiling"], 3),
        "modules_compiled": rounds[0]["compiling"]["bytecode_files"],
    }
    write_json(args.out, result)
    print(result["best_seconds"], result["compile_share_of_import"], result["modules_compiled"])


if __name__ == "__main__":
    main()
