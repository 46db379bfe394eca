"""Engine death: an SGLang scheduler process SIGKILLed during extraction, regeneration and served
evaluation leaves nothing that looks finished, and a rerun equals an uninterrupted run.

CPU only, with the real sglang classes where no GPU is needed (`make test-sglang` makes the venv; run
this file with `.venv-sglang/bin/python -m pytest`). Skipped where sglang is missing.

Extraction (the scheduler process is where eyas's capture hook writes the store): the real
`ModelRunner.forward` wrapped by `install_capture`, fed real `ForwardBatch` / `ModelRunnerOutput`
objects (tests/sglang/objects.py); only the model's arithmetic is stood in for, as in
tests/sglang/test_capture_hook.py. Each "scheduler" is a forked child, as SGLang's scheduler is a child
process of the engine; the store is compared bitwise.

Regeneration and served evaluation: each job runs in a process of its own (tests/sglang/engine_job.py:
the rule's own function, `run_regenerate` / `run_served`) on a real `sglang.Engine`: ServerArgs, the
spawned engine processes, the tokenizer manager and its event loop, ZMQ and the `io_struct` messages,
SGLang's `SubprocessWatchdog`, SIGQUIT handling and `kill_process_tree` are the installed sglang's.
Only the work of the scheduler and detokenizer processes is stood in (tests/sglang/standin_engine.py:
no model runs; tokens and speculative figures are fixed functions of the request). The test SIGKILLs
the scheduler at a chosen request and checks that the job ends with `EngineDied` naming the stage and
the process (exit status 1; SGLang's own handler would SIGKILL the job, status -9), that the output
dir is empty (no output, no temp file) and eyas left nothing in TMPDIR, that no engine process
outlives the job, and that a rerun's outputs equal an uninterrupted run's (served.json less its
timings, which differ between any two runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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
from modelkit import tiny_llama_config_json  # noqa: E402
from test_capture_hook import LENGTHS, PREFIX, H, K, _batch, _runner, _spec, _states  # noqa: E402

from eyas.extract.sglang_capture import install_capture  # noqa: E402
from eyas.extract.sglang_sink import request_rid  # noqa: E402
from eyas.store import HiddenStore  # noqa: E402

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
    from objects import standin_forward
    from sglang.srt.model_executor import model_runner as mr

    model_forward = standin_forward(_states, PREFIX, LENGTHS, K, H)  # the model's arithmetic
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


@pytest.fixture
def shard(random_shard):
    return random_shard(LENGTHS)  # test_capture_hook.py's shard


def _run_to_end(spec, samples) -> None:
    pid = _fork(spec, samples, len(SCHEDULE), None)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


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


# --------------------------------------------------------------------------- regeneration, served evaluation
JOB = Path(__file__).parents[1] / "sglang" / "engine_job.py"
JOB_TIMEOUT_S = 600
DIED = (
    r"{stage}: the SGLang engine died: {what} \(eyas stopped the engine's other processes\)\. The job "
    r"stops here without writing its outputs\. Rerun it: Snakemake reruns a job whose outputs are missing"
)
IN_USE = (
    r"scheduler_0 \(pid {pid}, exit code -9\) exited while the engine was in use "
    r"\(SGLang's watchdog noticed\)"
)
STARTING = r"it did not start: Rank 0 scheduler died during initialization \(exit code: -9\)\..*"
FAILED = r"an engine process failed as the engine started \(its error is above\)"


def _engine_job(job: dict, root: Path, hang: str | None = None, fail: str | None = None) -> dict:
    """Run one stage job in a process of its own (as Snakemake runs a script job) on the real Engine
    front end with stood-in scheduler processes (tests/sglang/standin_engine.py). With `hang`
    (`<role>:<n>`), SIGKILL the scheduler when it holds its n-th request; with `fail`, the scheduler
    fails there by itself. Returns the exit code, the stderr and the killed scheduler's pid."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)  # the job's TMPDIR: what eyas leaves there is checked
    spec = root / "job.json"
    spec.write_text(json.dumps(job))
    ready = root / "ready"
    env = os.environ | {"TMPDIR": str(root / "tmp"), "EYAS_STANDIN_READY": str(ready)}
    env |= {"EYAS_STANDIN_HANG": hang} if hang else {}
    env |= {"EYAS_STANDIN_FAIL": fail} if fail else {}
    with open(root / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-W", "ignore", str(JOB), str(spec)], stderr=err, env=env)
        try:
            killed = _kill_scheduler(proc, ready, root) if hang else None
            code = proc.wait(timeout=JOB_TIMEOUT_S)
        finally:
            _stop(proc)
    return {"code": code, "stderr": (root / "stderr").read_text(), "killed": killed}


def _kill_scheduler(proc: subprocess.Popen, ready: Path, root: Path) -> int:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not ready.exists():
        assert proc.poll() is None, (root / "stderr").read_text()[-3000:]
        assert time.monotonic() < deadline, "the scheduler never reached its kill point"
        time.sleep(0.1)
    pid = int(ready.read_text())
    os.kill(pid, signal.SIGKILL)
    return pid


def _stop(proc: subprocess.Popen) -> None:
    """A job still running when the test gives up: it and its engine processes are killed."""
    import psutil

    if proc.poll() is not None:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
    proc.kill()
    proc.wait()


def _engine_processes_gone(job_root: Path) -> None:
    """No process the job started outlives it (stand-in schedulers and detokenizers record their pid)."""
    import psutil

    pids = [int(p.read_text()) for p in (job_root / "tmp").glob("eyas-standin-pid-*")]
    assert pids, "the engine's processes recorded no pid"
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def _eyas_temp_files(job_root: Path) -> list[str]:
    """What eyas left in the job's TMPDIR (the stand-ins' pid files aside)."""
    names = [p.name for p in (job_root / "tmp").iterdir()]
    return [n for n in names if n.startswith("eyas-") and not n.startswith("eyas-standin-pid-")]


def _assert_died_clearly(run: dict, stage: str, what: str, log: Path) -> None:
    """The job ended with an error (not killed: SGLang's own handler SIGKILLs it, code -9) whose last
    line is the EngineDied message; the stage's log has it too."""
    assert run["code"] == 1, run["stderr"][-3000:]
    pattern = DIED.format(stage=re.escape(stage), what=what.format(pid=run["killed"]))
    last = run["stderr"].strip().splitlines()[-1]
    assert re.fullmatch(r"eyas\.engine\.sglang\.EngineDied: " + pattern + r".*", last), last
    assert re.search(pattern, log.read_text())


@pytest.fixture(scope="module")
def regen_inputs(tmp_path_factory, tokenizer_dir):
    """Prepared conversations (two assistant turns each) and a target dir (config and tokenizer: the
    stood-in scheduler needs no weights)."""
    root = tmp_path_factory.mktemp("regen_inputs")
    model = root / "model"
    shutil.copytree(tokenizer_dir, model)
    (model / "config.json").write_text(json.dumps(tiny_llama_config_json()))
    records = []
    for i in range(6):
        messages = []
        for t in range(2):
            messages += [
                {"role": "user", "content": f"Question {i}.{t}: " + "why " * (i + 1)},
                {"role": "assistant", "content": f"Original answer {i}.{t}"},
            ]
        records.append({"id": str(i), "source": f"x:{i}", "messages": messages, "tools": None})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def _regen_job(inputs: Path, root: Path) -> dict:
    out = root / "results" / "regenerated"
    return {
        "stage": "regenerate",
        "log": str(root / "regenerate.log"),
        "paths": [str(inputs / "train.jsonl"), str(out / "train.jsonl"), str(out / "train.stats.json"),
                  str(inputs / "model")],
        "settings": {"enabled": True, "backend": "sglang", "turns": "all", "max_new_tokens": 16},
        "engine_settings": {"engine_args": {"device": "cpu"}},
        "max_length": 512,
    }  # fmt: skip


@pytest.mark.parametrize("pipeline_turns", [False, True], ids=["turn-rounds", "pipelined-turns"])
def test_scheduler_killed_mid_regeneration_fails_clearly_and_rerun_is_equal(
    tmp_path, regen_inputs, ledger, pipeline_turns
):
    reference = _engine_job(_regen_job(regen_inputs, tmp_path / "reference"), tmp_path / "reference")
    assert reference["code"] == 0, reference["stderr"][-3000:]
    want = tmp_path / "reference" / "results" / "regenerated"
    assert json.loads((want / "train.stats.json").read_text())["turns_regenerated"] == 12

    job_root = tmp_path / "job"
    job = _regen_job(regen_inputs, job_root)
    job["settings"]["engine"] = {"pipeline_turns": pipeline_turns}
    expect = "EngineDied naming the stage; no outputs; rerun equal"
    how = "pipelined turns" if pipeline_turns else "turn rounds"
    with ledger.case("fault", f"SGLang scheduler killed mid-regeneration ({how})", expect):
        # request 2: with turn rounds the second round (the first round's responses exist in memory
        # only); pipelined, the third prompt sent, some first turns still in flight
        run = _engine_job(job, job_root, hang="plain:2")
        _assert_died_clearly(run, f"regenerate {job['paths'][1]}", IN_USE, Path(job["log"]))
        assert list((job_root / "results" / "regenerated").iterdir()) == []  # nor a temp file
        assert _eyas_temp_files(job_root) == []
        _engine_processes_gone(job_root)
        rerun = _engine_job(job, job_root)
        assert rerun["code"] == 0, rerun["stderr"][-3000:]
        got = job_root / "results" / "regenerated"
        assert sorted(p.name for p in got.iterdir()) == ["train.jsonl", "train.stats.json"]
        for name in ("train.jsonl", "train.stats.json"):
            assert (got / name).read_bytes() == (want / name).read_bytes(), name


PROVENANCE = {
    "model_id": "tiny",
    "model_hash": "abc",
    "layer_ids": [0, 1, 2],
    "layer_id_convention": "drafter:output_of_layer",
    "tokenizer_hash": "t",
    "chat_template_hash": "c",
}
SERVED_SETTINGS = {"backend": "sglang", "num_prompts": 2, "max_new_tokens": 8, "num_draft_tokens": [3, 2],
                   "concurrency": 2}  # fmt: skip
# Fields of a served.json report that measure time: they differ between any two runs.
TIMING = ("tokens_per_s", "plain_tokens_per_s", "speedup")


@pytest.fixture(scope="module")
def served_inputs(tmp_path_factory, tiny_model_dir):
    """A drafter dir of the tiny target, its SGLang export (rule export_sglang's) and two prompt sets."""
    from eyas.core.layer_ids import text_model_type
    from eyas.export import export_sglang
    from eyas.model.drafter import DrafterConfig, Eagle3Drafter
    from eyas.model.target import read_config

    root = tmp_path_factory.mktemp("served_inputs")
    torch.manual_seed(0)
    config = read_config(tiny_model_dir)
    drafter = Eagle3Drafter(DrafterConfig.from_target_config(config, 256, [0, 1, 2]))
    drafter.save_pretrained(root / "drafter", extra_config=PROVENANCE)
    export_sglang(root / "drafter", root / "export", text_model_type(config))
    heldout = root / "eval.jsonl"
    heldout.write_text(
        "".join(
            json.dumps({"id": f"h{i}", "tools": None, "messages": [
                {"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}) + "\n"
            for i, text in enumerate(["Name a colour.", "Count to three.", "Say hi."])
        )
    )  # fmt: skip
    humaneval = root / "humaneval.jsonl"
    humaneval.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def add(a, b):\n"}) + "\n")
    return {
        "set_paths": {"heldout": str(heldout), "humaneval": str(humaneval)},
        "set_formats": {},
        "drafter_dir": str(root / "drafter"),
        "export_dir": str(root / "export"),
        "model_dir": str(tiny_model_dir),
    }


def _served_job(inputs: dict, root: Path) -> dict:
    return {
        "stage": "served",
        "log": str(root / "served.log"),
        "kwargs": inputs | {"out_json": str(root / "results" / "eval" / "served.json")},
        "settings": SERVED_SETTINGS,
        "engine_settings": {"engine_args": {"device": "cpu"}},
    }


def _without_timing(value, top: bool = True):
    """served.json less what measures time: `plain` and `timings` (top level: only speeds and start-up
    seconds), and tokens/s and speed-ups in every report."""
    if isinstance(value, dict):
        drop = ("plain", "timings") if top else ()
        return {
            k: _without_timing(v, False)
            for k, v in value.items()
            if k not in drop and not k.startswith(TIMING)
        }
    if isinstance(value, list):
        return [_without_timing(v, False) for v in value]
    return value


@pytest.fixture(scope="module")
def served_reference(tmp_path_factory, served_inputs) -> dict:
    root = tmp_path_factory.mktemp("served_reference")
    run = _engine_job(_served_job(served_inputs, root), root)
    assert run["code"] == 0, run["stderr"][-3000:]
    log = (root / "served.log").read_text()
    for k in (3, 2):  # logged once the engines ran (SGLang's configure_logger had reset the root logger)
        assert f"served heldout / trained / k={k}: tau" in log, log[-3000:]
    result = json.loads((root / "results" / "eval" / "served.json").read_text())
    assert list(result["sets"]) == ["heldout", "humaneval"]
    assert {d: list(by_k) for d, by_k in result["sets"]["heldout"].items()} == {
        "trained": ["3", "2"],
        "untrained": ["3", "2"],
    }
    return result


# The plain engine: its 3rd request is the heldout set's 2nd prompt at batch size 1 (after the warm-up
# and the 1st). The EAGLE-3 engine, started after the plain one is done: killed or failing as it starts
# (0), or killed at its 8th request, the select of k=2 (7 requests decode both sets with the trained
# drafter at k=3: a warm-up, 2 + 1 prompts one at a time, one batch each).
SPEC = "EAGLE-3 engine of trained"  # an EAGLE-3 engine is named by the first drafter it serves
SERVED_FAULTS = {  # id: (fault, engine, the error's cause, the ledger's case)
    "plain-in-use": ({"hang": "plain:3"}, "plain reference engine", IN_USE, "killed", "plain engine in use"),
    "spec-starting": ({"hang": "spec:0"}, SPEC, STARTING, "killed", "EAGLE-3 engine starting"),
    "spec-failing": ({"fail": "spec:0"}, SPEC, FAILED, "failing", "EAGLE-3 engine starting"),
    "spec-in-use": ({"hang": "spec:8"}, SPEC, IN_USE, "killed", "EAGLE-3 engine in use"),
}


@pytest.mark.parametrize("fault", list(SERVED_FAULTS))
def test_engine_death_mid_served_evaluation_fails_clearly_and_rerun_is_equal(
    tmp_path, served_inputs, served_reference, fault, ledger
):
    job = _served_job(served_inputs, tmp_path)
    inject, engine, what, how, when = SERVED_FAULTS[fault]
    name = f"SGLang scheduler {how} mid-served evaluation ({when})"
    with ledger.case("fault", name, "EngineDied naming the stage; no outputs; rerun equal"):
        run = _engine_job(job, tmp_path, **inject)
        out = Path(job["kwargs"]["out_json"])
        _assert_died_clearly(run, f"served evaluation {out} ({engine})", what, Path(job["log"]))
        assert list(out.parent.iterdir()) == []  # no served.json, no export or engine dirs left
        assert _eyas_temp_files(tmp_path) == []
        _engine_processes_gone(tmp_path)
        rerun = _engine_job(job, tmp_path)
        assert rerun["code"] == 0, rerun["stderr"][-3000:]
        got = json.loads(out.read_text())
        assert _without_timing(got) == _without_timing(served_reference)
