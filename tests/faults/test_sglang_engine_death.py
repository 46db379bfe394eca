"""Engine death during SGLang extraction: the scheduler process (where eyas's capture hook writes the
store) is SIGKILLed mid-capture; nothing that looks finished is left and a fresh engine's capture is
bitwise equal to an uninterrupted one.

CPU only, with the real sglang classes where no engine is needed (`make test-sglang` makes the venv;
run this file with `.venv-sglang/bin/python -m pytest`): the real `ModelRunner.forward` wrapped by
`install_capture`, fed real `ForwardBatch` / `ModelRunnerOutput` objects (tests/sglang/objects.py); only
the model's arithmetic is stood in for, as in tests/sglang/test_capture_hook.py. Each "scheduler" is a
forked child, as SGLang's scheduler is a child process of the engine. Skipped where sglang is missing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import sglang.srt.model_executor.model_runner  # noqa: F401
except ImportError:
    pytest.skip(
        "needs a real sglang: make test-sglang, then .venv-sglang/bin/python -m pytest",
        allow_module_level=True,
    )

sys.path.insert(0, str(Path(__file__).parents[1] / "sglang"))
from test_capture_hook import LENGTHS, PREFIX, _batch, _runner, _spec, _states  # noqa: E402

from eyas.extract.sglang_backend import install_capture, request_rid  # noqa: E402
from eyas.store import HiddenStore, write_token_shard  # noqa: E402

SCHEDULE = [  # chunked prefill with a 5-token budget, another client's request in between
    [(0, 0, 5)],
    [(0, 5, 2), (None, 0, 2), (2, 0, 1)],
    [(2, 1, 5)],
    [(3, 0, 3), (2, 6, 2)],
    [(2, 8, 4)],
]
KILL_AFTER = 3  # batches done before the scheduler dies: samples 0 and 3 whole, 2 half


def _scheduler(spec, samples, batches: int, ready: Path | None) -> None:
    """A scheduler process: the real ModelRunner class, the capture hook, `batches` forwards."""
    from objects import logits_output, runner_output
    from sglang.srt.model_executor import model_runner as mr

    def model_forward(self, forward_batch, *args, **kwargs):  # the model's arithmetic, stood in for
        aux, last = [], []
        for rid, start, count in zip(
            forward_batch.rids,
            forward_batch.extend_prefix_lens_cpu,
            forward_batch.extend_seq_lens_cpu,
            strict=True,
        ):
            sample = int(rid.removeprefix(PREFIX)) if rid.startswith(PREFIX) else None
            a, f = _states(sample, LENGTHS[sample]) if sample is not None else _states(99, start + count)
            aux.append(a[start : start + count])
            last.append(f[start : start + count])
        return runner_output(logits_output(torch.cat(aux), torch.cat(last), forward_batch.batch_size))

    mr.ModelRunner.forward = model_forward
    install_capture(spec)
    runner = _runner(mr.ModelRunner)
    for entries in SCHEDULE[:batches]:
        rows = [("someone-else" if s is None else request_rid(PREFIX, s), s, a, n) for s, a, n in entries]
        mr.ModelRunner.forward(runner, _batch(rows, samples))
    if ready is not None:
        ready.write_text(str(os.getpid()))
        time.sleep(300)  # the test kills us here


def _fork(*args) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _scheduler(*args)
        except BaseException as err:  # noqa: BLE001
            print(f"scheduler: {err!r}", file=sys.stderr)
            code = 1
        finally:
            os._exit(code)
    return pid


def _run_to_end(spec, samples) -> None:
    pid = _fork(spec, samples, len(SCHEDULE), None)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@pytest.fixture
def shard(tmp_path):
    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 100, n).astype(np.int32), np.ones(n, np.uint8)) for n in LENGTHS]
    path = tmp_path / "tokens.zarr"
    write_token_shard(path, samples, [f"s{i}" for i in range(len(samples))], {"split": "train", "shard": 0})
    return path, samples


def test_scheduler_killed_mid_capture_leaves_nothing_finished_and_rerun_is_equal(tmp_path, shard, ledger):
    path, samples = shard
    reference = _spec(tmp_path / "reference", path)
    (tmp_path / "reference").mkdir()
    _run_to_end(reference, samples)

    (tmp_path / "job").mkdir()
    spec = _spec(tmp_path / "job", path)
    ready = tmp_path / "ready"
    with ledger.case(
        "fault", "SGLang scheduler killed mid-capture", "no store marked complete; rerun bitwise equal"
    ):
        pid = _fork(spec, samples, KILL_AFTER, ready)
        deadline = time.monotonic() + 120
        while not (ready.exists() and ready.read_text()):
            assert time.monotonic() < deadline, "the scheduler never reached its kill point"
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -signal.SIGKILL
        store = Path(spec.store)
        assert not store.exists() and not Path(spec.stats_path).exists()
        leftovers = [p.name for p in store.parent.iterdir()]
        assert leftovers and all(".tmp-" in n for n in leftovers), (
            leftovers
        )  # written chunks, under a tmp name
        _run_to_end(spec, samples)  # the rerun: a fresh engine, every request again
        got, want = HiddenStore(store), HiddenStore(reference.store)
        assert got.attrs == want.attrs
        for sample in range(len(LENGTHS)):
            (ga, gf), (wa, wf) = got.sample(sample), want.sample(sample)
            assert torch.equal(ga, wa) and torch.equal(gf, wf), sample
