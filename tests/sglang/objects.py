"""Real sglang batch and output objects built on CPU, as the scheduler process hands them to an AFTER hook
on `ModelRunner.forward`, and real SGLang model classes loaded from a checkpoint on CPU
(`load_into_nan`) (import as `from objects import ...` in a test under tests/sglang/).

All three classes are plain dataclasses with no __post_init__ (sglang 0.5.17 and 0.5.23): constructing
them, and calling `forward_mode.is_extend()` / `capture_hidden_mode.is_full()`, reads no global state,
so no runtime context (`get_exec()`, `publish(server_args)`) has to be set up. Only
`ForwardBatch.init_new` (the scheduler's real constructor) reads it, and it is not used here.

Required fields (no default):
- ForwardBatch: forward_mode, batch_size, input_ids, req_pool_indices, seq_lens, out_cache_loc,
  seq_lens_sum. Everything the hook reads (rids, extend_prefix_lens_cpu, extend_seq_lens_cpu,
  capture_hidden_mode) defaults to None and is filled here the way init_new fills it.
- LogitsProcessorOutput: next_token_logits (None is accepted; prefill-only scoring leaves it None).
- ModelRunnerOutput: logits_output, can_run_graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunnerOutput


def extend_batch(
    rids: Sequence[str],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.FULL,
    vocab_size: int = 100,
) -> ForwardBatch:
    """An EXTEND (prefill) batch: request i brings extend_lens[i] new tokens after prefix_lens[i] tokens
    already in its KV cache (a later chunk of chunked prefill has prefix > 0). Its rows in the packed
    outputs are [sum(extend_lens[:i]), sum(extend_lens[:i+1]))."""
    assert len(rids) == len(prefix_lens) == len(extend_lens)
    bs, n_tokens = len(rids), sum(extend_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    starts = [sum(extend_lens[:i]) for i in range(bs)]
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_lens, extend_lens, strict=True)])
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=bs,
        input_ids=torch.randint(0, vocab_size, (n_tokens,), dtype=torch.int64),  # [T]
        req_pool_indices=torch.arange(bs, dtype=torch.int64),  # [B]
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),  # [B]
        out_cache_loc=torch.arange(n_tokens, dtype=torch.int64),  # [T] KV slots written
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        positions=positions,  # [T]
        extend_num_tokens=n_tokens,
        extend_seq_lens=torch.tensor(extend_lens, dtype=torch.int32),  # init_new makes these int32
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32),
        extend_start_loc=torch.tensor(starts, dtype=torch.int32),
        extend_seq_lens_cpu=list(extend_lens),
        extend_prefix_lens_cpu=list(prefix_lens),
        rids=list(rids),
        capture_hidden_mode=capture_hidden_mode,
    )


def decode_batch(
    rids: Sequence[str],
    seq_lens: Sequence[int],
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.FULL,
) -> ForwardBatch:
    """A DECODE batch: one token per request, extend_* left None (as init_new leaves them). Under a
    server whose return-hidden-states mode is full (the capture mode) decode batches carry
    CaptureHiddenMode.FULL too, so a hook must tell them apart by forward_mode, not by capture mode."""
    bs = len(rids)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        input_ids=torch.zeros(bs, dtype=torch.int64),  # [B]
        req_pool_indices=torch.arange(bs, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.arange(bs, dtype=torch.int64),
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        positions=torch.tensor(seq_lens, dtype=torch.int64) - 1,
        rids=list(rids),
        capture_hidden_mode=capture_hidden_mode,
    )


def logits_output(
    aux: torch.Tensor, last: torch.Tensor | None, batch_size: int, vocab_size: int = 100
) -> LogitsProcessorOutput:
    """What the logits processor returns under aux capture with CaptureHiddenMode.FULL:
    hidden_states = the K captured layers concatenated per token [T, K*H], last_hidden_states = the
    post-norm final state [T, H] (0.5.22+; pass last=None to model 0.5.17, which has no such field).
    next_token_logits: one row per request, as in a real run; its values are irrelevant to capture."""
    assert aux.ndim == 2 and (last is None or (last.ndim == 2 and last.shape[0] == aux.shape[0]))
    fields = {"next_token_logits": torch.zeros(batch_size, vocab_size), "hidden_states": aux}
    if last is not None:
        fields["last_hidden_states"] = last
    return LogitsProcessorOutput(**fields)


def runner_output(logits: LogitsProcessorOutput) -> ModelRunnerOutput:
    """The return value of ModelRunner.forward (what an AFTER hook receives as `result`)."""
    return ModelRunnerOutput(logits_output=logits, can_run_graph=False)


def packed_states(extend_lens: Sequence[int], k: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct float rows for a packed extend batch: aux [T, K*H], last [T, H]. Row t of the batch is
    recognisable (value t * 1000 + column), so a test can check which rows a slice took."""
    n = sum(extend_lens)
    base = torch.arange(n, dtype=torch.float32)[:, None] * 1000
    aux = base + torch.arange(k * h, dtype=torch.float32)[None, :]  # [T, K*H]
    last = base + 500 + torch.arange(h, dtype=torch.float32)[None, :]  # [T, H]
    return aux, last


def standin_forward(states, prefix: str, lengths: Sequence[int], taps: int, hidden: int):
    """A stand-in for `ModelRunner.forward` (the model's arithmetic): an extend batch gets, for each
    request, the rows `states(sample, length)` -> (aux [length, taps*hidden], final [length, hidden])
    holds at its positions (sample i of an eyas request `{prefix}{i}`; another client's request gets
    sample 99's); a decode batch gets zeros. The hook under test wraps this function."""

    def model_forward(self, forward_batch, *args, **kwargs):
        if not forward_batch.forward_mode.is_extend():
            rows = forward_batch.batch_size
            return runner_output(
                logits_output(torch.zeros(rows, taps * hidden), torch.zeros(rows, hidden), rows)
            )
        aux, last = [], []
        for rid, start, count in zip(
            forward_batch.rids,
            forward_batch.extend_prefix_lens_cpu,
            forward_batch.extend_seq_lens_cpu,
            strict=True,
        ):
            sample = int(rid.removeprefix(prefix)) if rid.startswith(prefix) else None
            a, f = states(sample, lengths[sample]) if sample is not None else states(99, start + count)
            aux.append(a[start : start + count])  # [count, taps*hidden]
            last.append(f[start : start + count])  # [count, hidden]
        return runner_output(logits_output(torch.cat(aux), torch.cat(last), forward_batch.batch_size))

    return model_forward


def load_into_nan(model_class, hf_config, model_dir: Path) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """SGLang's `model_class` built from `hf_config` in bfloat16 (the dtype SGLang serves these
    checkpoints in), every parameter set to NaN, then `model_dir`'s model.safetensors through the class's
    real `load_weights` (which skips unknown names): a parameter no tensor reached is still NaN.
    Returns the model and the checkpoint's tensors."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = model_class(hf_config)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    model.load_weights(iter(tensors.items()))
    return model, tensors
