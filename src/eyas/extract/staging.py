"""Device side of extraction: encode a batch's taps on the device and start its copy to the host.

The copy runs on a side stream into reused pinned buffers, so the next forward starts at once and
the transfer overlaps it; an event tells the writer when the bytes have landed. Allocating pinned
memory per batch cost a 1.5B-shape target 36% of its prefill speed on an H200, hence the pool. A batch
takes one buffer (rows, scales and token ids at aligned offsets in it); the writer process's pool
(`eyas.extract.writer_process.SegmentPool`) hands out page-locked shared memory the same way.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from eyas.store.quant import fp8_quantize


class PinnedPool:
    """Reusable pinned host byte buffers. The writer queue's bound caps how many are in use."""

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            fitting = [i for i, buf in enumerate(self._free) if buf.numel() >= nbytes]
            if fitting:  # the smallest that fits, so one large buffer is not spent on a small batch
                best = min(fitting, key=lambda i: self._free[i].numel())
                return self._free.pop(best)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def release(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)


def staging_resources(device: torch.device) -> tuple[PinnedPool | None, torch.cuda.Stream | None]:
    """On CUDA, the reused pinned buffers and the side stream that copies batches into them; on
    other devices neither (states are encoded in host memory directly)."""
    if device.type != "cuda":
        return None, None
    return PinnedPool(), torch.cuda.Stream(device)


@dataclass
class StagedBatch:
    """One batch on its way to disk, on the host (or landing there: wait for `ready`).

    rows [B, T, (K+1)*H]: bf16 bits as uint16 (storage bf16) or e4m3 bits as uint8 (fp8_e4m3),
    taps in layer_ids order then the final state. scale [B, T, K+1] float32 for fp8, else None.
    Whole samples: row b holds sample indices[b], lengths[b] rows. Pieces (SGLang's packed extend
    batches, B = 1): `pieces` lists (sample, first row within the sample, row in `rows`, count), and
    `token_ids` [T] are the tokens the rows were computed for, checked against the shard's. In the
    writer process the same fields are numpy views of shared memory.
    """

    indices: list[int]
    lengths: list[int]
    rows: torch.Tensor
    scale: torch.Tensor | None
    ready: torch.cuda.Event | None = None
    buffers: tuple[torch.Tensor, ...] = ()  # the pool buffer the batch was copied into, handed back
    pieces: list[tuple[int, int, int, int]] | None = None
    token_ids: torch.Tensor | None = None


def encode_batch(taps: list[torch.Tensor], final: torch.Tensor, storage: str):
    """Taps (each [B, T, H]) and final [B, T, H] -> (rows [B, T, (K+1)H], scale [B, T, K+1] or None)."""
    batch, length, hidden = final.shape
    groups = len(taps) + 1
    if storage == "bf16":
        rows = torch.empty(batch, length, groups * hidden, dtype=torch.bfloat16, device=final.device)
        for i, tensor in enumerate([*taps, final]):
            rows[..., i * hidden : (i + 1) * hidden].copy_(tensor)  # copy_ rounds to bf16
        return rows.view(torch.uint16), None
    stacked = torch.stack([*taps, final], dim=2)  # [B, T, K+1, H]
    bits, scale = fp8_quantize(stacked)  # [B, T, K+1, H] uint8, [B, T, K+1] float32
    return bits.view(batch, length, groups * hidden), scale


HOST_ALIGN = 64  # bytes: each tensor of a batch starts at a multiple of this in the batch's buffer


def host_layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Where each tensor goes in one host buffer for the whole batch: (byte offsets, total bytes)."""
    offsets, total = [], 0
    for tensor in tensors:
        offsets.append(total)
        total += -(-tensor.numel() * tensor.element_size() // HOST_ALIGN) * HOST_ALIGN
    return offsets, total


def host_views(buffer: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    """Views of `buffer` (uint8) shaped and typed like `tensors`, at `offsets`."""
    views = []
    for tensor, offset in zip(tensors, offsets, strict=True):
        nbytes = tensor.numel() * tensor.element_size()
        views.append(buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape))
    return views


def _to_host(tensors: list[torch.Tensor], pool) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Start the copies of a batch's device tensors into one buffer of `pool` (non-blocking)."""
    offsets, total = host_layout(tensors)
    buffer = pool.get(total)
    host = host_views(buffer, tensors, offsets)
    for view, tensor in zip(host, tensors, strict=True):
        view.copy_(tensor, non_blocking=True)
    return host, buffer


def stage_batch(
    indices: list[int],
    lengths: list[int],
    taps: list[torch.Tensor],
    final: torch.Tensor,
    storage: str,
    pool: PinnedPool | None,
    copy_stream: torch.cuda.Stream | None,
    token_ids: torch.Tensor | None = None,
) -> StagedBatch:
    """Encode on the device, then (CUDA) copy into one buffer of `pool` (pinned host memory: a
    `PinnedPool` or the writer process's `SegmentPool`) on `copy_stream`.
    `token_ids` (optional, any integer dtype) travel beside the rows for the writer's check."""
    rows, scale = encode_batch(taps, final, storage)
    if final.device.type != "cuda":
        ids = None if token_ids is None else token_ids.cpu()
        return StagedBatch(indices, lengths, rows, scale, token_ids=ids)
    assert pool is not None and copy_stream is not None
    copy_stream.wait_stream(torch.cuda.current_stream())  # the encode kernels must finish first
    device_tensors = [t for t in (rows, scale, token_ids) if t is not None]
    with torch.cuda.stream(copy_stream):
        host, buffer = _to_host(device_tensors, pool)
        ready = torch.cuda.Event()
        ready.record(copy_stream)
    # The caching allocator must not hand these to the next forward before the copy has read them.
    for tensor in device_tensors:
        tensor.record_stream(copy_stream)
    host_rows = host.pop(0)
    host_scale = host.pop(0) if scale is not None else None
    host_ids = host.pop(0) if token_ids is not None else None
    return StagedBatch(indices, lengths, host_rows, host_scale, ready, (buffer,), token_ids=host_ids)
