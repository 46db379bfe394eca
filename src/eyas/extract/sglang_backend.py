"""Extract stage, SGLang backend: a stock SGLang engine with aux capture on, rows taken in-process.

The job process's side: the capture engine's args and class, the requests, the run's figures. The
engine's scheduler process is started through `Engine.run_scheduler_process_func` on a subclass; there,
before the scheduler is built, `eyas.extract.sglang_capture` hooks `ModelRunner.forward`, and the rows
go into the hidden store through `eyas.extract.sglang_sink.RowSink`. sglang is imported lazily. The
store is finished (atomic rename) by the forward that completes the last sample, before SGLang answers
that request, so it exists when the last `generate` call returns."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
import uuid
from pathlib import Path

import numpy as np
import torch

from eyas.config import SglangSettings
from eyas.core.layer_ids import sglang_layer_ids, text_model_type
from eyas.core.logs import Progress, keep_stage_logging
from eyas.engine.sglang_args import base_engine_args, check_tested, server_arg_names, user_engine_args
from eyas.engine.sglang_models import only_needed_models
from eyas.extract.job import (
    default_writer_threads,
    open_job,
    peak_rss_bytes,
    store_attrs,
    stored_bytes,
)
from eyas.extract.sglang_capture import scheduler_process
from eyas.extract.sglang_sink import CaptureSpec, request_rid, warmup_rid
from eyas.store import CHUNK_TOKENS
from eyas.store.quant import check_storage

log = logging.getLogger("eyas.extract")

BUILTIN_CAPTURE_FROM = (0, 5, 22)  # `enable_return_aux_hidden_states` (capture-only mode) exists
WARMUP_REQUESTS = 8


# --------------------------------------------------------------------------- pure helpers
def capture_route(version: str) -> str:
    """`builtin` (0.5.22+: capture-only server args) or `scheduler` (0.5.17-0.5.21: switched on in the
    scheduler process). The one place that decides per version."""
    parsed = check_tested(version, "extract")
    return "builtin" if parsed >= BUILTIN_CAPTURE_FROM else "scheduler"


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
    """The capture engine's args: every engine's (`eyas.engine.sglang_args.base_engine_args`, from the
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
    args |= user_engine_args(settings.engine_args, known, OWNED_ARGS)
    _refuse_several_writers(args)
    return args


# Engine layouts the capture cannot write: one store a shard, written by the scheduler of TP rank 0.
SEVERAL_WRITERS = {
    "dp_size": "each data-parallel scheduler would write this shard's one store; for more engines, "
    "split the data into more shards (tokenize.train_shards / eval_shards)",
    "pp_size": "only the last pipeline stage holds the final hidden states, but every stage's TP rank 0 "
    "would write",
}


def _refuse_several_writers(args: dict) -> None:
    for key, why in SEVERAL_WRITERS.items():
        if int(args.get(key) or 1) > 1:
            raise ValueError(f"sglang.engine_args.{key}: {args[key]} is not supported by extraction: {why}")


def capture_engine_class(spec: CaptureSpec):
    from sglang.srt.entrypoints.engine import Engine

    class CaptureEngine(Engine):
        run_scheduler_process_func = staticmethod(functools.partial(scheduler_process, spec))

    return CaptureEngine


def _capture_spec(
    shard,
    token_shard: str,
    out_store: str,
    model_dir: str,
    *,
    model_id: str,
    layer_ids: list[int],
    hidden: int,
    model_type: str,
    sglang_ids: list[int],
    route: str,
    settings: SglangSettings,
    compute_dtype: torch.dtype,
    storage: str,
    chunk_tokens: int,
    chunks_per_shard: int,
    compression: str,
    writer_threads: int,
    writer_process: bool = False,
) -> CaptureSpec:
    """What the scheduler process needs to write the store of `shard`: the store's provenance attrs,
    where the run's stats go (a stale stats file removed) and this job's request-id prefix."""
    import sglang

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
    return CaptureSpec(
        store=os.fspath(out_store),
        token_shard=os.fspath(token_shard),
        stats_path=stats_path,
        attrs=attrs,
        hidden=hidden,
        num_taps=len(layer_ids),
        sglang_layer_ids=sglang_ids,
        storage=storage,
        chunk_tokens=chunk_tokens,
        chunks_per_shard=chunks_per_shard,
        compression=compression,
        writer_threads=writer_threads,
        writer_process=writer_process,
        rid_prefix=f"eyas-{uuid.uuid4().hex[:12]}-",
        route=route,
    )


def _empty_store(shard, lengths, out_store: str, spec: CaptureSpec, layer_ids: list[int]) -> dict:
    """Nothing to compute: no engine, an all-empty store (written as the HF backend writes it)."""
    from eyas.extract.hf_backend import plan_shard, run_extraction

    hidden, storage = spec.hidden, spec.storage
    plan = plan_shard(lengths.tolist(), 1, (len(layer_ids) + 1) * hidden * 2)
    run_extraction(
        None, shard, plan, out_store, layer_ids=layer_ids, hidden=hidden, attrs=spec.attrs, storage=storage,
        chunk_tokens=spec.chunk_tokens, chunks_per_shard=spec.chunks_per_shard, compression=spec.compression,
    )  # fmt: skip
    return {"samples": shard.num_samples, "tokens": 0, "backend": "sglang"}


def _serve_requests(
    engine, shard, lengths, todo: list[int], spec: CaptureSpec, per_call: int, out_store: str, start: float
) -> tuple[float, float]:
    """Send every sample of `todo` to the started `engine` (`per_call` a `generate` call) and shut it
    down; (seconds since `start` to the end of the warm-up, seconds of the timed requests)."""
    try:
        # Kernels compile on first use: a few requests under other rids (the hook skips them) first,
        # so the timed part is the steady state the job spends its hours in.
        warm = todo[:WARMUP_REQUESTS]
        engine.generate(
            input_ids=[shard.sample(i)[0].tolist() for i in warm],
            sampling_params={"max_new_tokens": 0},
            rid=[warmup_rid(spec.rid_prefix, i) for i in warm],
        )
        load_seconds = time.perf_counter() - start
        progress = Progress(log, f"extract {out_store}", int(lengths.sum()), "tok")
        for lo in range(0, len(todo), per_call):
            group = todo[lo : lo + per_call]
            engine.generate(
                input_ids=[shard.sample(i)[0].tolist() for i in group],
                sampling_params={"max_new_tokens": 0},
                rid=[request_rid(spec.rid_prefix, i) for i in group],
            )
            progress.update(int(lengths[group].sum()))
        seconds = time.perf_counter() - start - load_seconds
    finally:
        engine.shutdown()
    return load_seconds, seconds


def _capture_stats(out_store: str, stats_path: str) -> dict:
    """The stats the scheduler process left as it finished the store (the file is removed)."""
    if not Path(out_store).exists() or not Path(stats_path).exists():
        raise RuntimeError(
            f"extract: SGLang answered every request but {out_store} was not finished (see the log)"
        )
    capture = json.loads(Path(stats_path).read_text())
    os.remove(stats_path)
    return capture


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
    chunks_per_shard: int = 1,
    compression: str = "zstd",
    writer_threads: int | None = None,
    writer_process: bool = False,
    threads: int | None = None,
) -> dict:
    """Write the hidden store of `token_shard` with an SGLang engine; returns run stats.
    `writer_process`: the store is written from a child of the engine's scheduler process
    (`eyas.extract.writer_process`) instead of threads beside the scheduler."""
    import sglang

    route = capture_route(sglang.__version__)
    check_storage(storage)
    config, _, hidden, layer_ids, shard = open_job(token_shard, model_dir, layer_ids)
    model_type = text_model_type(config)
    sglang_ids = sglang_layer_ids(model_type, layer_ids)
    lengths = np.diff(shard.sample_offsets)
    compute_dtype = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    spec = _capture_spec(
        shard,
        token_shard,
        out_store,
        model_dir,
        model_id=model_id,
        layer_ids=layer_ids,
        hidden=hidden,
        model_type=model_type,
        sglang_ids=sglang_ids,
        route=route,
        settings=settings,
        compute_dtype=compute_dtype,
        storage=storage,
        chunk_tokens=chunk_tokens,
        chunks_per_shard=chunks_per_shard,
        compression=compression,
        writer_threads=writer_threads if writer_threads is not None else default_writer_threads(threads),
        writer_process=writer_process,
    )
    todo = np.flatnonzero(lengths > 0).tolist()
    if not todo:
        return _empty_store(shard, lengths, out_store, spec, layer_ids)

    start = time.perf_counter()
    dtype_name = str(compute_dtype).removeprefix("torch.")
    args = engine_args(
        route, sglang_ids, settings, model_dir, dtype_name, trust_remote_code, server_arg_names()
    )
    with only_needed_models([model_dir]):
        engine = capture_engine_class(spec)(**args)
    keep_stage_logging()  # SGLang's configure_logger reset the root logger as the engine started
    load_seconds, seconds = _serve_requests(
        engine, shard, lengths, todo, spec, settings.requests_per_call, out_store, start
    )
    capture = _capture_stats(out_store, spec.stats_path)
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
        "writer_process": writer_process,
        "peak_rss_bytes": peak_rss_bytes(),
    }
