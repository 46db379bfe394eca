"""The writer process (`extract.writer_process`) on real child processes and real stores: the store is
byte for byte the thread writer's, a child's error or death reaches the parent (no hang), back-pressure
with one or two segments loses nothing, and no shared memory is left behind. The same through the HF
backend: tests/test_extract.py; through the SGLang row sink: tests/test_sglang_capture.py."""

from __future__ import annotations

import contextlib
import errno
import glob
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from eyas.core.atomic import tmp_sibling
from eyas.extract.shared_segments import MIB, SegmentPool, segment_bytes
from eyas.extract.staging import StagedBatch, stage_batch
from eyas.extract.writer import StoreWriter, empty_rows
from eyas.extract.writer_process import ProcessWriter, open_store_writer
from eyas.store import HiddenStore

K, H = 3, 8
LENGTHS = [5, 0, 9, 3, 14, 40, 1]


@pytest.fixture
def shard(random_shard):
    return random_shard(LENGTHS)


def _store_args(path: Path, storage: str, chunks_per_shard: int = 1) -> dict:
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    return dict(
        path=path, sample_offsets=offsets, hidden_size=H, num_taps=K, attrs={"model_id": "tiny"},
        chunk_tokens=4, storage=storage, chunks_per_shard=chunks_per_shard,
    )  # fmt: skip


def _process(store: Path, shard: Path | None, storage: str = "bf16", **kwargs) -> ProcessWriter:
    """A writer process on the CPU (2 writer threads) for `store`, checking pieces against `shard`."""
    ids = None if shard is None else str(shard)
    return ProcessWriter(_store_args(store, storage), torch.device("cpu"), 2, token_shard=ids, **kwargs)


def _states(sample: int, device: str = "cpu") -> tuple[list[torch.Tensor], torch.Tensor]:
    """Taps (K of [1, T, H]) and final [1, T, H] of `sample`, the same on every call."""
    g = torch.Generator().manual_seed(sample)
    taps = [torch.randn(1, LENGTHS[sample], H, generator=g).to(device) for _ in range(K)]
    return taps, torch.randn(1, LENGTHS[sample], H, generator=g).to(device)


def _whole(samples: list[int], storage: str, writer, device: str = "cpu") -> StagedBatch:
    """The samples as one right-padded batch [B, T, H], as the HF backend stages it."""
    longest = max(LENGTHS[s] for s in samples)
    taps = [torch.zeros(len(samples), longest, H, device=device) for _ in range(K)]
    final = torch.zeros(len(samples), longest, H, device=device)
    for b, sample in enumerate(samples):
        one_taps, one_final = _states(sample, device)
        for tap, one in zip(taps, one_taps, strict=True):
            tap[b, : LENGTHS[sample]] = one[0]
        final[b, : LENGTHS[sample]] = one_final[0]
    lengths = [LENGTHS[s] for s in samples]
    return stage_batch(samples, lengths, taps, final, storage, writer.pool, writer.copy_stream)


def _piece(sample: int, start: int, count: int, ids: np.ndarray, storage: str, writer, device="cpu"):
    """Rows [start, start + count) of `sample` alone in a packed extend batch (B = 1)."""
    taps, final = _states(sample, device)
    taps = [t[:, start : start + count] for t in taps]
    token_ids = torch.from_numpy(ids[start : start + count].astype(np.int64)).to(device)
    staged = stage_batch(
        [sample], [count], taps, final[:, start : start + count], storage, writer.pool, writer.copy_stream,
        token_ids=token_ids,
    )  # fmt: skip
    staged.pieces = [(sample, start, 0, count)]
    return staged


def _files(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def _shm(writer: ProcessWriter) -> list[str]:
    return glob.glob(f"/dev/shm/{writer.prefix}*")


def _left_nothing(tmp_path: Path, writer: ProcessWriter) -> None:
    """No store at h.zarr, no temporary one beside it (a killed child's too), no shared memory."""
    assert not (tmp_path / "h.zarr").exists() and not list(tmp_path.glob(".h.zarr*"))
    assert not _shm(writer)


@contextlib.contextmanager
def _deadline(seconds: float):
    """Fail instead of hanging: SIGALRM raises TimeoutError in the test after `seconds`."""

    def fire(*_):
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _write_all(writer, storage: str, ids: np.ndarray, device: str = "cpu") -> None:
    """Whole-sample batches, then sample 5 in three chunked-prefill pieces, as both backends feed."""
    writer.put(empty_rows([1], K + 1, H, storage))
    writer.put(_whole([0, 2], storage, writer, device))
    writer.put(_whole([3, 4, 6], storage, writer, device))
    lo = int(np.sum(LENGTHS[:5]))
    for start, count in ((0, 16), (16, 16), (32, 8)):
        writer.put(_piece(5, start, count, ids[lo : lo + 40], storage, writer, device))
    writer.close()


# --------------------------------------------------------------------------- the same store
@pytest.mark.parametrize("storage,chunks_per_shard", [("bf16", 1), ("fp8_e4m3", 1), ("fp8_e4m3", 3)])
def test_the_process_writes_the_thread_writers_store(tmp_path, shard, storage, chunks_per_shard):
    path, samples = shard
    ids = np.concatenate([s[0] for s in samples])
    thread = StoreWriter(_store_args(tmp_path / "t.zarr", storage, chunks_per_shard), torch.device("cpu"), 2)
    _write_all(thread, storage, ids)
    args = _store_args(tmp_path / "p.zarr", storage, chunks_per_shard)
    process = open_store_writer(args, torch.device("cpu"), 2, process=True, token_shard=str(path))
    assert isinstance(process, ProcessWriter)
    _write_all(process, storage, ids)
    assert _files(tmp_path / "p.zarr") == _files(tmp_path / "t.zarr")  # chunks, metadata, attrs
    assert HiddenStore(tmp_path / "p.zarr").attrs == HiddenStore(tmp_path / "t.zarr").attrs
    assert process.peak_pending_chunks == thread.peak_pending_chunks > 0
    assert process.stats["writer_process_batches"] == 6 and process.stats["writer_process_seconds"] > 0
    assert not _shm(process) and not list(tmp_path.glob(".p.zarr*"))


def test_back_pressure_with_one_or_two_segments_loses_no_batch(tmp_path, shard):
    """Many batches, each larger than the last (segments grow), through one and two segments."""
    path, samples = shard
    ids = np.concatenate([s[0] for s in samples])
    lo = int(np.sum(LENGTHS[:5]))
    cuts = [0, 1, 3, 6, 10, 15, 21, 28, 40]  # pieces of 1..12 rows of sample 5
    want = None
    for limit in (1, 2):
        args = _store_args(tmp_path / f"s{limit}.zarr", "bf16")
        writer = ProcessWriter(args, torch.device("cpu"), 1, token_shard=str(path), max_segments=limit)
        writer.put(_whole([0, 1, 2, 3, 4, 6], "bf16", writer))
        for start, stop in zip(cuts, cuts[1:], strict=False):
            writer.put(_piece(5, start, stop - start, ids[lo : lo + 40], "bf16", writer))
            assert len(writer.pool.free) + len(writer.pool.used) <= limit
        writer.close()
        stats = writer.stats
        assert writer.wait_seconds >= 0 and stats["writer_process_batches"] == len(cuts)
        if limit == 1:  # a batch after the first waits unless the child freed the segment already
            waits = stats["writer_process_wait_count"]
            assert 0 <= waits <= len(cuts) - 1
            assert (stats["writer_process_wait_first_batch"] is None) == (waits == 0)
            assert stats["writer_process_wait_copy_seconds"] == 0.0  # no copies on the CPU
        assert 0 <= stats["writer_process_queued_max_seconds"] <= stats["writer_process_queued_seconds"]
        got = _files(tmp_path / f"s{limit}.zarr")
        assert want is None or got == want
        want = got
        assert not _shm(writer)


def test_a_segment_freed_in_the_pipe_is_taken_without_waiting(tmp_path, shard):
    """With every segment in use, a free the child already sent is read before anything waits: on
    CUDA a batch's segment is taken for its copy (`stage_batch`) before `put` reads the pipe, and the
    scheduler must not block on an earlier batch's copy or on the child when a segment is there."""
    path, _ = shard
    writer = ProcessWriter(_store_args(tmp_path / "s.zarr", "bf16"), torch.device("cpu"), 1,
                           token_shard=str(path), max_segments=1)  # fmt: skip
    writer.wait_ready()  # its ("ready",) read: what the pipe holds next answers a batch
    writer.put(_whole([0, 1, 2, 3, 4, 6], "bf16", writer))
    assert writer.conn.poll(30) and not writer.pool.free  # freed by the child, not yet read here
    segment = writer.pool.take(1)  # as `stage_batch` takes one on CUDA, before `put`
    assert writer.stats["writer_process_wait_count"] == 0 and writer.wait_seconds == 0.0
    writer.pool.release_name(segment.name)
    writer.abort()


def test_segments_are_reused_grown_and_bounded():
    """The pool alone: the smallest fitting segment is reused, a batch no free segment fits replaces
    the smallest one (the child is told to forget it), and a full pool waits for a release."""
    forgotten, waits = [], []
    pool = SegmentPool(f"eyas-test-{os.getpid()}-", 2, False, lambda: waits.append(1), forgotten.append)
    try:
        small = pool.take(100)
        assert small.size == MIB and segment_bytes(3 * MIB) == 4 * MIB  # 1.25x, whole MiB
        pool.release(small.tensor)
        assert pool.take(MIB) is small  # fits: reused
        big = pool.take(3 * MIB)
        assert big.size == 4 * MIB and len(pool.used) == 2
        pool.wait = lambda: (waits.append(1), pool.release_name(big.name))
        assert pool.take(10) is big and waits == [1]  # full: waited until one was freed
        pool.release_name(small.name)
        grown = pool.take(2 * MIB)  # fits no free segment, and two exist: the small one makes way
        assert forgotten == [small.name] and grown.size == 3 * MIB
        assert not os.path.exists(f"/dev/shm/{small.name}")
    finally:
        pool.close()
    assert not glob.glob(f"/dev/shm/eyas-test-{os.getpid()}-*")


def test_a_batch_no_segment_fits_gets_a_larger_one_in_the_child_too(tmp_path, random_shard):
    """Wide rows (hidden 2048: 16 KiB a row) through one segment: each larger batch replaces it; the
    child maps the new one and unmaps the old; the store is the thread writer's."""
    lengths = [70, 200, 30]
    path, _ = random_shard(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    stores = {}
    for name in ("thread", "process"):
        args = dict(path=tmp_path / f"{name}.zarr", sample_offsets=offsets, hidden_size=2048, num_taps=K,
                    attrs={}, chunk_tokens=64)  # fmt: skip
        if name == "thread":
            writer = StoreWriter(args, torch.device("cpu"), 2)
        else:
            writer = ProcessWriter(args, torch.device("cpu"), 2, token_shard=str(path), max_segments=1)
        for sample, n in enumerate(lengths):
            g = torch.Generator().manual_seed(sample)
            taps = [torch.randn(1, n, 2048, generator=g) for _ in range(K)]  # K of [1, T, H]
            final = torch.randn(1, n, 2048, generator=g)
            writer.put(stage_batch([sample], [n], taps, final, "bf16", None, None))
        writer.close()
        stores[name] = _files(tmp_path / f"{name}.zarr")
    assert stores["process"] == stores["thread"]
    assert writer.pool.made == 2 and not _shm(writer)  # 70 rows: 2 MiB; 200 rows: 4 MiB; 30 fit that


# --------------------------------------------------------------------------- failures
def test_a_full_dev_shm_is_refused_by_name(tmp_path, shard, monkeypatch):
    """A segment /dev/shm cannot hold fails when it is made, naming the setting, not with SIGBUS later."""
    path, _ = shard

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    writer = _process(tmp_path / "h.zarr", path)
    with (
        _deadline(60),
        pytest.raises(RuntimeError, match="cannot hold it .*set extract.writer_process false"),
    ):
        writer.put(_whole([0, 2], "bf16", writer))
    writer.abort()
    _left_nothing(tmp_path, writer)


def test_a_piece_for_other_tokens_fails_in_the_parent_naming_the_sample(tmp_path, shard):
    path, samples = shard
    writer = _process(tmp_path / "h.zarr", path)
    ids = samples[2][0].copy()
    ids[3] += 1  # the engine computed another sequence
    failed = r"writer process failed: ValueError: sample 2: rows \[0, 9\) were computed for other tokens"
    with _deadline(60), pytest.raises(RuntimeError, match=failed):
        writer.put(_piece(2, 0, 9, ids, "bf16", writer))
        for _ in range(200):  # the child answers asynchronously: a later put (or close) raises
            time.sleep(0.05)
            writer.put(empty_rows([1], K + 1, H, "bf16"))
        writer.close()
    writer.abort()
    _left_nothing(tmp_path, writer)


def test_an_incomplete_store_fails_at_close_and_is_not_finished(tmp_path, shard):
    path, _ = shard
    writer = _process(tmp_path / "h.zarr", None)
    writer.put(_whole([0, 2], "bf16", writer))
    with _deadline(60), pytest.raises(RuntimeError, match="writer process failed: .*hidden store incomplete"):
        writer.close()
    writer.abort()  # after a failed close: nothing left to do
    _left_nothing(tmp_path, writer)
    assert writer.process.exitcode == 0


def test_a_daemonic_process_is_refused_by_name(tmp_path, shard, monkeypatch):
    """A daemon may start no process (SGLang's scheduler processes are not daemons: engine.py)."""
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True)
    with pytest.raises(RuntimeError, match="writer_process needs a process that may start one"):
        _process(tmp_path / "h.zarr", shard[0])


def test_a_killed_child_is_reported_not_waited_for(tmp_path, shard):
    path, _ = shard
    writer = _process(tmp_path / "h.zarr", path)
    writer.put(_whole([0, 2], "bf16", writer))
    with _deadline(60):
        while not tmp_sibling(tmp_path / "h.zarr", writer.process.pid).exists():
            time.sleep(0.05)  # the child has opened the store
        os.kill(writer.process.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"writer process died \(exit code -9\)"):
            for _ in range(100):
                writer.put(_whole([3], "bf16", writer))
            writer.close()
        writer.abort()
    _left_nothing(tmp_path, writer)  # a killed child's leftovers too


def test_wait_ready_returns_once_the_child_has_opened_the_store(tmp_path, shard):
    path, _ = shard
    writer = _process(tmp_path / "h.zarr", path)
    with _deadline(60):
        writer.wait_ready()
    assert writer.ready and tmp_sibling(tmp_path / "h.zarr", writer.process.pid).exists()
    writer.abort()
    assert not _shm(writer)


def test_wait_ready_raises_the_childs_error_when_it_cannot_open_the_store(tmp_path, shard):
    path, _ = shard
    args = _store_args(tmp_path / "h.zarr", "bf16") | {"chunk_tokens": 0}  # refused by the store writer
    writer = ProcessWriter(args, torch.device("cpu"), 2, token_shard=str(path))
    with _deadline(60), pytest.raises(RuntimeError, match="the writer process failed: ValueError: .*chunk"):
        writer.wait_ready()
    writer.abort()
    _left_nothing(tmp_path, writer)


def test_abort_leaves_no_store_and_no_shared_memory(tmp_path, shard):
    path, _ = shard
    writer = _process(tmp_path / "h.zarr", path)
    writer.put(_whole([0, 2], "bf16", writer))
    writer.put(_whole([3, 4], "bf16", writer))
    with _deadline(60):
        writer.abort()
    assert not writer.process.is_alive()
    _left_nothing(tmp_path, writer)


# --------------------------------------------------------------------------- CUDA (skipped without it)
@pytest.mark.gpu
@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_cuda_batches_land_in_registered_segments(tmp_path, shard, storage):
    """stage_batch copies CUDA tensors on the side stream into page-locked shared segments; the store
    equals the thread writer's from the same device encode."""
    path, samples = shard
    ids = np.concatenate([s[0] for s in samples])
    cuda = torch.device("cuda")
    thread = StoreWriter(_store_args(tmp_path / "t.zarr", storage), cuda, 2, shard_ids=ids)
    _write_all(thread, storage, ids, "cuda")
    writer = ProcessWriter(_store_args(tmp_path / "p.zarr", storage), cuda, 2, token_shard=str(path))
    staged = _whole([0, 2], storage, writer, "cuda")
    segment = writer.pool.of(staged.buffers[0])
    assert segment.pinned and segment.tensor.is_pinned() and staged.rows.is_pinned()
    writer.put(staged)
    assert staged.rows is None  # the writer owns the batch now
    writer.abort()
    assert not _shm(writer) and not (tmp_path / "p.zarr").exists()
    writer = ProcessWriter(_store_args(tmp_path / "p.zarr", storage), cuda, 2, token_shard=str(path))
    _write_all(writer, storage, ids, "cuda")
    assert _files(tmp_path / "p.zarr") == _files(tmp_path / "t.zarr")
    assert not _shm(writer)
    if storage == "bf16":  # and both are the CPU encode's: bf16 rounding is exact everywhere
        aux, final = HiddenStore(tmp_path / "p.zarr").sample(5)
        taps, want = _states(5)
        assert torch.equal(final, want[0].bfloat16())
        assert torch.equal(aux, torch.cat(taps, dim=-1)[0].bfloat16())
