"""The SGLang capture hook, installed in the capture engine's scheduler process before the scheduler
is built; sglang is imported lazily, there. Nothing in SGLang's files is edited.

`scheduler_process` (the engine's `run_scheduler_process_func`) installs `install_capture`: it wraps
`ModelRunner.forward` (an AFTER hook) and hands every extend forward's aux and final hidden states to the
row sink (`eyas.extract.sglang_sink.RowSink`, made at the first forward of this job's requests; with
`writer_process` its child process is started here, before the model loads: its imports took ~4.5 s, which
the first batches waited for when it started at the warm-up request, H100,
bench/results/extraction-writer-process-h100-smollm2.json); on releases without a capture-only mode (the
`scheduler` route, sglang 0.5.17-0.5.21) it also turns aux capture on and keeps the final state.

Why a hook and not the public `return_hidden_states` (read in the sglang 0.5.23 sources): that path ships
Python float lists through ZMQ, drops the middle chunks of chunked prefill and never returns the final
state. The hook sees every extend forward, so the store is finished by the forward that completes the
last sample, before SGLang answers that request."""

from __future__ import annotations

import functools

from eyas.core.logs import child_stage_logging
from eyas.extract.sglang_sink import CaptureSpec, RowSink, batch_pieces
from eyas.extract.writer_process import WriterChild


def _logits_output(output):
    """ModelRunner.forward returns ModelRunnerOutput (0.5.2x) or (logits_output, can_run_graph)."""
    return output.logits_output if hasattr(output, "logits_output") else output[0]


def _tp_rank(args: tuple, kwargs: dict) -> int:
    """`run_scheduler_process(server_args, port_args, gpu_id, tp_rank, ...)` in sglang 0.5.17-0.5.23;
    the engine passes them positionally. Every TP rank holds the full hidden states after the
    all-reduce; TP rank 0 writes. Extraction refuses DP and PP layouts
    (`eyas.extract.sglang_backend.engine_args`), so no other scheduler has requests of its own."""
    return int(args[3]) if len(args) > 3 else int(kwargs.get("tp_rank", 0))


def install_capture(spec: CaptureSpec, writer_rank: bool = True) -> None:
    """In the scheduler process: wrap ModelRunner.forward (AFTER hook) and, on the `scheduler` route,
    turn aux capture on. Idempotent. `writer_rank`: this process writes the store (TP rank 0): it
    starts `writer_process`'s child now; other ranks start none and write nothing."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    if spec.route == "scheduler":
        _enable_aux_capture(spec.sglang_layer_ids)
        _keep_final_state()
    original = ModelRunner.forward
    if getattr(original, "eyas_capture", None) is not None:
        return
    sink: list[RowSink] = []
    # Started now, while SGLang loads the model.
    child = WriterChild() if spec.writer_process and writer_rank else None

    @functools.wraps(original)
    def forward(self, forward_batch, *args, **kwargs):
        output = original(self, forward_batch, *args, **kwargs)
        if not writer_rank or getattr(self, "is_draft_worker", False):
            return output
        if not forward_batch.forward_mode.is_extend():
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
            sink.append(RowSink(spec, aux.device, child=child))
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
    install_capture(spec, writer_rank=_tp_rank(args, kwargs) == 0)
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)
