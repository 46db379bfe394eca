"""The SGLang capture on the real classes (sglang 0.5.23 on CPU): the AFTER hook installed on the real
`ModelRunner.forward`, fed real `ForwardBatch` / `LogitsProcessorOutput` / `ModelRunnerOutput`
objects (tests/sglang/objects.py), writes the store; the capture switch of older releases wraps
the real config resolver and logits processor; the extract job drives it request by request. Only
the model's arithmetic (and, for the job, the engine) is stood in for: the function under the hook
returns known rows instead of running a transformer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from modelkit import tiny_llama_config_json
from objects import decode_batch, extend_batch, standin_forward
from sglang.srt.layers import logits_processor as lp
from sglang.srt.model_executor import model_runner as mr
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import SpecAuxHiddenStateConfig

from eyas.config import SglangSettings
from eyas.extract import sglang_backend
from eyas.extract.sglang_capture import install_capture
from eyas.extract.sglang_sink import CaptureSpec, PrefixReuseError, request_rid
from eyas.store import HiddenStore

K, H = 3, 8
PREFIX = "eyas-hook-"
LENGTHS = [7, 0, 12, 3]


def _states(sample: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + sample)
    return torch.randn(length, K * H, generator=g), torch.randn(length, H, generator=g)


@pytest.fixture
def shard(random_shard):
    return random_shard(LENGTHS)


def _spec(tmp_path, shard_path, route="builtin") -> CaptureSpec:
    return CaptureSpec(
        store=str(tmp_path / "hidden.zarr"),
        token_shard=str(shard_path),
        stats_path=str(tmp_path / "hidden.zarr.stats.json"),
        attrs={"backend": "sglang"},
        hidden=H,
        num_taps=K,
        sglang_layer_ids=[1, 2, 3],
        storage="bf16",
        chunk_tokens=4,
        writer_threads=2,
        rid_prefix=PREFIX,
        route=route,
    )


@pytest.fixture
def runner_class(monkeypatch, shard):
    """The real ModelRunner class with its forward replaced by a stand-in for the model's arithmetic,
    so the hook wraps a function that returns the rows each batch's requests should produce."""
    _, samples = shard

    model_forward = standin_forward(_states, PREFIX, LENGTHS, K, H)
    monkeypatch.setattr(mr.ModelRunner, "forward", model_forward)
    return mr.ModelRunner


def _runner(cls, tp_rank=0):
    runner = object.__new__(cls)  # no GPU, no model: only what the hook reads
    runner.tp_rank, runner.is_draft_worker = tp_rank, False
    return runner


def _batch(entries, samples):
    """entries (rid, sample or None, start, count) -> a real extend ForwardBatch with the shard's tokens."""
    batch = extend_batch([e[0] for e in entries], [e[2] for e in entries], [e[3] for e in entries])
    ids = []
    for _, sample, start, count in entries:
        tokens = samples[sample][0][start : start + count] if sample is not None else np.zeros(count)
        ids.append(torch.from_numpy(np.asarray(tokens, dtype=np.int64)))
    batch.input_ids = torch.cat(ids)
    return batch


def test_hook_on_the_real_runner_writes_every_chunk(tmp_path, shard, runner_class):
    path, samples = shard
    spec = _spec(tmp_path, path)
    install_capture(spec)
    assert runner_class.forward.eyas_capture is spec
    install_capture(spec)  # idempotent: one wrapper, not two
    assert runner_class.forward.__wrapped__.__name__ == "model_forward"
    runner = _runner(runner_class)
    rid = lambda i: request_rid(PREFIX, i)  # noqa: E731
    schedule = [  # chunked prefill with a 5-token budget, other clients' requests between ours
        [(rid(0), 0, 0, 5)],
        [(rid(0), 0, 5, 2), ("someone-else", None, 0, 2), (rid(2), 2, 0, 1)],
        [(rid(2), 2, 1, 5)],
        [(rid(3), 3, 0, 3), (rid(2), 2, 6, 2)],
    ]
    for entries in schedule:
        out = runner_class.forward(runner, _batch(entries, samples))
        assert out.logits_output.hidden_states is not None  # SGLang gets its output back untouched
    runner_class.forward(runner, decode_batch([rid(0), rid(2)], [7, 9]))  # decode batches are ignored
    assert not (tmp_path / "hidden.zarr").exists()  # sample 2 is still missing its last 4 rows
    runner_class.forward(runner, _batch([(rid(2), 2, 8, 4)], samples))
    store = HiddenStore(tmp_path / "hidden.zarr")
    for sample, length in enumerate(LENGTHS):
        aux, final = store.sample(sample)
        want_aux, want_final = _states(sample, length)
        assert torch.equal(aux, want_aux.bfloat16()) and torch.equal(final, want_final.bfloat16()), sample
    assert (tmp_path / "hidden.zarr.stats.json").exists()


def test_only_tp_rank_0_writes(tmp_path, shard, runner_class):
    """A scheduler of TP rank > 0 (`scheduler_process` reads its rank) installs the hook but writes
    nothing."""
    path, samples = shard
    install_capture(_spec(tmp_path, path), writer_rank=False)
    runner_class.forward(
        _runner(runner_class, tp_rank=1), _batch([(request_rid(PREFIX, 3), 3, 0, 3)], samples)
    )
    assert not list(tmp_path.glob("*hidden.zarr*"))  # rank 1 opened no store at all


def test_a_request_whose_first_chunk_has_a_prefix_is_an_error(tmp_path, shard, runner_class):
    path, samples = shard
    install_capture(_spec(tmp_path, path))
    runner = _runner(runner_class)
    with pytest.raises(PrefixReuseError, match="sample 2 arrived with rows from 4"):
        runner_class.forward(runner, _batch([(request_rid(PREFIX, 2), 2, 4, 3)], samples))
    assert not (tmp_path / "hidden.zarr").exists()


def test_older_releases_switch_capture_on_in_the_scheduler_process(tmp_path, shard, monkeypatch):
    # 0.5.17-0.5.21: the real config struct comes back with EAGLE-3 capture on and our ids; the real
    # LogitsProcessor's output gains the post-norm final state it was given.
    path, _ = shard
    monkeypatch.setattr(mr, "resolve_spec_aux_hidden_state_config", lambda **kw: SpecAuxHiddenStateConfig())
    monkeypatch.setattr(mr.ModelRunner, "forward", mr.ModelRunner.forward)  # restored after the test
    monkeypatch.setattr(
        lp.LogitsProcessor,
        "forward",
        lambda self, input_ids, hidden_states, *a, **kw: lp.LogitsProcessorOutput(
            next_token_logits=None, hidden_states=torch.ones(2, K * H)
        ),
    )
    install_capture(_spec(tmp_path, path, route="scheduler"))
    config = mr.resolve_spec_aux_hidden_state_config(is_draft_worker=False)
    assert config.eagle_use_aux_hidden_state and config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    assert not mr.resolve_spec_aux_hidden_state_config(is_draft_worker=True).eagle_use_aux_hidden_state
    final = torch.randn(2, H)
    out = lp.LogitsProcessor.forward(object(), torch.zeros(2), final)
    assert out.last_hidden_states is final and out.hidden_states.shape == (2, K * H)


def test_the_extract_job_sends_every_sample_and_reports_the_store(tmp_path, random_shard, monkeypatch):
    """`extract_shard_sglang` with only the engine stood in: its `generate` hands each call's requests to
    the hooked real `ModelRunner.forward` as one real extend batch. The job warms up under other rids,
    then sends every non-empty sample `requests_per_call` at a time; the store the hook wrote holds
    every sample's rows, and the job's figures add up (the scheduler's stats file is consumed)."""
    attrs = {"split": "train", "shard": 0, "tokenizer_hash": "t", "chat_template_hash": "c"}
    path, samples = random_shard(LENGTHS, "shard-00000.zarr", attrs)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(tiny_llama_config_json(hidden_size=H)))
    calls, started = [], {}

    def engine_class(spec):
        prefix = spec.rid_prefix

        class StandInEngine:
            def __init__(self, **kwargs):
                started.update(kwargs, spec=spec)
                monkeypatch.setattr(
                    mr.ModelRunner, "forward", standin_forward(_states, prefix, LENGTHS, K, H)
                )
                install_capture(spec)  # as `scheduler_process` does in the scheduler process

            def generate(self, input_ids, sampling_params, rid):
                assert sampling_params == {"max_new_tokens": 0}
                calls.append([r.replace(prefix, "") for r in rid])
                sample = [int(r.removeprefix(prefix)) if r.startswith(prefix) else None for r in rid]
                entries = [(r, s, 0, len(ids)) for r, s, ids in zip(rid, sample, input_ids, strict=True)]
                mr.ModelRunner.forward(_runner(mr.ModelRunner), _batch(entries, samples))

            def shutdown(self):
                started["shut_down"] = True

        return StandInEngine

    monkeypatch.setattr(sglang_backend, "capture_engine_class", engine_class)
    settings = SglangSettings(requests_per_call=2, engine_args={"device": "cpu"})
    out = tmp_path / "hidden.zarr"
    stats = sglang_backend.extract_shard_sglang(
        str(path), str(out), str(model), layer_ids=[1, 2, 3], model_id="tiny", settings=settings
    )
    assert calls == [["warmup-0", "warmup-2", "warmup-3"], ["0", "2"], ["3"]]  # sample 1 is empty
    assert started["disable_radix_cache"] and started["device"] == "cpu" and started["shut_down"]
    store = HiddenStore(out)
    for sample, length in enumerate(LENGTHS):
        aux, final = store.sample(sample)
        want_aux, want_final = _states(sample, length)
        assert torch.equal(aux, want_aux.bfloat16()) and torch.equal(final, want_final.bfloat16()), sample
    assert store.attrs["backend"] == "sglang" and store.attrs["capture_route"] == stats["capture_route"]
    assert (stats["samples"], stats["tokens"], stats["forwards"]) == (len(LENGTHS), sum(LENGTHS), 2)
    assert not Path(started["spec"].stats_path).exists()


def test_the_scheduler_is_given_its_tp_rank_where_the_hook_reads_it():
    """`scheduler_process` reads the TP rank from `run_scheduler_process`'s positional arguments (which
    rank starts the writer process): the real signature keeps it fourth."""
    import inspect

    from sglang.srt.managers.scheduler import run_scheduler_process

    assert list(inspect.signature(run_scheduler_process).parameters)[:4] == [
        "server_args",
        "port_args",
        "gpu_id",
        "tp_rank",
    ]
