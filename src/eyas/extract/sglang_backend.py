"""Extract stage, SGLang backend: a stock SGLang engine with aux capture on, rows taken in-process.

With `engine/sglang.py` (which builds every engine's arguments), the only module that imports sglang,
lazily: its pure parts run anywhere. Nothing in SGLang's files is edited. The engine's scheduler process
is started through `Engine.run_scheduler_process_func` on a subclass; there, before the scheduler is
built, `install_capture` wraps `ModelRunner.forward` (an AFTER hook) and, on releases without a
capture-only mode, turns aux capture on.

Why a hook and not the public `return_hidden_states` (read in the sglang 0.5.23 sources): that path ships
Python float lists through ZMQ, drops the middle chunks of chunked prefill and never returns the final
state. The hook sees every extend forward: `forward_batch.rids`, `extend_prefix_lens_cpu`,
`extend_seq_lens_cpu` say which rows belong to which sample and where in it; the rows are encoded on the
device, copied into reused pinned buffers on a side stream (`extract.staging`) and written by the same
writer as the HF backend (`extract.writer`, `HiddenStoreWriter.write_rows` reassembles chunked prefill).
The store is finished (atomic rename) by the forward that completes the last sample, before SGLang
answers that request, so it exists when the last `generate` call returns."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eyas.config import SglangSettings
from eyas.core.atomic import atomic_file
from eyas.core.layer_ids import sglang_layer_ids, text_model_type
from eyas.core.logs import Progress, child_stage_logging, keep_stage_logging
from eyas.engine.sglang import base_engine_args, check_tested, server_arg_names, user_engine_args
from eyas.extract.job import (
    default_writer_threads,
    open_job,
    peak_rss_bytes,
    store_attrs,
    stored_bytes,
)
from eyas.extract.staging import PinnedPool, stage_batch
from eyas.extract.writer import BatchWriter, empty_rows
from eyas.store import CHUNK_TOKENS, hidden_store_writer, read_token_shard
from eyas.store.quant import check_storage

log = logging.getLogger("eyas.extract")

BUILTIN_CAPTURE_FROM = (0, 5, 22)  # `enable_return_aux_hidden_states` (capture-only mode) exists
WARMUP_REQUESTS = 8


class PrefixReuseError(RuntimeError):
    """A sample's first rows were served from a cache: they were never computed, so never captured."""


# --------------------------------------------------------------------------- pure helpers
def capture_route(version: str) -> str:
    """`builtin` (0.5.22+: capture-only server args) or `scheduler` (0.5.17-0.5.21: switched on in the
    scheduler process). The one place that decides per version."""
    parsed = check_tested(version, "extract")
    return "builtin" if parsed >= BUILTIN_CAPTURE_FROM else "scheduler"


def request_rid(prefix: str, index: int) -> str:
    return f"{prefix}{index}"


def batch_pieces(
    rids: list[str] | None, prefix_lens: list[int] | None, extend_lens: list[int] | None, prefix: str
) -> list[tuple[int, int, int, int]]:
    """Rows of one packed extend batch -> (sample, first row in the sample, row in the batch, count)
    for this job's requests. Requests of others (warm-up, dummy runs) keep their rows but are skipped."""
    if rids is None or prefix_lens is None or extend_lens is None:
        return []
    pieces, row = [], 0
    for rid, start, count in zip(rids, prefix_lens, extend_lens, strict=True):
        if isinstance(rid, str) and rid.startswith(prefix) and rid[len(prefix) :].isdigit():
            pieces.append((int(rid[len(prefix) :]), int(start), row, int(count)))
        row += int(count)
    return pieces


# --------------------------------------------------------------------------- scheduler process side
@dataclass(frozen=True)
class CaptureSpec:
    """What the scheduler process needs to write the store; pickled into it by SGLang's spawn."""

    store: str
    token_shard: str
    stats_path: str
    attrs: dict
    hidden: int
    num_taps: int
    sglang_layer_ids: list[int]
    storage: str
    chunk_tokens: int
    writer_threads: int
    rid_prefix: str
    route: str


class RowSink:
    """Takes each extend forward's rows and writes them into the store; finishes it when complete."""

    def __init__(self, spec: CaptureSpec, device: torch.device):
        self.spec, self.start = spec, time.perf_counter()
        shard = read_token_shard(spec.token_shard)
        self.lengths = np.diff(shard.sample_offsets)
        self.received = np.zeros(len(self.lengths), dtype=np.int64)
        self.remaining = int(np.count_nonzero(self.lengths))
        self.forwards = 0
        self._stack = contextlib.ExitStack()
        self.store = self._stack.enter_context(
            hidden_store_writer(
                spec.store,
                shard.sample_offsets,
                spec.hidden,
                spec.num_taps,
                spec.attrs,
                spec.chunk_tokens,
                spec.storage,
            )
        )
        cuda = device.type == "cuda"
        self.pool = PinnedPool() if cuda else None
        self.copy_stream = torch.cuda.Stream(device) if cuda else None
        self.writer = BatchWriter(self.store, self.pool, spec.writer_threads, shard_ids=shard.input_ids)
        empty = np.flatnonzero(self.lengths == 0).tolist()
        if empty:
            self.writer.put(empty_rows(empty, spec.num_taps + 1, spec.hidden, spec.storage))
        self.closed = False

    def take(self, pieces: list[tuple[int, int, int, int]], aux, final, input_ids) -> None:
        """aux [T', K*H], final [T', H], input_ids [T'] of one forward (T' >= rows of `pieces`)."""
        if self.closed or not pieces:
            return
        try:
            self._take(pieces, aux, final, input_ids)
        except BaseException as err:
            self.closed = True
            self.writer.abort()
            self._stack.__exit__(type(err), err, err.__traceback__)  # the unfinished store is removed
            raise

    def _take(self, pieces, aux, final, input_ids) -> None:
        for index, start, _, count in pieces:
            if not 0 <= index < len(self.lengths):
                raise ValueError(f"extract: request for sample {index}, the shard has {len(self.lengths)}")
            if start != self.received[index]:
                kind = PrefixReuseError if self.received[index] == 0 else RuntimeError
                raise kind(
                    f"extract: sample {index} arrived with rows from {start} on after {self.received[index]} "
                    "captured rows: its first rows came from a prefix cache (keep disable_radix_cache on) "
                    "or a chunk was lost"
                )
            self.received[index] += count
            if self.received[index] > self.lengths[index]:
                raise RuntimeError(
                    f"extract: sample {index} got {self.received[index]} rows of {self.lengths[index]}"
                )
            self.remaining -= int(self.received[index] == self.lengths[index])
        rows = max(row + count for _, _, row, count in pieces)
        taps, hidden = self.spec.num_taps, self.spec.hidden
        aux = aux[:rows].reshape(1, rows, taps, hidden)  # [1, T, K, H]
        final = final[:rows].reshape(1, rows, hidden)  # [1, T, H]
        staged = stage_batch(
            [p[0] for p in pieces],
            [p[3] for p in pieces],
            list(aux.unbind(2)),
            final,
            self.spec.storage,
            self.pool,
            self.copy_stream,
            token_ids=input_ids[:rows],
        )
        staged.pieces = pieces
        self.writer.put(staged)
        self.forwards += 1
        if self.remaining == 0:
            self.close()

    def close(self) -> None:
        """Drain the writer, finish the store (atomic rename) and leave the run's stats for the job."""
        self.closed = True
        try:
            self.writer.close()
        except BaseException as err:
            self._stack.__exit__(type(err), err, err.__traceback__)
            raise
        self._stack.close()
        seconds = time.perf_counter() - self.start
        stats = {
            "capture_seconds": seconds,
            "forwards": self.forwards,
            "writer_wait_seconds": self.writer.wait_seconds,
            "peak_pending_chunks": self.store.peak_pending_chunks,
            "scheduler_peak_rss_bytes": peak_rss_bytes(),
        }
        with atomic_file(self.spec.stats_path) as fh:
            json.dump(stats, fh)


def _logits_output(output):
    """ModelRunner.forward returns ModelRunnerOutput (0.5.2x) or (logits_output, can_run_graph)."""
    return output.logits_output if hasattr(output, "logits_output") else output[0]


def _is_writer_rank(runner) -> bool:
    """Every TP rank holds the full hidden states after the all-reduce; attention-TP rank 0 writes."""
    try:
        from sglang.srt.layers.dp_attention import get_attention_tp_rank

        return get_attention_tp_rank() == 0
    except (ImportError, AssertionError, AttributeError):
        return getattr(runner, "tp_rank", 0) == 0


def install_capture(spec: CaptureSpec) -> None:
    """In the scheduler process: wrap ModelRunner.forward (AFTER hook) and, on the `scheduler` route,
    turn aux capture on. Idempotent."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    if spec.route == "scheduler":
        _enable_aux_capture(spec.sglang_layer_ids)
        _keep_final_state()
    original = ModelRunner.forward
    if getattr(original, "eyas_capture", None) is not None:
        return
    sink: list[RowSink] = []

    @functools.wraps(original)
    def forward(self, forward_batch, *args, **kwargs):
        output = original(self, forward_batch, *args, **kwargs)
        if getattr(self, "is_draft_worker", False) or not forward_batch.forward_mode.is_extend():
            return output
        if not _is_writer_rank(self):
            return output
        pieces = batch_pieces(
            forward_batch.rids,
            forward_batch.extend_prefix_lens_cpu,
            forward_batch.extend_seq_lens_cpu,
            spec.rid_prefix,
        )
        if not pieces:
            return output
        logits = _logits_output(output)
        aux, final = logits.hidden_states, getattr(logits, "last_hidden_states", None)
        if aux is None or final is None:
            raise RuntimeError(
                "extract: SGLang returned no aux/final hidden states for an extend batch: aux capture is "
                f"off or this sglang release ({spec.route} route) is not supported"
            )
        if not sink:
            sink.append(RowSink(spec, aux.device))
        sink[0].take(pieces, aux, final, forward_batch.input_ids)
        return output

    forward.eyas_capture = spec
    ModelRunner.forward = forward


def _enable_aux_capture(layer_ids: list[int]) -> None:
    """sglang 0.5.17-0.5.21 have no capture-only mode: make the target's aux-capture config say
    EAGLE-3 capture with our ids, as if a drafter were loaded (none is)."""
    from sglang.srt.model_executor import model_runner as runner_module

    resolve = getattr(runner_module, "resolve_spec_aux_hidden_state_config", None)
    if resolve is None:
        raise RuntimeError(
            "extract: this sglang has no resolve_spec_aux_hidden_state_config to switch capture on"
        )
    if getattr(resolve, "eyas_capture", False):
        return

    @functools.wraps(resolve)
    def resolve_with_capture(*args, **kwargs):
        config = resolve(*args, **kwargs)
        if not kwargs.get("is_draft_worker", False):
            config.eagle_use_aux_hidden_state = True
            config.eagle_aux_hidden_state_layer_ids = list(layer_ids)
        return config

    resolve_with_capture.eyas_capture = True
    runner_module.resolve_spec_aux_hidden_state_config = resolve_with_capture


def _keep_final_state() -> None:
    """sglang 0.5.17-0.5.21 return only the packed aux taps when aux capture is on: keep the post-norm
    final state the logits processor is given as the output's `last_hidden_states` (0.5.22+ does)."""
    from sglang.srt.layers.logits_processor import LogitsProcessor

    original = LogitsProcessor.forward
    if getattr(original, "eyas_capture", False):
        return

    @functools.wraps(original)
    def forward(self, input_ids, hidden_states, *args, **kwargs):
        output = original(self, input_ids, hidden_states, *args, **kwargs)
        if getattr(output, "last_hidden_states", None) is None:
            output.last_hidden_states = hidden_states  # [T, H], after the final norm
        return output

    forward.eyas_capture = True
    LogitsProcessor.forward = forward


def scheduler_process(spec: CaptureSpec, *args, **kwargs):
    """`run_scheduler_process_func` of the capture engine: install the capture, then run SGLang's."""
    child_stage_logging()
    install_capture(spec)
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)


# --------------------------------------------------------------------------- the stage (job process)
# Engine args the capture depends on, or that have keys of their own in the `sglang` section.
OWNED_ARGS = frozenset(
    {
        "model_path",
        "tp_size",
        "mem_fraction_static",
        "chunked_prefill_size",
        "attention_backend",
        "disable_radix_cache",
        "skip_tokenizer_init",
        "dtype",
        "trust_remote_code",
        "enable_return_aux_hidden_states",
        "enable_return_hidden_states",
        "speculative_algorithm",
        "return_aux_hidden_state_layer_ids",
    }
)


def engine_args(
    route: str,
    sglang_ids: list[int],
    settings: SglangSettings,
    model_dir: str,
    dtype: str,
    trust: bool,
    known: set[str] | None = None,
) -> dict:
    """The capture engine's args: every engine's (`eyas.engine.sglang.base_engine_args`, from the
    `sglang` section) plus what capture needs."""
    args = base_engine_args(settings, model_dir, dtype, trust) | {
        "disable_radix_cache": True,  # a cached prefix is never computed, so never captured
        "disable_cuda_graph": True,  # decode graphs: nothing is decoded, so not worth their start-up
        "sampling_backend": "pytorch",  # nothing is sampled either: no sampler kernels to build
    }
    if route == "builtin":
        args |= {
            "enable_return_aux_hidden_states": True,
            "speculative_algorithm": "EAGLE3",  # names the capture convention only; no draft is loaded
            "return_aux_hidden_state_layer_ids": list(sglang_ids),
        }
    else:
        args |= {"enable_return_hidden_states": True}  # FULL capture mode on every extend batch
    return args | user_engine_args(settings.engine_args, known, OWNED_ARGS)


def capture_engine_class(spec: CaptureSpec):
    from sglang.srt.entrypoints.engine import Engine

    class CaptureEngine(Engine):
        run_scheduler_process_func = staticmethod(functools.partial(scheduler_process, spec))

    return CaptureEngine


def extract_shard_sglang(
    token_shard: str,
    out_store: str,
    model_dir: str,
    *,
    layer_ids: list[int],
    model_id: str,
    settings: SglangSettings,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    storage: str = "bf16",
    chunk_tokens: int = CHUNK_TOKENS,
    writer_threads: int | None = None,
    threads: int | None = None,
) -> dict:
    """Write the hidden store of `token_shard` with an SGLang engine; returns run stats."""
    import sglang

    route = capture_route(sglang.__version__)
    check_storage(storage)
    config, _, hidden, layer_ids, shard = open_job(token_shard, model_dir, layer_ids)
    model_type = text_model_type(config)
    sglang_ids = sglang_layer_ids(model_type, layer_ids)
    lengths = np.diff(shard.sample_offsets)
    compute_dtype = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    attrs = store_attrs(
        shard,
        token_shard,
        model_id,
        model_dir,
        layer_ids,
        backend="sglang",
        compute_dtype=compute_dtype,
        device=torch.device("cuda"),
    ) | {
        "sglang_version": sglang.__version__,
        "sglang_layer_ids": sglang_ids,
        "sglang_model_type": model_type,
        "capture_route": route,
        "tp_size": settings.tp_size,
        "chunked_prefill_size": settings.chunked_prefill_size,
    }
    stats_path = f"{os.fspath(out_store).rstrip('/')}.stats.json"
    with contextlib.suppress(FileNotFoundError):
        os.remove(stats_path)
    spec = CaptureSpec(
        store=os.fspath(out_store),
        token_shard=os.fspath(token_shard),
        stats_path=stats_path,
        attrs=attrs,
        hidden=hidden,
        num_taps=len(layer_ids),
        sglang_layer_ids=sglang_ids,
        storage=storage,
        chunk_tokens=chunk_tokens,
        writer_threads=writer_threads if writer_threads is not None else default_writer_threads(threads),
        rid_prefix=f"eyas-{uuid.uuid4().hex[:12]}-",
        route=route,
    )
    todo = np.flatnonzero(lengths > 0).tolist()
    if not todo:  # nothing to compute: no engine, an all-empty store
        from eyas.extract.hf_backend import plan_shard, run_extraction

        plan = plan_shard(lengths.tolist(), 1, (len(layer_ids) + 1) * hidden * 2)
        run_extraction(
            None, shard, plan, out_store, layer_ids=layer_ids, hidden=hidden, attrs=attrs, storage=storage
        )
        return {"samples": shard.num_samples, "tokens": 0, "backend": "sglang"}

    start = time.perf_counter()
    engine = capture_engine_class(spec)(
        **engine_args(
            route,
            sglang_ids,
            settings,
            model_dir,
            str(compute_dtype).removeprefix("torch."),
            trust_remote_code,
            server_arg_names(),
        )
    )
    keep_stage_logging()  # SGLang's configure_logger reset the root logger as the engine started
    try:
        # Kernels compile on first use: a few requests under other rids (the hook skips them) first,
        # so the timed part is the steady state the job spends its hours in.
        warm = todo[:WARMUP_REQUESTS]
        engine.generate(
            input_ids=[shard.sample(i)[0].tolist() for i in warm],
            sampling_params={"max_new_tokens": 0},
            rid=[f"warmup-{spec.rid_prefix}{i}" for i in warm],
        )
        load_seconds = time.perf_counter() - start
        step = settings.requests_per_call
        progress = Progress(log, f"extract {out_store}", int(lengths.sum()), "tok")
        for lo in range(0, len(todo), step):
            group = todo[lo : lo + step]
            engine.generate(
                input_ids=[shard.sample(i)[0].tolist() for i in group],
                sampling_params={"max_new_tokens": 0},
                rid=[request_rid(spec.rid_prefix, i) for i in group],
            )
            progress.update(int(lengths[group].sum()))
        seconds = time.perf_counter() - start - load_seconds
    finally:
        engine.shutdown()
    if not Path(out_store).exists() or not Path(stats_path).exists():
        raise RuntimeError(
            f"extract: SGLang answered every request but {out_store} was not finished (see the log)"
        )
    capture = json.loads(Path(stats_path).read_text())
    os.remove(stats_path)
    tokens = int(lengths.sum())
    stored = stored_bytes(out_store)
    return capture | {
        "backend": "sglang",
        "capture_route": route,
        "samples": shard.num_samples,
        "tokens": tokens,
        "load_seconds": load_seconds,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "bytes_stored": stored,
        "bytes_per_token": stored / tokens,
        "storage": storage,
        "peak_rss_bytes": peak_rss_bytes(),
    }
