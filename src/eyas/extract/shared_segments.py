"""Host buffers the writer process can read: POSIX shared memory, page-locked for CUDA copies.

The writer process (`eyas.extract.writer_process`) reads staged batches where the model's process copied
them, so the buffers are shared memory segments (`multiprocessing.shared_memory`, files in /dev/shm)
instead of `PinnedPool`'s pinned tensors, which no other process can map. A side-stream
`copy_(non_blocking=True)` into pageable memory would not overlap the next forward (CUDA Runtime API,
"API synchronization behavior": a device-to-pageable copy returns only once done), so each segment is
page-locked with `cudaHostRegister` (flags 0: with unified addressing, the default on 64-bit hosts, the
memory is pinned for every context) and unregistered before it is unmapped. torch's own checkpoint
staging pins shared memory the same way (`torch.cuda._pin_memory_utils`).

`SegmentPool` hands out whole segments as `PinnedPool` hands out buffers (`get(nbytes)`, `release`),
a batch a segment, at most `limit` segments: when all are in use it calls the writer's `wait` until
the child frees one (back-pressure). A batch that fits no free segment gets a new one (1.25x its bytes,
whole MiB), in place of the smallest free one when the limit is reached; the child is told to unmap
the old one (`forget`). Pages are reserved in /dev/shm when a segment is made, so a full tmpfs (a
container's default is 64 MB) fails there, naming the setting, instead of killing the process with
SIGBUS at the first write into the mapping.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from multiprocessing.shared_memory import SharedMemory

import torch

MIB = 1 << 20
SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory (tmpfs)
_LINGERING: list[SharedMemory] = []  # unlinked segments a view still holds: unmapped with that view


def _cuda_call(what: str, err) -> None:
    if int(err) != 0:
        raise RuntimeError(f"extract: {what} failed with cudaError {int(err)}")


def segment_bytes(nbytes: int) -> int:
    """The size of a new segment for a batch of `nbytes`: a quarter more, in whole MiB, so that
    batches that grow a little reuse it."""
    return max(1, -(-(nbytes + nbytes // 4) // MIB)) * MIB


def _reserve(name: str, size: int) -> None:
    path = os.path.join(SHM_DIR, name)
    if not os.path.exists(path):  # not Linux's layout: nothing to reserve through
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EFBIG):  # a tmpfs that cannot reserve: used unreserved
            return
        raise RuntimeError(
            f"extract: the writer process needs a {size / MIB:.0f} MiB shared memory segment and {SHM_DIR} "
            f"cannot hold it ({err.strerror}): give it more room (docker --shm-size) or set "
            "extract.writer_process false"
        ) from err
    finally:
        os.close(fd)


class Segment:
    """One shared memory segment, mapped as a uint8 tensor [size]; page-locked with `pin`."""

    def __init__(self, name: str, size: int, pin: bool):
        self.name, self.size, self.pinned = name, size, False
        self.shm = SharedMemory(name=name, create=True, size=size)
        self.tensor = torch.frombuffer(self.shm.buf, dtype=torch.uint8)  # [size]
        self.ptr = self.tensor.data_ptr()
        try:
            _reserve(name, size)
            if pin:
                _cuda_call("cudaHostRegister", torch.cuda.cudart().cudaHostRegister(self.ptr, size, 0))
                self.pinned = True
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Unregister, unmap and unlink (the child's mapping, if any, stays valid until it unmaps)."""
        try:
            if self.pinned:
                self.pinned = False
                _cuda_call("cudaHostUnregister", torch.cuda.cudart().cudaHostUnregister(self.ptr))
        finally:
            self.tensor = None
            try:
                self.shm.close()
            except BufferError:  # a batch's view is still alive (an exception's frame)
                _LINGERING.append(self.shm)
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


class SegmentPool:
    """Segments named `prefix` + a count, at most `limit` of them; `wait()` is called when all are in
    use and returns once one was released, `forget(name)` when a free one is replaced."""

    def __init__(
        self, prefix: str, limit: int, pin: bool, wait: Callable[[], None], forget: Callable[[str], None]
    ):
        if limit < 1:
            raise ValueError(f"extract: the writer process needs at least one segment, got {limit}")
        self.prefix, self.limit, self.pin, self.wait, self.forget = prefix, limit, pin, wait, forget
        self.free: list[Segment] = []
        self.used: dict[str, Segment] = {}
        self.made = 0

    def take(self, nbytes: int) -> Segment:
        while True:
            fitting = [s for s in self.free if s.size >= nbytes]
            if fitting:  # the smallest that fits, so one large segment is not spent on a small batch
                segment = min(fitting, key=lambda s: s.size)
                self.free.remove(segment)
            elif len(self.free) + len(self.used) < self.limit:
                segment = Segment(f"{self.prefix}{self.made}", segment_bytes(nbytes), self.pin)
                self.made += 1
            elif self.free:  # none fits: the smallest free one makes way for a larger one
                self.retire(min(self.free, key=lambda s: s.size))
                continue
            else:
                self.wait()
                continue
            self.used[segment.name] = segment
            return segment

    def get(self, nbytes: int) -> torch.Tensor:
        """A free segment of at least `nbytes`, as a uint8 tensor [size] (`stage_batch`'s pool)."""
        return self.take(nbytes).tensor

    def of(self, buffer: torch.Tensor) -> Segment:
        segment = next((s for s in self.used.values() if s.ptr == buffer.data_ptr()), None)
        if segment is None:
            raise ValueError("extract: a batch staged outside the writer process's segments")
        return segment

    def release(self, buffer: torch.Tensor) -> None:
        self.release_name(self.of(buffer).name)

    def release_name(self, name: str) -> None:
        self.free.append(self.used.pop(name))

    def retire(self, segment: Segment) -> None:
        self.free.remove(segment)
        self.forget(segment.name)
        segment.release()

    def close(self) -> None:
        """Release every segment (all are unlinked even if one fails to unregister)."""
        segments, self.free, self.used = [*self.free, *self.used.values()], [], {}
        errors = []
        for segment in segments:
            try:
                segment.release()
            except RuntimeError as err:
                errors.append(err)
        if errors:
            raise errors[0]
