"""A real `sglang.Engine` on the CPU, with only its scheduler processes stood in.

What is real (sglang 0.5.23 of .venv-sglang): the `Engine` front end in the job process (ServerArgs,
`_launch_subprocesses`, which spawns the scheduler and detokenizer processes, the `TokenizerManager`
and its event loop, `SubprocessWatchdog`, the SIGQUIT handlers, `kill_process_tree`, `shutdown`), the
ZMQ sockets between the processes and the messages on them (`io_struct`'s
`TokenizedGenerateReqInput`, `BatchTokenIDOutput`, `UpdateWeightFromDiskReqInput/Output`, sent with
SGLang's own `sock_send` / `sock_recv`).

What is stood in: the detokenizer process's work (`detokenizer` idles: with eyas's
`skip_tokenizer_init` the scheduler sends its outputs straight to the tokenizer manager, and the real
one imports xgrammar, which .venv-sglang lacks), and the scheduler process, which on a GPU loads the
model and runs it. `scheduler` and
`spec_scheduler` here take its place with SGLang's signature and handshake (the `ready` info on the
pipe, `Scheduler.get_init_info` of 0.5.23), read the requests SGLang's tokenizer manager sends and
answer each with a `BatchTokenIDOutput` as the real scheduler's output streamer fills it
(`scheduler_components/output_streamer.py`): tokens that are a fixed function of the prompt (sampling
settings are ignored: a rerun gives the same tokens), and for the EAGLE-3 engine verify passes and an
accepted-drafts histogram that are a fixed function of the prompt, the drafter dir served and k (set
by eyas's select request: its `eyas:steps=<k>` weight version). Where the real scheduler would run
eyas's draft swap (`eyas.engine.sglang_draft_swap.select_draft`, tested on the real weight updater in
test_served_engine.py), the stand-in only records the drafter and k.

`install()` puts the stand-ins in place (in the job process, before an engine starts): SGLang's
`Engine.run_scheduler_process_func` and `run_detokenizer_process_func`, and eyas's
`eyas.engine.sglang_draft_swap.draft_swap_scheduler_process`. The engine's processes are spawned, so
they import this module by name (tests/sglang/ is on the job's sys.path, which spawn hands down).

Faults to inject: `EYAS_STANDIN_HANG=<role>:<n>` (role `plain` or `spec`) makes that scheduler, at
its n-th request (n = 0: before it is ready), write its pid to `$EYAS_STANDIN_READY` and wait there
for the test's SIGKILL, the request unanswered, as a scheduler that dies mid-batch leaves it.
`EYAS_STANDIN_FAIL=<role>:0` makes it fail as it starts, the way SGLang's scheduler process reports a
Python error (`_maybe_fail`).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import zlib
from array import array
from pathlib import Path

FIRST_TOKEN = 1000  # ordinary word pieces of SmolLM2's vocabulary (the tiny target's): never special
TOKEN_SPAN = 4000
READY_INFO = {"status": "ready", "max_total_num_tokens": 65536, "max_req_input_len": 4096}


def tokens_for(prompt: list[int], max_new_tokens: int) -> list[int]:
    """The response to `prompt`: 3 to 9 tokens (fewer if max_new_tokens is lower), a function of it."""
    seed = zlib.crc32(array("l", prompt).tobytes())
    count = min(max_new_tokens, 3 + seed % 7)
    return [FIRST_TOKEN + (seed + 97 * i) % TOKEN_SPAN for i in range(count)]


def verify_passes(prompt: list[int], completion: int, drafter: str, k: int) -> list[int]:
    """Drafts accepted by each verify pass of a chain of k drafts: the first token comes from the
    prefill, each pass then yields its accepted drafts + 1; a function of prompt, drafter and k."""
    seed = zlib.crc32(f"{os.path.basename(drafter)}:{k}:{list(prompt)}".encode())
    accepted, left = [], completion - 1
    while left > 0:
        drafts = min((seed + 3 * len(accepted)) % (k + 1), k, left - 1)
        accepted.append(drafts)
        left -= drafts + 1
    return accepted


def _logprobs(req, out: list[int]) -> dict:
    """Output logprobs and top-2 for each token when the request asks for them (plain engine)."""
    if not req.return_logprob:
        return {"val": [], "idx": [], "top_val": [], "top_idx": []}
    return {
        "val": [-0.25] * len(out),
        "idx": list(out),
        "top_val": [[-0.25, -1.5 - (t % 7) / 8] for t in out],
        "top_idx": [[t, t + 1] for t in out],
    }


def _spec_fields(reqs, outs, served: dict | None) -> dict:
    if served is None:
        return {}
    passes = [
        verify_passes(list(r.input_ids), len(o), served["drafter"], served["k"])
        for r, o in zip(reqs, outs, strict=True)
    ]
    histograms = [[p.count(a) for a in range(served["k"] + 1)] for p in passes]
    return {
        "spec_verify_ct": [len(p) for p in passes],
        "spec_num_correct_drafts": [sum(p) for p in passes],
        "spec_correct_drafts_histogram": histograms,
    }


def reply(reqs, served: dict | None = None):
    """The `BatchTokenIDOutput` for finished requests `reqs` (skip_tokenizer_init: tokens, no text)."""
    from sglang.srt.managers.io_struct import BatchTokenIDOutput

    outs = [tokens_for(list(r.input_ids), r.sampling_params.max_new_tokens) for r in reqs]
    logprobs = [_logprobs(r, o) for r, o in zip(reqs, outs, strict=True)]
    n, empty = len(reqs), [[] for _ in reqs]
    return BatchTokenIDOutput(
        rids=[r.rid for r in reqs],
        http_worker_ipcs=[r.http_worker_ipc for r in reqs],
        finished_reasons=[{"type": "length", "length": len(o)} for o in outs],
        decoded_texts=[""] * n,
        decode_ids=[array("l", o) for o in outs],
        read_offsets=[0] * n,
        output_ids=[array("l", o) for o in outs],
        skip_special_tokens=[True] * n,
        spaces_between_special_tokens=[True] * n,
        no_stop_trim=[False] * n,
        prompt_tokens=[len(r.input_ids) for r in reqs],
        reasoning_tokens=[0] * n,
        completion_tokens=[len(o) for o in outs],
        cached_tokens=[0] * n,
        input_token_logprobs_val=empty,
        input_token_logprobs_idx=empty,
        output_token_logprobs_val=[lp["val"] for lp in logprobs],
        output_token_logprobs_idx=[lp["idx"] for lp in logprobs],
        input_top_logprobs_val=empty,
        input_top_logprobs_idx=empty,
        output_top_logprobs_val=[lp["top_val"] for lp in logprobs],
        output_top_logprobs_idx=[lp["top_idx"] for lp in logprobs],
        input_token_ids_logprobs_val=empty,
        input_token_ids_logprobs_idx=empty,
        output_token_ids_logprobs_val=empty,
        output_token_ids_logprobs_idx=empty,
        output_token_entropy_val=None,
        output_token_sampling_mask=None,
        output_hidden_states=None,
        routed_experts=None,
        indexer_topk=None,
        placeholder_tokens_idx=None,
        placeholder_tokens_val=None,
        retraction_counts=[0] * n,
        **_spec_fields(reqs, outs, served),
    )


def _record_pid() -> None:
    """`$TMPDIR/eyas-standin-pid-<pid>`: the test checks that no engine process outlives its job. Also
    what SGLang's scheduler and detokenizer do first: ask Linux to SIGKILL them when their parent dies
    (`kill_itself_when_parent_died`; for Linux the parent is the thread that started the process)."""
    from sglang.srt.utils import kill_itself_when_parent_died

    kill_itself_when_parent_died()
    (Path(tempfile.gettempdir()) / f"eyas-standin-pid-{os.getpid()}").write_text(str(os.getpid()))


def _maybe_fail(role: str, count: int) -> None:
    """`EYAS_STANDIN_FAIL=<role>:<n>`: fail at the n-th request (n = 0: as the engine starts) as SGLang's
    `run_scheduler_process` handles a scheduler's exception (`managers/scheduler.py` of 0.5.23): log
    it, send the job process SIGQUIT and return (the process then exits with status 0)."""
    if os.environ.get("EYAS_STANDIN_FAIL") == f"{role}:{count}":
        import psutil

        print("Scheduler hit an exception: RuntimeError: (stood in)", file=sys.stderr, flush=True)
        psutil.Process().parent().send_signal(signal.SIGQUIT)
        raise SystemExit(0)


def _maybe_hang(role: str, count: int) -> None:
    if os.environ.get("EYAS_STANDIN_HANG") == f"{role}:{count}":
        ready = os.environ["EYAS_STANDIN_READY"]
        with open(ready + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(ready + ".tmp", ready)
        time.sleep(600)  # the test SIGKILLs this process here


def _serve(port_args, pipe_writer, role: str, served: dict | None) -> None:
    """The scheduler's loop: requests in from the tokenizer manager, outputs straight back to it
    (skip_tokenizer_init: `scheduler_components/ipc_channels.py` of 0.5.23)."""
    import zmq
    from sglang.srt.managers.io_struct import (
        BatchTokenizedGenerateReqInput,
        TokenizedGenerateReqInput,
        UpdateWeightFromDiskReqInput,
        UpdateWeightFromDiskReqOutput,
        sock_recv,
        sock_send,
    )
    from sglang.srt.utils.network import get_zmq_socket

    from eyas.engine.sglang_draft_swap import STEPS_PREFIX

    _record_pid()
    context = zmq.Context(2)
    receive = get_zmq_socket(context, zmq.PULL, port_args.scheduler_input_ipc_name, False)
    send = get_zmq_socket(context, zmq.PUSH, port_args.tokenizer_ipc_name, False)
    _maybe_fail(role, 0)  # <role>:0 fails or dies while the engine starts
    _maybe_hang(role, 0)
    pipe_writer.send(READY_INFO | {"startup_time": {}})
    count = 0
    while True:
        request = sock_recv(receive)
        if isinstance(request, (TokenizedGenerateReqInput, BatchTokenizedGenerateReqInput)):
            count += 1
            _maybe_hang(role, count)
            batch = request.batch if isinstance(request, BatchTokenizedGenerateReqInput) else [request]
            sock_send(send, reply(list(batch), served))
        elif isinstance(request, UpdateWeightFromDiskReqInput):
            count += 1
            _maybe_hang(role, count)
            served["drafter"] = request.model_path
            served["k"] = int((request.weight_version or "").removeprefix(STEPS_PREFIX))
            message = f"serving {request.model_path} at k={served['k']}"
            sock_send(send, UpdateWeightFromDiskReqOutput(success=True, message=message, rid=request.rid))


def scheduler(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer, *args, **kwargs):
    """Stands in for `sglang.srt.managers.scheduler.run_scheduler_process` (same signature)."""
    _serve(port_args, pipe_writer, "plain", None)


def spec_scheduler(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer, *args, **kwargs):
    """Stands in for `eyas.engine.sglang_draft_swap.draft_swap_scheduler_process` (SGLang's scheduler
    with eyas's draft swap): an EAGLE-3 engine serving the start-up drafter at the start-up k."""
    served = {"drafter": server_args.speculative_draft_model_path, "k": server_args.speculative_num_steps}
    _serve(port_args, pipe_writer, "spec", served)


def detokenizer(server_args, port_args, *args, **kwargs):
    """Stands in for `run_detokenizer_process`: alive, idle, until the engine kills it."""
    _record_pid()
    time.sleep(3600)


def install() -> None:
    """In the job process: every engine eyas starts gets the stand-in processes."""
    from sglang.srt.entrypoints.engine import Engine

    import eyas.engine.sglang_draft_swap

    Engine.run_scheduler_process_func = staticmethod(scheduler)
    Engine.run_detokenizer_process_func = staticmethod(detokenizer)
    eyas.engine.sglang_draft_swap.draft_swap_scheduler_process = spec_scheduler
