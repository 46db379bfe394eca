"""Plain greedy decoding on the CPU: one process with T threads vs P one-thread processes side by
side, the measurement behind the `specdec` rule's one-job-per-set threads:

    .venv/bin/python bench/decode_parallel.py --model results/assets/model

Each process loads the fp32 target, decodes 8 tokens to warm up, then times 48 tokens after an
80-token prompt (`eyas.evaluate.specdec.plain_generate`). Prints tok/s per process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def one(model: str, threads: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    from eyas.evaluate.specdec import plain_generate

    torch.set_num_threads(threads)
    target = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    prompt = list(range(100, 180))
    plain_generate(target, prompt, 8, set())
    start = time.perf_counter()
    plain_generate(target, prompt, 48, set())
    return 48 / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one process, this many threads
    args = ap.parse_args()
    if args.one:
        print(one(args.model, args.one))
        return

    def launch(threads: int) -> subprocess.Popen:
        cmd = [sys.executable, __file__, "--model", args.model, "--one", str(threads)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    for label, procs in (("1 process x 1 thread", [1]), ("1 process x 2 threads", [2]),
                         ("2 processes x 1 thread", [1, 1])):  # fmt: skip
        running = [launch(t) for t in procs]
        rates = [float(p.communicate()[0].strip().splitlines()[-1]) for p in running]
        print(json.dumps({"case": label, "tok_s_per_process": rates, "tok_s_total": sum(rates)}))


if __name__ == "__main__":
    main()
