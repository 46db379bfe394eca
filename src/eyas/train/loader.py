"""Streaming batches of whole samples over (token shard, hidden store) pairs.

Token shards are small (5 bytes/token) and are read whole to plan batches; hidden states are read lazily,
sample by sample, by a few reader threads, each with its own open zarr stores (opened inside the reader,
never shared across a fork); Blosc decoding releases the GIL, so the readers decode in parallel and batches
still come out in plan order (or by worker processes, `train.loader_processes`: the readers' Python then
takes no GIL from the trainer's thread). Hidden states stay as stored (bf16: half the bytes to pin and
copy; fp8: the e4m3 bits and their scales, a quarter) and take the compute dtype on the device
(`Batch.to`). Batches are
right-padded rows of single samples, so the drafter needs no attention mask. The plan of an epoch depends
only on (seed, epoch): a resumed run skips batches without reading them.
"""

from __future__ import annotations

import hashlib
import signal
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from eyas.core.provenance import sha256_array
from eyas.data.formats import conversation_id
from eyas.store import HiddenStore, ProvenanceError, check_provenance, read_token_shard
from eyas.store.quant import fp8_dequantize

TOKEN_FIELDS = ("model_id", "tokenizer_hash", "chat_template_hash")  # provenance a token shard carries
SORT_WINDOW = 64  # at least this many samples sorted by length together (less padding) ...
WINDOW_BATCHES = 16  # ... and at least this many full batches' worth: a 64-sample window holds ~25k
# tokens of chat samples, so at 32k-token budgets every batch was a window padded to its longest (45% of
# the padded tokens real, measured: bench/loader_padding.py). Windows of several batches are the
# length-grouped sampling of transformers' LengthGroupedSampler (megabatches of 50 batches,
# `trainer_pt_utils.get_length_grouped_indices`); order stays random across windows and batches.
MIN_LENGTH = 3  # a sample needs t + 2 < T for one loss position
BATCH_PLAN = 2  # plan_batches version, in the checkpoint fingerprint: a resume skips its own plan's batches


def trainable(loss_mask: np.ndarray, lo: int, hi: int) -> bool:
    """A sample of a shard's rows [lo, hi) trains (and is measured held out): at least MIN_LENGTH
    tokens and a loss token after its second."""
    return hi - lo >= MIN_LENGTH and bool(loss_mask[lo + 2 : hi].any())


def conversation_kept(sample_id: str, fraction: float, seed: int) -> bool:
    """Whether a sample's conversation is in the `fraction` subset: sha256(seed, conversation id) read
    as a number in [0, 1) is below `fraction`, so subsets are nested and samples of one conversation
    stay together."""
    if fraction >= 1:
        return True
    digest = hashlib.sha256(f"{seed}:{conversation_id(sample_id)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


@dataclass
class Batch:
    aux: Tensor  # [B, T, K*H] bf16 (bf16 stores), e4m3 bits as uint8 (fp8 stores: see scale) or float32
    final: Tensor  # [B, T, H] same dtype as aux
    input_ids: Tensor  # [B, T] int64, 0 past each row's length
    loss_mask: Tensor  # [B, T] int64
    valid: Tensor  # [B, T] bool, True on real tokens
    lengths: Tensor  # [B] int64
    scale: Tensor | None = None  # [B, T, K+1] float32 when aux and final hold fp8 bits, else None

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def pin(self) -> Batch:
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return Batch(**{f: t if t is None else t.pin_memory() for f, t in fields.items()})

    pin_memory = pin  # the name torch's DataLoader pins a batch by (`_ProcessReaders`)

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> Batch:
        """On `device`, hidden states in `dtype` (the compute dtype). The cast, and an fp8 batch's
        dequantization, run there, after the smaller copy: fp8 bits are a quarter of float32's bytes,
        and readers that dequantized fed 1.9x-3.5x fewer tokens a second
        (bench/results/loader-storage.json)."""
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        moved = {f: t if t is None else t.to(device, non_blocking=True) for f, t in fields.items()}
        aux, final, scale = moved["aux"], moved["final"], moved.pop("scale")
        if scale is not None:
            rows, length, taps = scale.shape[0], scale.shape[1], scale.shape[2] - 1
            width = aux.shape[2] // taps  # explicit: an empty batch has no -1 to infer
            aux = fp8_dequantize(aux.view(rows, length, taps, width), scale[..., :taps])
            aux = aux.view(rows, length, taps * width)
            final = fp8_dequantize(final, scale[..., taps])  # [B, T, H]
        moved["aux"], moved["final"] = aux.to(dtype), final.to(dtype)
        return Batch(**moved)


GPU_PAD_MULTIPLE = 64  # batch lengths on a GPU: shapes repeat, at < 64 padded tokens a row


def pad_multiple_for(device: torch.device | str) -> int:
    """Row-length multiple of batches on `device`: GPU_PAD_MULTIPLE on a GPU, none (1) on CPU, where
    a new shape costs nothing and padding only adds work."""
    return GPU_PAD_MULTIPLE if torch.device(device).type == "cuda" else 1


class PairedLoader:
    """Batches over paired stores; every pair is checked when the loader is built.

    expected: provenance fields every hidden store must carry (`check_provenance`); the subset in
    TOKEN_FIELDS is also checked on the token shards. Samples shorter than MIN_LENGTH or without a
    trainable token at index >= 2 are skipped (they can carry no loss). prefetch: batches read ahead
    (0 = read in the caller's thread); readers: threads reading those batches. fraction: train on
    that share of the conversations (`conversation_kept`); `skipped_by_fraction` counts the others.
    pad_multiple: rows are padded to a multiple of it, so batch shapes repeat (on a GPU every new
    shape costs host-side kernel set-up once: bench/train_shapes.py). processes: the readers are
    worker processes instead of threads (`_ProcessReaders`), so their Python holds no GIL the
    caller's thread needs.
    """

    def __init__(
        self,
        token_shards: list[str],
        hidden_stores: list[str],
        token_budget: int,
        seed: int,
        expected: dict,
        prefetch: int = 2,
        pin_memory: bool = False,
        readers: int = 4,
        fraction: float = 1.0,
        pad_multiple: int = 1,
        processes: bool = False,
    ):
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple={pad_multiple} must be >= 1")
        if len(token_shards) != len(hidden_stores):
            raise ValueError(f"{len(token_shards)} token shards but {len(hidden_stores)} hidden stores")
        if token_budget < MIN_LENGTH:
            raise ValueError(f"token_budget={token_budget} is too small")
        if readers < 1:
            raise ValueError(f"readers={readers} must be >= 1")
        self.hidden_paths = list(hidden_stores)
        self.token_budget = token_budget
        self.seed = seed
        self.prefetch = prefetch
        self.readers = readers
        self.pad_multiple = pad_multiple
        self.pin_memory = pin_memory  # page-locked batches: the host-to-GPU copy can run async
        self.processes = processes  # readers in worker processes (`_ProcessReaders`), else threads
        self._workers: _ProcessReaders | None = None
        self.tokens = []  # per pair: (input_ids, loss_mask, offsets) numpy
        samples = []  # (pair, sample, length)
        self.store_attrs: list[dict] = []
        self.skipped_by_fraction = 0
        for pair, (tok_path, hid_path) in enumerate(zip(token_shards, hidden_stores, strict=True)):
            shard = read_token_shard(tok_path)
            store = HiddenStore(hid_path)
            check_pair(shard, store, tok_path, hid_path, expected)
            self.store_attrs.append(store.attrs)
            self.tokens.append((shard.input_ids, shard.loss_mask, shard.sample_offsets))
            ids = shard.attrs.get("sample_ids") or []
            if fraction < 1 and len(ids) != shard.num_samples:
                raise ProvenanceError(f"{tok_path}: has no sample_ids for train.data_fraction")
            for s in range(shard.num_samples):
                if fraction < 1 and not conversation_kept(ids[s], fraction, seed):
                    self.skipped_by_fraction += 1
                    continue
                lo, hi = int(shard.sample_offsets[s]), int(shard.sample_offsets[s + 1])
                if trainable(shard.loss_mask, lo, hi):
                    samples.append((pair, s, hi - lo))
        self.samples = np.array(samples, dtype=np.int64).reshape(-1, 3)
        if not len(self.samples):
            raise ValueError(
                f"no trainable samples (at least {MIN_LENGTH} tokens with a loss token after the "
                f"second) in {', '.join(token_shards)}"
            )

    # ----------------------------------------------------------------------- planning
    def plan(self, epoch: int) -> list[np.ndarray]:
        """Batches of row indices into `self.samples` for `epoch` (deterministic in seed, epoch)."""
        return plan_batches(self.samples[:, 2], self.token_budget, self.seed, epoch)

    def num_batches(self, epoch: int) -> int:
        return len(self.plan(epoch))

    # ----------------------------------------------------------------------- reading
    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        """Batches of `epoch`, after skipping its first `skip` (read ahead in a background thread)."""
        yield from self.batches(self.plan(epoch)[skip:])

    def batches(self, plan: list[np.ndarray | None]) -> Iterator[Batch | None]:
        """Read the given batches in order (None passes through: an empty micro-batch)."""
        if self.prefetch <= 0:
            stores: dict[int, HiddenStore] = {}
            for rows in plan:
                yield self._read(rows, stores)
            return
        if self.processes:
            if self._workers is None:
                self._workers = _ProcessReaders(self)
            yield from self._workers.batches(plan)
            return
        yield from _prefetched(self, plan, max(self.prefetch, self.readers), self.readers)

    def close(self) -> None:
        """Stop the reader processes, if any (threads stop with each pass)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __getstate__(self) -> dict:  # what a worker process is sent: never the workers themselves
        return {**self.__dict__, "_workers": None}

    def _read(
        self, rows: np.ndarray | None, stores: dict[int, HiddenStore], pin: bool | None = None
    ) -> Batch | None:
        """The batch of `rows` (None: an empty micro-batch), read through `stores` (this thread's);
        pinned if `pin` (default: the loader's `pin_memory`)."""
        if rows is None:
            return None
        picks = self.samples[rows]
        t_max = -(-int(picks[:, 2].max()) // self.pad_multiple) * self.pad_multiple  # rounded up
        b = len(picks)
        # Allocated pinned when asked, and filled in place: stored chunks decode straight into the
        # batch (no per-sample tensors, no pinning copy). As stored: bf16, or fp8 bits and scales
        # (dequantized on the device, Batch.to); float32 where bf16 and fp8 stores meet in one batch.
        used = [self._store(pair, stores) for pair in np.unique(picks[:, 0]).tolist()]
        storages = {st.storage for st in used}
        fp8 = storages == {"fp8_e4m3"}
        dtype = torch.uint8 if fp8 else torch.bfloat16 if storages == {"bf16"} else torch.float32
        pin = self.pin_memory if pin is None else pin
        ids = torch.zeros(b, t_max, dtype=torch.int64, pin_memory=pin)
        mask = torch.zeros(b, t_max, dtype=torch.int64, pin_memory=pin)
        aux = torch.empty(b, t_max, used[0].aux.shape[1], dtype=dtype, pin_memory=pin)  # [B, T, K*H]
        final = torch.empty(b, t_max, used[0].final.shape[1], dtype=dtype, pin_memory=pin)  # [B, T, H]
        scale = torch.empty(b, t_max, used[0].scale.shape[1], pin_memory=pin) if fp8 else None  # [B, T, K+1]
        for row, (pair, s, length) in enumerate(picks.tolist()):
            store = self._store(pair, stores)
            if fp8:
                store.stored_sample_into(s, aux[row, :length], final[row, :length], scale[row, :length])
                scale[row, length:] = 0
            else:
                store.sample_into(s, aux[row, :length], final[row, :length])
            aux[row, length:] = 0  # padding: zeros (+0.0 as e4m3 bits too), never stale memory (NaN
            final[row, length:] = 0  # bits would leak through attention's zero weights)
            input_ids, loss_mask, offsets = self.tokens[pair]
            lo = int(offsets[s])
            ids[row, :length] = torch.from_numpy(input_ids[lo : lo + length].astype(np.int64))
            mask[row, :length] = torch.from_numpy(loss_mask[lo : lo + length].astype(np.int64))
        lengths = torch.as_tensor(picks[:, 2])
        valid = torch.arange(t_max)[None, :] < lengths[:, None]
        if pin:
            lengths, valid = lengths.pin_memory(), valid.pin_memory()
        return Batch(aux, final, ids, mask, valid, lengths, scale)

    def _store(self, pair: int, stores: dict[int, HiddenStore]) -> HiddenStore:
        if pair not in stores:
            stores[pair] = HiddenStore(self.hidden_paths[pair])
        return stores[pair]


def sort_window(lengths: np.ndarray, token_budget: int) -> int:
    """Samples sorted by length together: SORT_WINDOW, or WINDOW_BATCHES budgets of samples of the
    mean length if that is more."""
    mean = float(np.mean(lengths)) if len(lengths) else 1.0
    return max(SORT_WINDOW, int(np.ceil(WINDOW_BATCHES * token_budget / max(mean, 1.0))))


def plan_batches(lengths: np.ndarray, token_budget: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Batches of indices into `lengths` for `epoch`: a random order, sorted by length within windows
    (`sort_window`: less padding), rows added while rows x longest <= token_budget (a longer sample
    gets a batch of its own), then the batches shuffled. Deterministic in (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    size = sort_window(lengths, token_budget)
    batches: list[np.ndarray] = []
    for lo in range(0, len(order), size):
        window = order[lo : lo + size]
        window = window[np.argsort(lengths[window], kind="stable")]
        batch: list[int] = []
        longest = 0
        for idx in window:
            length = int(lengths[idx])
            if batch and (len(batch) + 1) * max(longest, length) > token_budget:
                batches.append(np.array(batch))
                batch, longest = [], 0
            batch.append(int(idx))
            longest = max(longest, length)
        if batch:
            batches.append(np.array(batch))
    return [batches[i] for i in rng.permutation(len(batches))]


def check_pair(shard, store: HiddenStore, tok_path: str, hid_path: str, expected: dict) -> None:
    """Refuse a hidden store that was not extracted from this token shard with the expected setup."""
    if not np.array_equal(shard.sample_offsets, store.sample_offsets):
        raise ProvenanceError(f"{hid_path}: sample_offsets differ from those of token shard {tok_path}")
    checksum = sha256_array(shard.input_ids)
    if store.attrs.get("tokens_checksum") != checksum:
        raise ProvenanceError(
            f"{hid_path}: provenance field 'tokens_checksum' is {store.attrs.get('tokens_checksum')!r}, "
            f"expected {checksum!r} (sha256 of {tok_path} input_ids)"
        )
    check_provenance(store.attrs, expected, hid_path)
    check_provenance(shard.attrs, {k: v for k, v in expected.items() if k in TOKEN_FIELDS}, tok_path)


def _prefetched(
    loader: PairedLoader, plan: list[np.ndarray | None], depth: int, readers: int
) -> Iterator[Batch | None]:
    """Read up to `depth` batches ahead on `readers` threads; yield them in plan order."""
    local = threading.local()  # each reader thread opens its own stores

    def read(rows: np.ndarray | None) -> Batch | None:
        if not hasattr(local, "stores"):
            local.stores = {}
        return loader._read(rows, local.stores)

    pool = ThreadPoolExecutor(readers, thread_name_prefix="eyas-loader")
    pending: deque = deque()
    todo = iter(plan)
    try:
        for rows in todo:
            pending.append(pool.submit(read, rows))
            if len(pending) >= depth:
                break
        while pending:
            batch = pending.popleft().result()  # re-raises a reader's error here
            for rows in todo:  # keep `depth` in flight
                pending.append(pool.submit(read, rows))
                break
            yield batch
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)


class _PlanSampler(torch.utils.data.Sampler):
    """The batches (rows of samples, or None) of the plan being read, in order: set before each pass."""

    def __init__(self) -> None:
        self.plan: list[np.ndarray | None] = []

    def __iter__(self):
        return iter(self.plan)

    def __len__(self) -> int:
        return len(self.plan)


class _PlannedBatches(torch.utils.data.Dataset):
    """A batch read by its rows, in a worker process that opens the stores once."""

    def __init__(self, loader: PairedLoader):
        self.loader = loader
        self.stores: dict[int, HiddenStore] = {}

    def __getitem__(self, rows: np.ndarray | None) -> Batch | None:
        return self.loader._read(rows, self.stores, pin=False)  # pinned by the DataLoader, here


def _leave_sigterm_to_the_trainer(_worker_id: int) -> None:
    """A reader worker ignores SIGTERM. A cluster preempts a job by signalling every process in it
    (SLURM's requeue, https://slurm.schedmd.com/scontrol.html#OPT_requeue): a worker killed by it takes
    the trainer down with "DataLoader worker exited unexpectedly" before the trainer can save the
    checkpoint its own SIGTERM handler asks for (`eyas.train.preemption`). The forkserver the workers
    come from dies of the same signal, and each worker then stops after the batch it is reading (torch's
    workers watch their parent): batches are taken in order, so that is the one the trainer waits for.
    Not covered: a step that gathers more micro-batches than there are readers after the signal
    (`grad_accum`), and a worker signalled while it still imports, at the run's start."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _ProcessReaders:
    """`readers` worker processes reading batches ahead (torch's DataLoader: each batch comes back
    through shared memory and is pinned in the caller's process), kept for the whole run.

    Why processes: reader threads share the trainer's GIL, and their Python between reads and
    decodes held back a dispatch-bound thread beside them 1.9x with one reader
    (bench/results/loader-gil-cpu.json). `forkserver`: the trainer's process has CUDA and compile
    threads that a fork would copy mid-state; a worker starts once and opens its own stores.
    """

    def __init__(self, loader: PairedLoader):
        self.sampler = _PlanSampler()
        self.data = torch.utils.data.DataLoader(
            _PlannedBatches(loader),
            batch_size=None,  # each item is a whole batch already
            sampler=self.sampler,
            num_workers=loader.readers,
            prefetch_factor=max(1, -(-max(loader.prefetch, loader.readers) // loader.readers)),
            persistent_workers=True,
            pin_memory=loader.pin_memory,
            multiprocessing_context="forkserver",
            worker_init_fn=_leave_sigterm_to_the_trainer,
        )

    def batches(self, plan: list[np.ndarray | None]) -> Iterator[Batch | None]:
        self.sampler.plan = list(plan)
        if plan:
            yield from self.data

    def close(self) -> None:
        # persistent workers stop with their iterator (torch's DataLoader keeps it in `_iterator`)
        iterator, self.data._iterator = getattr(self.data, "_iterator", None), None
        if iterator is not None:
            iterator._shutdown_workers()
