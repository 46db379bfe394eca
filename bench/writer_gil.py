"""Does extraction's store writing slow the engine's own thread? Writer threads against a writer process.

In SGLang's scheduler process one Python thread drives the GPU; at a 135M target that thread, not the
GPU, sets the prefill speed. The capture hook hands each forward's rows to the store writer: writer
threads in the same process (`extract.writer_process: false`) share that thread's GIL for their numpy
and zarr-python work, a writer process (`true`) does not. On an H100 the capture ran at 0.62x of bare
prefill with threads and 0.78x with the writers' work dropped (bench/results/extraction-drop-h100-
smollm2.json). This stands a fixed pure-Python "scheduler step" (`--step-ms` of bytecode holding the
GIL) in for the scheduler's and times it alone, then with one batch of `--tokens` rows of the recipe's
shape (SmolLM2: 3 taps + the final state, hidden 576) staged (`eyas.extract.staging.stage_batch`) and
handed to each writer after every step, then alone again:

    .venv/bin/python bench/writer_gil.py --out OUT.json [--forwards 60] [--tokens 2048] [--step-ms 15] \
        [--storage fp8_e4m3] [--writer-threads 1] [--device cpu|cuda]

Reported per case: the step's median ms and its ratio to the step alone (the mean of the first and last
alone runs), the loop's ms a forward (step, staging and `put`), tokens a second through the loop and
the seconds `put` waited on a full writer (back-pressure). On the CPU the batch is encoded once, before
the loop (in the engine its encode is asynchronous GPU work), and the writer process's `put` copies it
into shared memory (on CUDA that copy is the side stream's DMA). The writer process is started and
waited for before its case is timed (`ProcessWriter.wait_ready`): a job starts it during its warm-up.
On a machine with fewer cores than the writers use, the writers also take cores from the step: the
JSON names the cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from gpubench import machine, write_json  # noqa: E402

from eyas.extract.staging import PinnedPool, StagedBatch, encode_batch, stage_batch  # noqa: E402
from eyas.extract.writer_process import open_store_writer  # noqa: E402
from eyas.store import write_token_shard  # noqa: E402

HIDDEN, TAPS = 576, 3  # SmolLM2-135M, the GPU recipe's target
VOCAB = 49152


def busy(iterations: int) -> int:
    """Pure-Python work that holds the GIL, as the scheduler's batch bookkeeping does."""
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def calibrate(step_ms: float) -> int:
    """Iterations of `busy` that take `step_ms` on this machine, alone."""
    started = time.perf_counter()
    busy(1_000_000)
    return max(1, int(step_ms / 1000 / ((time.perf_counter() - started) / 1_000_000)))


def run_case(kind: str, args, work: Path, shard: str, ids: np.ndarray, iterations: int) -> dict:
    """`args.forwards` steps, each followed (unless `kind` is "alone") by one staged batch to the writer."""
    device, forwards, tokens = torch.device(args.device), args.forwards, args.tokens
    offsets = np.arange(forwards + 1, dtype=np.int64) * tokens
    store_args = dict(path=str(work / f"{kind}.zarr"), sample_offsets=offsets, hidden_size=HIDDEN,
                      num_taps=TAPS, attrs={}, chunk_tokens=256, storage=args.storage,
                      chunks_per_shard=16)  # fmt: skip
    writer = None
    if kind != "alone":
        writer = open_store_writer(store_args, device, args.writer_threads, process=kind == "process",
                                   token_shard=shard, shard_ids=ids)  # fmt: skip
        if kind == "process":
            writer.wait_ready()  # its imports are a job's start-up, not a forward's cost
    generator = torch.Generator(device=device).manual_seed(0)
    taps = [torch.randn(1, tokens, HIDDEN, device=device, generator=generator).bfloat16()
            for _ in range(TAPS)]  # fmt: skip
    final = torch.randn(1, tokens, HIDDEN, device=device, generator=generator).bfloat16()  # [1, T, H]
    token_ids = torch.from_numpy(ids.astype(np.int64)).to(device)
    encoded = encode_batch(taps, final, args.storage) if device.type == "cpu" else None  # once: see below
    pool = writer.pool if writer is not None else PinnedPool() if device.type == "cuda" else None
    stream = writer.copy_stream if writer is not None else None
    steps, began = [], time.perf_counter()
    for i in range(forwards):
        started = time.perf_counter()
        busy(iterations)
        steps.append(1000 * (time.perf_counter() - started))
        if writer is None:
            continue
        ids_of_batch = token_ids[i * tokens : (i + 1) * tokens]  # [T]
        if encoded is None:  # CUDA: encoded on the device, copied on the side stream, as in the engine
            staged = stage_batch([i], [tokens], taps, final, args.storage, pool, stream,
                                 token_ids=ids_of_batch)  # fmt: skip
        else:  # CPU: the engine's encode runs on the GPU, asynchronously; here it would be the step's work
            staged = StagedBatch([i], [tokens], *encoded, token_ids=ids_of_batch)
        staged.pieces = [(i, 0, 0, tokens)]
        writer.put(staged)
        del staged
    loop = time.perf_counter() - began
    if writer is not None:
        writer.close()
    result = {
        "step_median_ms": round(statistics.median(steps), 2),
        "loop_ms_per_forward": round(1000 * loop / forwards, 2),
        "tokens_per_s_through_loop": round(forwards * tokens / loop) if writer is not None else None,
        "seconds_with_close": round(time.perf_counter() - began, 2),
    }
    if writer is not None:
        result |= {"put_wait_seconds": round(writer.wait_seconds, 3), **writer.stats}
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the result JSON")
    ap.add_argument("--forwards", type=int, default=60, help="steps (and batches) a case")
    ap.add_argument("--tokens", type=int, default=2048, help="rows a batch (a forward's tokens)")
    ap.add_argument("--step-ms", type=float, default=15.0, help="pure-Python ms of the stand-in step")
    ap.add_argument("--storage", default="fp8_e4m3", choices=["bf16", "fp8_e4m3"])
    ap.add_argument("--writer-threads", type=int, default=1, help="chunk threads (extract.writer_threads)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", nargs="+", default=["alone", "threads", "process", "alone"],
                    choices=["alone", "threads", "process"])  # fmt: skip
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, VOCAB, args.tokens).astype(np.int32), np.ones(args.tokens, np.uint8))
               for _ in range(args.forwards)]  # fmt: skip
    ids = np.concatenate([tokens for tokens, _ in samples])
    iterations = calibrate(args.step_ms)
    cases = []
    with tempfile.TemporaryDirectory(prefix="writer-gil-") as tmp:
        work = Path(tmp)
        shard = str(work / "tokens.zarr")
        write_token_shard(shard, samples, [str(i) for i in range(args.forwards)], {})
        for n, kind in enumerate(args.cases):
            case = {"case": kind} | run_case(kind, args, work / str(n), shard, ids, iterations)
            cases.append(case)
            print(case, flush=True)
    alone = [c["step_median_ms"] for c in cases if c["case"] == "alone"]
    if alone:
        for case in cases:
            case["step_ratio_to_alone"] = round(case["step_median_ms"] / statistics.mean(alone), 3)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    write_json(args.out, {"machine": machine(), "settings": settings, "cases": cases})


if __name__ == "__main__":
    main()
