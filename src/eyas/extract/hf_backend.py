"""Extract stage, Hugging Face backend: run the target over a token shard and write a hidden store.

Per sample we keep K aux taps (drafter convention: tap `v` is the output of 0-based decoder layer `v`,
HF `hidden_states[v + 1]`) and the post-norm final state, bf16 (or fp8 e4m3 + scales) on disk
(docs/design.md). Capture is by forward hooks on the decoder layers and the final norm of the base
model, called without the lm_head: `output_hidden_states=True` would keep all L+1 states alive and
the CausalLM would build [B, T, V] logits nobody reads.

The pipeline: the main thread runs the model and encodes each batch on the device
(`extract.staging`: side-stream copy into reused pinned buffers), a writer thread assembles whole
chunks and a pool compresses and writes them (`extract.writer`; with `writer_process`, both in a child
process, `extract.writer_process`). Bounded queues keep memory flat.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from eyas.core.logs import Progress
from eyas.extract.batching import BATCH_OVERHEAD_TOKENS, CPU_BATCH_OVERHEAD_TOKENS, BatchPlan, plan_batches
from eyas.extract.job import default_writer_threads, open_job, peak_rss_bytes, store_attrs, stored_bytes
from eyas.extract.staging import PinnedPool, StagedBatch, stage_batch
from eyas.extract.writer import empty_rows
from eyas.extract.writer_process import open_store_writer
from eyas.model.capture import TapCapture, base_decoder
from eyas.model.target import load_target
from eyas.store import CHUNK_TOKENS, TokenShard
from eyas.store.quant import check_storage

log = logging.getLogger("eyas.extract")

WINDOW_BYTES = 4 << 30  # raw states per planning window: bounds partly filled chunks held in memory
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------- small pure helpers
def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Compute dtype: "auto" is bf16 on CUDA and fp32 on CPU (what is stored is `storage`, not this)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    name = aliases.get(dtype, dtype)
    if name not in DTYPES:
        raise ValueError(f"extract: dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def batch_input_ids(
    shard: TokenShard, indices: list[int], device: torch.device
) -> tuple[torch.Tensor, list[int]]:
    """Right-padded input_ids [B, T] of the samples `indices`, and their lengths.

    No attention mask is needed: with right padding and causal attention a real token attends only
    to earlier real tokens of its own row, at positions 0..n-1, so its states are those of the
    unpadded sample; pad rows compute garbage nobody reads. Without a mask SDPA takes its fused
    causal kernel instead of materialising a [B, 1, T, T] mask.
    """
    lengths = [int(shard.sample_offsets[i + 1] - shard.sample_offsets[i]) for i in indices]
    ids = torch.zeros(len(indices), max(lengths), dtype=torch.long)  # pad id 0: never read back
    for row, (index, n) in enumerate(zip(indices, lengths, strict=True)):
        ids[row, :n] = torch.from_numpy(shard.sample(index)[0].astype(np.int64))
    return ids.to(device), lengths


def plan_shard(lengths: list[int], token_budget: int, row_bytes: int, device_type: str = "cuda") -> BatchPlan:
    """The extraction plan: padding-aware batches, planned in windows of WINDOW_BYTES of raw states so
    that the chunks waiting for their last sample never hold more than about a window."""
    overhead = BATCH_OVERHEAD_TOKENS if device_type == "cuda" else CPU_BATCH_OVERHEAD_TOKENS
    window = max(token_budget, WINDOW_BYTES // row_bytes)
    return plan_batches(lengths, token_budget, batch_overhead_tokens=overhead, window_tokens=window)


def run_extraction(
    model: torch.nn.Module,
    shard: TokenShard,
    plan: BatchPlan,
    out_store: str | os.PathLike,
    *,
    layer_ids: list[int],
    hidden: int,
    attrs: dict,
    storage: str = "bf16",
    chunk_tokens: int = CHUNK_TOKENS,
    chunks_per_shard: int = 1,
    compression: str = "zstd",
    writer_threads: int = 1,
    writer_process: bool = False,
    progress: bool = False,
    label: str = "extract",
) -> dict:
    """Run `model` over `plan` and write the store atomically.

    Returns {"seconds": wall time, "writer_wait_seconds": time the model waited on the writer,
    "peak_pending_chunks": most chunks held in memory at once, waiting for their last sample}, and the
    writer process's figures with `writer_process` (`eyas.extract.writer_process`).
    `model` is the loaded target (any device); it may be None only when the plan has no batches.
    """
    device = next(model.parameters()).device if model is not None else torch.device("cpu")
    groups = len(layer_ids) + 1
    start = time.perf_counter()
    store_args = dict(
        path=out_store, sample_offsets=shard.sample_offsets, hidden_size=hidden, num_taps=len(layer_ids),
        attrs=attrs, chunk_tokens=chunk_tokens, storage=storage, chunks_per_shard=chunks_per_shard,
        compression=compression,
    )  # fmt: skip
    writer = open_store_writer(store_args, device, writer_threads, process=writer_process)
    capture, bar = None, tqdm(total=plan.real_tokens, unit="tok", desc=label, disable=not progress)
    lines = Progress(log, f"extract {out_store}", plan.real_tokens, "tok")
    try:
        capture = TapCapture(model, layer_ids, final=True) if model is not None else None
        if plan.empty:
            writer.put(empty_rows(plan.empty, groups, hidden, storage))
        for indices in plan.batches:
            staged, tokens = run_batch(
                model, capture, shard, indices, device, storage, writer.pool, writer.copy_stream
            )
            writer.put(staged)
            bar.update(tokens)
            lines.update(tokens)
        writer.close()
    except BaseException as err:
        writer.abort()
        err.add_note(f"extract: while writing hidden store {out_store} (not created)")
        raise
    finally:
        bar.close()
        if capture is not None:
            capture.remove()
    return {
        "seconds": time.perf_counter() - start,
        "writer_wait_seconds": writer.wait_seconds,
        "peak_pending_chunks": writer.peak_pending_chunks,
        **writer.stats,
    }


def run_batch(
    model: torch.nn.Module,
    capture: TapCapture,
    shard: TokenShard,
    indices: list[int],
    device: torch.device,
    storage: str,
    pool: PinnedPool | None,
    copy_stream: torch.cuda.Stream | None,
) -> tuple[StagedBatch, int]:
    """The target over the samples `indices`: their taps and final states, captured and staged for
    the writer (`stage_batch`); returns the staged batch and its real token count. The captured
    device tensors are released on return, before the writer may block."""
    input_ids, lengths = batch_input_ids(shard, indices, device)
    with torch.inference_mode():
        base_decoder(model)(input_ids=input_ids, use_cache=False)
        taps, final = capture.take()
        staged = stage_batch(indices, lengths, taps, final, storage, pool, copy_stream)
    return staged, sum(lengths)


# --------------------------------------------------------------------------- the stage
def extract_shard(
    token_shard: str,
    out_store: str,
    model_dir: str,
    *,
    layer_ids: list[int],
    device: str = "cpu",
    dtype: str = "auto",
    token_budget: int = 8192,
    model_id: str,
    trust_remote_code: bool = False,
    storage: str = "bf16",
    chunk_tokens: int = CHUNK_TOKENS,
    chunks_per_shard: int = 1,
    compression: str = "zstd",
    writer_threads: int | None = None,
    writer_process: bool = False,
    progress: bool = True,
    threads: int | None = None,
) -> dict:
    """Write the hidden store of `token_shard` to `out_store` (atomically) and return run stats.

    `threads` sets torch's intra-op threads (the Snakemake rule passes its `threads`) and, when
    `writer_threads` is None, sizes the compression pool. `writer_process`: write the store from a
    child process (`eyas.extract.writer_process`) instead of threads of this one.
    """
    if threads:
        torch.set_num_threads(threads)
    writer_threads = writer_threads if writer_threads is not None else default_writer_threads(threads)
    check_storage(storage)
    torch_device = extract_device(device)
    compute_dtype = resolve_dtype(dtype, torch_device)
    _, num_layers, hidden, layer_ids, shard = open_job(token_shard, model_dir, layer_ids)
    row_bytes = (len(layer_ids) + 1) * hidden * 2
    plan = plan_shard(np.diff(shard.sample_offsets).tolist(), token_budget, row_bytes, torch_device.type)
    attrs = store_attrs(
        shard, token_shard, model_id, model_dir, layer_ids, backend="hf", compute_dtype=compute_dtype,
        device=torch_device,
    )  # fmt: skip
    start = time.perf_counter()
    model = None
    if plan.batches:  # an empty shard needs no model
        model = load_checked_target(model_dir, num_layers, compute_dtype, torch_device, trust_remote_code)
    load_seconds = time.perf_counter() - start

    timing = run_extraction(
        model, shard, plan, out_store, layer_ids=layer_ids, hidden=hidden, attrs=attrs, storage=storage,
        chunk_tokens=chunk_tokens, chunks_per_shard=chunks_per_shard, compression=compression,
        writer_threads=writer_threads, writer_process=writer_process,
        progress=progress, label=Path(token_shard).name,
    )  # fmt: skip
    stats = extraction_stats(plan, out_store, shard.num_samples, len(layer_ids), hidden, timing["seconds"])
    writing = {key: value for key, value in timing.items() if key != "seconds"}  # the writer's figures
    run = {"load_seconds": load_seconds, "storage": storage, "writer_threads": writer_threads}
    return stats | writing | run | {"writer_process": writer_process}


def extract_device(device: str) -> torch.device:
    """The device `extract.device` names; a CUDA device where CUDA is not available is refused."""
    torch_device = torch.device(device)
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"extract: device {device!r} requested but CUDA is not available")
    return torch_device


def load_checked_target(
    model_dir: str, num_layers: int, dtype: torch.dtype, device: torch.device, trust_remote_code: bool
) -> torch.nn.Module:
    """The target, loaded for extraction; refused when it has another layer count than its config."""
    model = load_target(model_dir, dtype, device, trust_remote_code=trust_remote_code)
    if len(base_decoder(model).layers) != num_layers:
        raise ValueError(f"extract: {model_dir}: config says {num_layers} layers, the model disagrees")
    return model


def extraction_stats(
    plan: BatchPlan, out_store: str | os.PathLike, samples: int, taps: int, hidden: int, seconds: float
) -> dict:
    stored = stored_bytes(out_store)
    raw = plan.real_tokens * (taps + 1) * hidden * 2
    return {
        "samples": samples,
        "tokens": plan.real_tokens,
        "batches": len(plan.batches),
        "padded_tokens": plan.padded_tokens,
        "padding_fraction": plan.padding_fraction,
        "seconds": seconds,
        "tokens_per_s": plan.real_tokens / seconds if seconds > 0 else 0.0,
        "bytes_stored": stored,
        "bytes_raw_bf16": raw,
        "compression_ratio": raw / stored if stored else 0.0,
        "bytes_per_token": stored / plan.real_tokens if plan.real_tokens else 0.0,
        "peak_rss_bytes": peak_rss_bytes(),
    }
