"""SGLang backend, the parts that need no sglang: layer-id conventions, the version switch, slicing of
packed extend batches and the row sink that reassembles chunked prefill into a store (on CPU).
The same code on real sglang classes: tests/sglang/; on the GPU: tests/gpu/."""

from __future__ import annotations

import glob
import json
import multiprocessing
import sys
import types
from dataclasses import replace

import numpy as np
import pytest
import torch

from eyas.config import SglangSettings
from eyas.core.layer_ids import (
    resolve_aux_layer_ids,
    sglang_captured_inputs,
    sglang_layer_ids,
    tap_ids_from_sglang,
    tap_ids_from_vllm,
    text_model_type,
    vllm_layer_ids,
)
from eyas.extract.sglang_backend import capture_route, engine_args
from eyas.extract.sglang_capture import _tp_rank, install_capture
from eyas.extract.sglang_sink import (
    CaptureSpec,
    PrefixReuseError,
    RowSink,
    batch_pieces,
    request_rid,
    warmup_rid,
)
from eyas.store import HiddenStore
from eyas.store.quant import fp8_dequantize, fp8_quantize

K, H = 3, 8
PREFIX = "eyas-test-"


# --------------------------------------------------------------------------- layer ids
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3_moe", "gemma3_text", "glm4_moe"])
def test_plus_one_families_take_drafter_ids_as_they_are(model_type):
    assert sglang_layer_ids(model_type, [1, 14, 26]) == [1, 14, 26]
    assert sglang_layer_ids(model_type, [0, 5]) == [0, 5]
    assert sglang_captured_inputs(model_type, [1, 14, 26]) == [2, 15, 27]  # HF hidden_states[v + 1]


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2", "kimi_k2", "glm4_moe_lite"])
def test_first_id_one_families(model_type):
    # ids starting at 1: SGLang adds 1 to all, like Llama
    assert sglang_layer_ids(model_type, [1, 29, 57]) == [1, 29, 57]
    # otherwise SGLang takes them as hidden_states indices: we must add the 1 ourselves
    assert sglang_layer_ids(model_type, [2, 29, 57]) == [3, 30, 58]
    assert sglang_captured_inputs(model_type, [3, 30, 58]) == [3, 30, 58]
    for taps in ([1, 29, 57], [2, 29, 57], [5, 6]):
        assert tap_ids_from_sglang(model_type, sglang_layer_ids(model_type, taps)) == taps
    with pytest.raises(ValueError, match="tap 0"):
        sglang_layer_ids(model_type, [0, 29, 57])


def test_multimodal_wrapper_uses_its_language_model_type():
    kimi = {"model_type": "kimi_k25", "text_config": {"model_type": "deepseek_v3"}}
    assert text_model_type(kimi) == "deepseek_v3"
    assert text_model_type({"model_type": "llama"}) == "llama"


def test_default_taps_come_from_the_language_model_of_a_wrapper():
    text = {"model_type": "deepseek_v3", "num_hidden_layers": 61}
    assert resolve_aux_layer_ids({"model_type": "kimi_k25", "text_config": text}, None) == [1, 29, 57]
    assert resolve_aux_layer_ids(text, None) == [1, 29, 57]
    assert resolve_aux_layer_ids(text, [2, 30, 58]) == [2, 30, 58]
    with pytest.raises(ValueError, match="outside"):
        resolve_aux_layer_ids({"text_config": text}, [1, 61])
    with pytest.raises(KeyError):
        resolve_aux_layer_ids({"model_type": "kimi_k25"}, None)  # no layer count anywhere


def test_vllm_ids_are_hidden_states_indices():
    assert vllm_layer_ids([1, 29, 57]) == [2, 30, 58]  # the same for every family
    assert tap_ids_from_vllm(vllm_layer_ids([0, 5, 9])) == [0, 5, 9]


# --------------------------------------------------------------------------- versions, args, slicing
@pytest.mark.parametrize(
    ("version", "route"),
    [("0.5.17", "scheduler"), ("0.5.21", "scheduler"), ("0.5.22", "builtin"), ("0.5.23.post1", "builtin")],
)
def test_capture_route_per_version(version, route):
    assert capture_route(version) == route


@pytest.mark.parametrize("version", ["0.5.16", "0.5.24", "0.4.9"])
def test_untested_versions_are_refused(version):
    with pytest.raises(RuntimeError, match="tested range 0.5.17-0.5.23"):
        capture_route(version)


def test_engine_args_turn_capture_on_and_the_prefix_cache_off():
    settings = SglangSettings(
        tp_size=8, mem_fraction_static=0.8, chunked_prefill_size=4096, attention_backend="fa3"
    )
    builtin = engine_args("builtin", [1, 29, 57], settings, "/m", "bfloat16", False)
    assert builtin["enable_return_aux_hidden_states"] and builtin["speculative_algorithm"] == "EAGLE3"
    assert builtin["return_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert (
        builtin["disable_radix_cache"] and builtin["tp_size"] == 8 and builtin["attention_backend"] == "fa3"
    )
    older = engine_args(
        "scheduler", [1, 29, 57], replace(settings, attention_backend=None), "/m", "bfloat16", False
    )
    assert "speculative_algorithm" not in older and "attention_backend" not in older
    assert older["disable_radix_cache"]


def test_user_engine_args_pass_through_but_never_override_capture():
    settings = SglangSettings(tp_size=8, mem_fraction_static=0.8, chunked_prefill_size=4096)
    extra = {"ep_size": 8, "enable_dp_attention": True, "disable_cuda_graph": False}
    args = engine_args(
        "builtin", [1], replace(settings, engine_args=extra), "/m", "bfloat16", False, {*extra, "x"}
    )
    assert args["ep_size"] == 8 and args["enable_dp_attention"] and args["disable_cuda_graph"] is False
    assert args["disable_radix_cache"] and args["enable_return_aux_hidden_states"]
    for key in ("disable_radix_cache", "return_aux_hidden_state_layer_ids", "tp_size"):
        with pytest.raises(ValueError, match=f"sglang.engine_args.{key}: set by eyas"):
            engine_args("scheduler", [1], replace(settings, engine_args={key: 1}), "/m", "auto", False)
    with pytest.raises(ValueError, match="engine_args.ep_sise: not a ServerArgs field"):
        typo = replace(settings, engine_args={"ep_sise": 8})
        engine_args("builtin", [1], typo, "/m", "auto", False, {"ep_size"})


@pytest.mark.parametrize("key", ["dp_size", "pp_size"])
def test_layouts_with_several_writers_of_one_store_are_refused(key):
    """Data-parallel schedulers (with or without DP attention) and pipeline stages would each write the
    shard's one store; one of each is the default and passes."""
    settings = SglangSettings(tp_size=8, mem_fraction_static=0.8, chunked_prefill_size=4096)
    one = engine_args("builtin", [1], replace(settings, engine_args={key: 1}), "/m", "auto", False)
    assert one[key] == 1
    with pytest.raises(ValueError, match=f"sglang.engine_args.{key}: 2 is not supported by extraction"):
        engine_args("builtin", [1], replace(settings, engine_args={key: 2}), "/m", "auto", False)


def test_batch_pieces_follow_prefix_and_extend_lengths_and_skip_foreign_requests():
    rids = [request_rid(PREFIX, 7), "warmup-0", request_rid(PREFIX, 2), request_rid(PREFIX, 11)]
    pieces = batch_pieces(rids, [0, 0, 512, 0], [100, 4, 88, 1], PREFIX)
    assert pieces == [(7, 0, 0, 100), (2, 512, 104, 88), (11, 0, 192, 1)]
    assert batch_pieces(None, None, None, PREFIX) == []
    assert batch_pieces([warmup_rid(PREFIX, 3)], [0], [4], PREFIX) == []  # warm-up rows are not kept


# --------------------------------------------------------------------------- the row sink on CPU
LENGTHS = [5, 0, 9, 3, 14]


def _states(length: int, sample: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(sample)
    return torch.randn(length, K * H, generator=g), torch.randn(length, H, generator=g)


@pytest.fixture
def shard(random_shard):
    attrs = {"split": "train", "shard": 0, "tokenizer_hash": "t", "chat_template_hash": "c"}
    return random_shard(LENGTHS, "shard-00000.zarr", attrs)


def _spec(tmp_path, shard_path, storage="bf16") -> CaptureSpec:
    return CaptureSpec(
        store=str(tmp_path / "hidden.zarr"),
        token_shard=str(shard_path),
        stats_path=str(tmp_path / "hidden.zarr.stats.json"),
        attrs={"model_id": "tiny", "backend": "sglang"},
        hidden=H,
        num_taps=K,
        sglang_layer_ids=[1, 2, 3],
        storage=storage,
        chunk_tokens=4,
        writer_threads=2,
        rid_prefix=PREFIX,
        route="builtin",
    )


def _forward(entries, samples):
    """One packed extend batch: entries (rid, sample or None, start, count) -> what the hook sees."""
    rids, prefix_lens, extend_lens, aux, final, ids = [], [], [], [], [], []
    for rid, sample, start, count in entries:
        if sample is None:  # another client's request: rows that are not ours
            a, f, t = torch.randn(count, K * H), torch.randn(count, H), torch.zeros(count, dtype=torch.int64)
        else:
            full_aux, full_final = _states(LENGTHS[sample], sample)
            a, f = full_aux[start : start + count], full_final[start : start + count]
            t = torch.from_numpy(samples[sample][0][start : start + count].astype(np.int64))
        rids.append(rid)
        prefix_lens.append(start)
        extend_lens.append(count)
        aux.append(a)
        final.append(f)
        ids.append(t)
    pieces = batch_pieces(rids, prefix_lens, extend_lens, PREFIX)
    # SGLang may hand over more rows than the batch has (padding): the sink must ignore them
    pad = (torch.zeros(2, K * H), torch.zeros(2, H), torch.zeros(2, dtype=torch.int64))
    return pieces, torch.cat([*aux, pad[0]]), torch.cat([*final, pad[1]]), torch.cat([*ids, pad[2]])


# Chunked prefill with a 6-token budget: sample 4 (14 tokens) arrives in three pieces, sample 2 in two,
# interleaved with other requests, as SGLang's scheduler packs them.
SCHEDULE = [
    [(request_rid(PREFIX, 0), 0, 0, 5), (request_rid(PREFIX, 2), 2, 0, 1)],
    [(request_rid(PREFIX, 2), 2, 1, 8), ("other", None, 0, 3)],
    [(request_rid(PREFIX, 4), 4, 0, 6)],
    [(request_rid(PREFIX, 4), 4, 6, 6)],
    [(request_rid(PREFIX, 3), 3, 0, 3), (request_rid(PREFIX, 4), 4, 12, 2)],
]


@pytest.mark.parametrize("storage,chunks_per_shard", [("bf16", 1), ("fp8_e4m3", 1), ("fp8_e4m3", 3)])
def test_row_sink_reassembles_chunked_prefill_into_the_store(tmp_path, shard, storage, chunks_per_shard):
    path, samples = shard
    spec = replace(_spec(tmp_path, path, storage), chunks_per_shard=chunks_per_shard)
    sink = RowSink(spec, torch.device("cpu"))
    for entries in SCHEDULE:
        assert not sink.closed
        sink.take(*_forward(entries, samples))
    assert sink.closed  # the forward that completed the last sample finished the store
    store = HiddenStore(spec.store)
    assert store.attrs["backend"] == "sglang" and store.num_samples == len(LENGTHS)
    assert store.attrs["chunks_per_shard"] == chunks_per_shard
    for sample, length in enumerate(LENGTHS):
        aux, final = store.sample(sample)
        want_aux, want_final = _states(length, sample)
        if storage == "bf16":  # lossless: exactly the bf16 rounding of what the model produced
            assert torch.equal(aux, want_aux.bfloat16()) and torch.equal(final, want_final.bfloat16())
        else:  # exactly the fp8 round trip of what the model produced, whatever the piece boundaries
            bits, scale = fp8_quantize(
                torch.cat([want_aux.view(length, K, H), want_final.view(length, 1, H)], 1)
            )
            want = fp8_dequantize(bits, scale)  # [T, K+1, H]
            assert torch.equal(aux, want[:, :K].reshape(length, K * H)) and torch.equal(final, want[:, K])
    stats = json.loads((tmp_path / "hidden.zarr.stats.json").read_text())
    assert stats["forwards"] == len(SCHEDULE)


def test_a_first_piece_with_a_cached_prefix_is_an_error(tmp_path, shard):
    path, samples = shard
    spec = _spec(tmp_path, path)
    sink = RowSink(spec, torch.device("cpu"))
    sink.take(*_forward(SCHEDULE[0], samples))
    with pytest.raises(PrefixReuseError, match="sample 4 arrived with rows from 6"):
        sink.take(*_forward([(request_rid(PREFIX, 4), 4, 6, 6)], samples))  # rows 0..5 never computed
    assert not (tmp_path / "hidden.zarr").exists()
    assert not list(tmp_path.glob("hidden.zarr*"))  # no temporary left as if finished


@pytest.mark.parametrize("writer_process", [False, True])
def test_rows_computed_for_other_tokens_are_refused(tmp_path, shard, writer_process):
    path, samples = shard
    spec = replace(_spec(tmp_path, path), writer_process=writer_process)
    sink = RowSink(spec, torch.device("cpu"))
    pieces, aux, final, ids = _forward(SCHEDULE[0], samples)
    ids[3] += 1  # sample 0, token 3: the engine computed a different sequence
    with pytest.raises(RuntimeError, match=r"sample 0: rows \[0, 5\) were computed for other tokens"):
        sink.take(pieces, aux, final, ids)
        sink.writer.close()
    assert not (tmp_path / "hidden.zarr").exists() and not list(tmp_path.glob(".hidden.zarr*"))
    if writer_process:  # the child's error, in the parent; its shared memory unlinked
        assert not glob.glob(f"/dev/shm/{sink.writer.prefix}*")


@pytest.mark.parametrize("storage,chunks_per_shard", [("bf16", 1), ("fp8_e4m3", 1), ("fp8_e4m3", 3)])
def test_row_sink_through_the_writer_process_writes_the_same_store(
    tmp_path, shard, storage, chunks_per_shard
):
    """`writer_process`: the child finishes the store byte for byte as the threads do, before the
    forward that completes the last sample returns, and the stats come back from it."""
    path, samples = shard
    files = {}
    for process in (False, True):
        out = tmp_path / f"process-{process}"
        spec = replace(_spec(out, path, storage), chunks_per_shard=chunks_per_shard, writer_process=process)
        sink = RowSink(spec, torch.device("cpu"))
        for entries in SCHEDULE:
            sink.take(*_forward(entries, samples))
        assert sink.closed
        store = out / "hidden.zarr"
        files[process] = {str(f.relative_to(store)): f.read_bytes() for f in store.rglob("*") if f.is_file()}
        stats = json.loads((out / "hidden.zarr.stats.json").read_text())
        assert stats["forwards"] == len(SCHEDULE) and stats["peak_pending_chunks"] > 0
        assert ("writer_process_batches" in stats) == process
    assert files[True] == files[False]
    assert not glob.glob(f"/dev/shm/{sink.writer.prefix}*")


def _stand_in_runner(monkeypatch):
    """A stand-in `sglang.srt.model_executor.model_runner` whose ModelRunner.forward returns the output
    its batch carries (the real classes: tests/sglang/test_capture_hook.py)."""
    for name in ("sglang", "sglang.srt", "sglang.srt.model_executor"):
        package = types.ModuleType(name)
        package.__path__ = []  # a package with no submodules: the dp_attention import fails, as on 0.5.17
        monkeypatch.setitem(sys.modules, name, package)
    module = types.ModuleType("sglang.srt.model_executor.model_runner")

    class ModelRunner:
        tp_rank, is_draft_worker = 0, False

        def forward(self, forward_batch):
            return forward_batch.output

    module.ModelRunner = ModelRunner
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return ModelRunner


def _extend(rids, starts, counts, aux, final, ids):
    output = types.SimpleNamespace(hidden_states=aux, last_hidden_states=final)  # a LogitsProcessorOutput
    return types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(is_extend=lambda: True),
        rids=rids,
        extend_prefix_lens_cpu=starts,
        extend_seq_lens_cpu=counts,
        input_ids=ids,
        output=(output, False),  # (logits_output, can_run_graph) of releases before ModelRunnerOutput
    )


def test_the_hook_starts_the_writer_process_before_the_model_runs(tmp_path, shard, monkeypatch):
    """`writer_process`: the writer's child process starts when the capture is installed (in SGLang,
    before the model loads), so its imports are not paid in the first forwards; a warm-up forward
    writes nothing; then the store is written as without it."""
    path, samples = shard
    runner_class = _stand_in_runner(monkeypatch)
    spec = replace(_spec(tmp_path, path), writer_process=True)
    names = lambda: [p.name for p in multiprocessing.active_children()]  # noqa: E731
    assert "eyas-store-writer" not in names()
    install_capture(spec)
    assert "eyas-store-writer" in names()
    runner = runner_class()
    rows = (torch.randn(5, K * H), torch.randn(5, H), torch.zeros(5, dtype=torch.int64))
    runner_class.forward(runner, _extend([warmup_rid(PREFIX, 0)], [0], [5], *rows))
    for entries in SCHEDULE:
        _, aux, final, ids = _forward(entries, samples)
        rids, starts, counts = [e[0] for e in entries], [e[2] for e in entries], [e[3] for e in entries]
        runner_class.forward(runner, _extend(rids, starts, counts, aux, final, ids))
    store = HiddenStore(spec.store)
    for sample, length in enumerate(LENGTHS):
        aux, final = store.sample(sample)
        want_aux, want_final = _states(length, sample)
        assert torch.equal(aux, want_aux.bfloat16()) and torch.equal(final, want_final.bfloat16()), sample
    stats = json.loads((tmp_path / "hidden.zarr.stats.json").read_text())
    assert stats["forwards"] == len(SCHEDULE) and stats["writer_process_batches"] == len(SCHEDULE) + 1
    assert "eyas-store-writer" not in names()


def test_only_the_writing_rank_starts_a_writer_process(tmp_path, shard, monkeypatch):
    """With TP > 1 every rank's scheduler installs the hook; TP rank 0 writes (the engine passes
    `run_scheduler_process` its ranks positionally), the others start no child."""
    path, _ = shard
    _stand_in_runner(monkeypatch)
    assert _tp_rank(("server_args", "port_args", 5, 3, 0, None, "pipe"), {}) == 3
    assert _tp_rank(("server_args", "port_args"), {"tp_rank": 2}) == 2
    install_capture(replace(_spec(tmp_path, path), writer_process=True), writer_rank=False)
    assert "eyas-store-writer" not in [p.name for p in multiprocessing.active_children()]
