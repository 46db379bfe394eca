"""Extract stage, Hugging Face backend: run the target over a token shard and write a hidden store.

Per sample we keep K aux taps (drafter convention: tap `v` is the output of 0-based decoder layer `v`,
HF `hidden_states[v + 1]`) and the post-norm final state, bf16 on disk (docs/design.md). Capture is
by forward hooks on the decoder layers and the final norm of the base model, called without the
lm_head: `output_hidden_states=True` would keep all L+1 states alive and the CausalLM would build
[B, T, V] logits nobody reads.

Threads: the main thread runs the model; one writer thread owns the `HiddenStoreWriter` (not
thread-safe) and is fed whole batches through a bounded queue, so a slow disk or codec pushes back
on the model instead of piling batches up in memory. With `writer_threads > 1` the writer thread
hands each finished chunk to a small pool that encodes and writes disjoint chunks in parallel
(zarr/blosc release the GIL while compressing).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from eyas.capture import TapCapture, base_decoder, validate_layer_ids
from eyas.extract.batching import plan_batches
from eyas.provenance import EYAS_VERSION, FINAL_NORM, LAYER_ID_CONVENTION, model_hash, sha256_array
from eyas.store import HiddenStoreWriter, ProvenanceError, TokenShard, hidden_store_writer, read_token_shard
from eyas.target import load_target, read_config

QUEUE_BATCHES = 2  # batches waiting for the writer: enough to hide jitter, bounded for memory
COPIED_SHARD_ATTRS = ("tokenizer_hash", "chat_template_hash", "split", "shard")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------- small pure helpers
def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Compute dtype: "auto" is bf16 on CUDA and fp32 on CPU (storage is bf16 either way)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    name = aliases.get(dtype, dtype)
    if name not in DTYPES:
        raise ValueError(f"extract: dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def _check_shard(shard: TokenShard, path: str, vocab_size: int) -> None:
    offsets = shard.sample_offsets
    if (
        len(offsets) == 0
        or offsets[0] != 0
        or offsets[-1] != len(shard.input_ids)
        or np.any(np.diff(offsets) < 0)
    ):
        raise ValueError(
            f"{path}: sample_offsets must rise from 0 to len(input_ids)={len(shard.input_ids)}, "
            f"got {offsets[:3].tolist()}...{offsets[-3:].tolist()}"
        )
    for field in COPIED_SHARD_ATTRS:
        if field not in shard.attrs:
            raise ProvenanceError(f"{path}: token shard attrs lack provenance field {field!r}")
    bad = np.flatnonzero((shard.input_ids < 0) | (shard.input_ids >= vocab_size))
    if len(bad):
        sample = int(np.searchsorted(offsets, bad[0], side="right") - 1)
        raise ValueError(
            f"{path}: input_ids[{bad[0]}] (sample {sample}) = {shard.input_ids[bad[0]]} is outside the "
            f"target vocab [0, {vocab_size})"
        )


# --------------------------------------------------------------------------- staging to host
class PinnedPool:
    """Reusable pinned host buffers (FACTS §3: allocating pinned memory per batch cost 36%).

    The queue bound keeps at most QUEUE_BATCHES + 2 buffers in use, so the pool stays that small.
    """

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def get(self, numel: int) -> torch.Tensor:
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.numel() >= numel:
                    return self._free.pop(i)
        return torch.empty(numel, dtype=torch.bfloat16, pin_memory=True)

    def release(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)


@dataclass
class StagedBatch:
    """One batch on its way to disk: rows [B, T, (K+1)*H] bf16 on the host (aux taps, then final)."""

    indices: list[int]
    lengths: list[int]
    rows: torch.Tensor
    ready: torch.cuda.Event | None  # set once the device-to-host copy has landed
    buffer: torch.Tensor | None  # pinned pool buffer to hand back after writing


def stage_batch(
    taps: list[torch.Tensor], final: torch.Tensor, pool: PinnedPool | None
) -> tuple[torch.Tensor, torch.cuda.Event | None, torch.Tensor | None]:
    """Round taps and final to bf16 in one [B, T, (K+1)*H] tensor and start its copy to the host."""
    batch, length, hidden = final.shape
    width = (len(taps) + 1) * hidden
    packed = torch.empty(batch, length, width, dtype=torch.bfloat16, device=final.device)  # [B, T, (K+1)H]
    for i, tensor in enumerate([*taps, final]):
        packed[..., i * hidden : (i + 1) * hidden].copy_(tensor)  # copy_ rounds to bf16
    if final.device.type != "cuda":
        return packed, None, None
    assert pool is not None
    buffer = pool.get(packed.numel())
    host = buffer[: packed.numel()].view(batch, length, width)
    host.copy_(packed, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready, buffer


# --------------------------------------------------------------------------- writing
class _ChunkWriters:
    """Encode and write whole chunks on a thread pool; chunks are disjoint, so zarr allows it.

    Swaps the store writer's arrays for proxies whose slice assignment is queued; a semaphore bounds
    the chunks in flight so memory stays flat if the codec is the bottleneck.
    """

    def __init__(self, store: HiddenStoreWriter, threads: int):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="eyas-chunk")
        self._slots = threading.BoundedSemaphore(2 * threads)
        self._futures: list[Future] = []
        store.arrays = {name: _QueuedArray(array, self) for name, array in store.arrays.items()}

    def submit(self, fn: Callable, *args) -> None:
        self._slots.acquire()
        future = self._pool.submit(fn, *args)
        future.add_done_callback(lambda _: self._slots.release())
        self._futures = [f for f in self._futures if not f.done() or f.exception() is not None]
        self._futures.append(future)
        self.raise_errors()

    def raise_errors(self) -> None:
        for future in self._futures:
            if future.done() and future.exception() is not None:
                raise future.exception()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.raise_errors()

    def abort(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class _QueuedArray:
    def __init__(self, array, writers: _ChunkWriters):
        self._array, self._writers = array, writers

    def __setitem__(self, key, value) -> None:
        self._writers.submit(self._array.__setitem__, key, value)


class BatchWriter:
    """The one thread that owns the HiddenStoreWriter, fed through a bounded queue."""

    def __init__(self, store: HiddenStoreWriter, pool: PinnedPool | None, writer_threads: int):
        self.store, self.pool = store, pool
        self.kh = store.widths["aux"]
        self.chunks = _ChunkWriters(store, writer_threads) if writer_threads > 1 else None
        self.queue: queue.Queue[StagedBatch | None] = queue.Queue(maxsize=QUEUE_BATCHES)
        self.error: BaseException | None = None
        self.aborted = False
        self.thread = threading.Thread(target=self._run, name="eyas-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # Keep consuming until the sentinel even after an error, so the producer never blocks forever.
        while (item := self.queue.get()) is not None:
            try:
                if self.error is None and not self.aborted:
                    self._write(item)
            except BaseException as exc:  # handed to the main thread by put()/close()
                self.error = exc
            finally:
                if item.buffer is not None and self.pool is not None:
                    self.pool.release(item.buffer)

    def _write(self, item: StagedBatch) -> None:
        if item.ready is not None:
            item.ready.synchronize()
        rows = item.rows.view(torch.uint16).numpy()  # [B, T, (K+1)H], the raw bf16 bits
        for b, (index, n) in enumerate(zip(item.indices, item.lengths, strict=True)):
            self.store.write_sample(index, rows[b, :n, : self.kh], rows[b, :n, self.kh :])

    def put(self, item: StagedBatch) -> None:
        while True:
            self._raise()
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"extract: the writer thread failed: {self.error}") from self.error

    def close(self) -> None:
        """Drain the queue, wait for every chunk on disk, re-raise a writer error."""
        self.queue.put(None)
        self.thread.join()
        if self.chunks is not None:
            self.chunks.close()
        self._raise()

    def abort(self) -> None:
        """Drop what is queued and wait until nothing writes into the store any more."""
        self.aborted = True
        self.queue.put(None)
        self.thread.join()
        if self.chunks is not None:
            self.chunks.abort()


def _batch_tensors(
    shard: TokenShard, indices: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """Right-padded input_ids [B, T] and attention mask [B, T] (None when no row is padded)."""
    lengths = [int(shard.sample_offsets[i + 1] - shard.sample_offsets[i]) for i in indices]
    width = max(lengths)
    ids = torch.zeros(len(indices), width, dtype=torch.long)  # pad id 0: masked out, never read back
    mask = torch.zeros(len(indices), width, dtype=torch.long)
    for row, (index, n) in enumerate(zip(indices, lengths, strict=True)):
        ids[row, :n] = torch.from_numpy(shard.sample(index)[0].astype(np.int64))
        mask[row, :n] = 1
    # Right padding + causal attention: real rows never see the padding, positions stay 0..n-1.
    attention_mask = None if min(lengths) == width else mask.to(device)
    return ids.to(device), attention_mask, lengths


def _stored_bytes(store: Path) -> int:
    return sum(
        f.stat().st_size for name in ("aux", "final") for f in (store / name).rglob("*") if f.is_file()
    )


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
    writer_threads: int = 1,
    progress: bool = True,
    threads: int | None = None,
) -> dict:
    """Write the hidden store of `token_shard` to `out_store` (atomically) and return run stats.

    `threads` sets torch's intra-op threads (the Snakemake rule passes its `threads`).
    """
    if threads:
        torch.set_num_threads(threads)
    if writer_threads < 1:
        raise ValueError(f"extract: writer_threads must be >= 1, got {writer_threads}")
    torch_device = torch.device(device)
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"extract: device {device!r} requested but CUDA is not available")
    compute_dtype = resolve_dtype(dtype, torch_device)
    config = read_config(model_dir)
    config = config.get("text_config", config)  # multimodal wrappers nest the language model's config
    num_layers, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
    layer_ids = validate_layer_ids(layer_ids, num_layers)

    shard = read_token_shard(token_shard)
    _check_shard(shard, token_shard, int(config["vocab_size"]))
    lengths = np.diff(shard.sample_offsets).tolist()
    plan = plan_batches(lengths, token_budget)
    attrs = {  # provenance, docs/design.md; the store writer adds format, sizes, dtype and codec
        "model_id": model_id,
        "model_hash": model_hash(model_dir),
        "layer_ids": layer_ids,
        "layer_id_convention": LAYER_ID_CONVENTION,
        "final_norm": FINAL_NORM,
        "compute_dtype": str(compute_dtype).removeprefix("torch."),
        "device": str(torch_device),
        "backend": "hf",
        **{field: shard.attrs[field] for field in COPIED_SHARD_ATTRS},
        "tokens_checksum": sha256_array(shard.input_ids),
        "token_shard": os.fspath(token_shard),
        "eyas_version": EYAS_VERSION,
    }

    start = time.perf_counter()
    model = None
    if plan.batches:  # an empty shard needs no model
        model = load_target(model_dir, compute_dtype, torch_device, trust_remote_code=trust_remote_code)
        if len(base_decoder(model).layers) != num_layers:
            raise ValueError(f"extract: {model_dir}: config says {num_layers} layers, the model disagrees")
    load_seconds = time.perf_counter() - start

    start = time.perf_counter()
    with hidden_store_writer(out_store, shard.sample_offsets, hidden, len(layer_ids), attrs) as store:
        pool = PinnedPool() if torch_device.type == "cuda" else None
        writer = BatchWriter(store, pool, writer_threads)
        capture = TapCapture(model, layer_ids, final=True) if model is not None else None
        bar = tqdm(total=plan.real_tokens, unit="tok", desc=Path(token_shard).name, disable=not progress)
        try:
            if plan.empty:  # zero-length samples own no rows but must still be marked written
                no_rows = torch.zeros(len(plan.empty), 0, (len(layer_ids) + 1) * hidden, dtype=torch.bfloat16)
                writer.put(StagedBatch(plan.empty, [0] * len(plan.empty), no_rows, None, None))
            for indices in plan.batches:
                input_ids, attention_mask, batch_lengths = _batch_tensors(shard, indices, torch_device)
                with torch.inference_mode():
                    base_decoder(model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
                taps, final = capture.take()
                rows, ready, buffer = stage_batch(taps, final, pool)
                del taps, final
                writer.put(StagedBatch(indices, batch_lengths, rows, ready, buffer))
                bar.update(sum(batch_lengths))
            writer.close()
        except BaseException as err:
            writer.abort()
            err.add_note(f"extract: while writing hidden store {out_store} (not created)")
            raise
        finally:
            bar.close()
            if capture is not None:
                capture.remove()
    seconds = time.perf_counter() - start

    stored = _stored_bytes(Path(out_store))
    raw = plan.real_tokens * (len(layer_ids) + 1) * hidden * 2
    return {
        "samples": shard.num_samples,
        "tokens": plan.real_tokens,
        "batches": len(plan.batches),
        "padded_tokens": plan.padded_tokens,
        "padding_fraction": plan.padding_fraction,
        "load_seconds": load_seconds,
        "seconds": seconds,
        "tokens_per_s": plan.real_tokens / seconds if seconds > 0 else 0.0,
        "bytes_stored": stored,
        "bytes_raw_bf16": raw,
        "compression_ratio": raw / stored if stored else 0.0,
    }
