"""The fault / bad-input ledger: every case a test here injects is counted, and the counts are written.

A case counts as *tried* (bad input) or *injected* (fault) when its `with ledger.case(...)` block is
entered and as *handled* / *survived* only when the block exits without an error, i.e. after the test's
own assertions about it passed. A *kind* of bad input is one distinct `expect` (expected outcome). At the
end of the session the counts go to `results/faults/summary.json`
(or `$EYAS_FAULTS_SUMMARY`), atomically; in a one-process run the path is printed in pytest's terminal
summary (under pytest-xdist the workers' summaries are not shown). The
committed run (docs/faults-summary.json) is made by

    .venv/bin/python -m pytest -q tests/faults
    EYAS_FAULTS_MERGE=results/faults/summary.json .venv-sglang/bin/python -m pytest -q \
        tests/faults/test_sglang_engine_death.py   # needs `make test-sglang` first
    cp results/faults/summary.json docs/faults-summary.json

The SLURM case (test_slurm_preempt.py) runs only with EYAS_SLURM=1 and the SLURM of
tests/cluster/ci_up.sh up. Where it cannot run, `EYAS_FAULTS_MERGE=docs/faults-summary.json` on the
first command keeps the committed summary's cases that this run skips, the SLURM case among them; the
recorded `command` then begins with the command of the run they come from.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SUMMARY = Path(os.environ.get("EYAS_FAULTS_SUMMARY", REPO / "results" / "faults" / "summary.json"))
KINDS = ("bad_input", "fault")
# A summary written by an earlier session whose cases this session's summary keeps (those it did not
# rerun): how tests that need another venv (tests/faults/test_sglang_engine_death.py) are counted.
MERGE = os.environ.get("EYAS_FAULTS_MERGE")


class Ledger:
    def __init__(self) -> None:
        self.cases: list[dict] = []

    @contextlib.contextmanager
    def case(self, kind: str, name: str, expect: str):
        """Record one bad input or fault; `expect` says how it must be handled."""
        assert kind in KINDS, kind
        entry = {"kind": kind, "name": name, "expect": expect, "ok": False}
        self.cases.append(entry)
        yield entry
        entry["ok"] = True

    def counts(self) -> dict:
        def count(kind: str, ok: bool | None = None) -> int:
            return sum(1 for c in self.cases if c["kind"] == kind and (ok is None or c["ok"] == ok))

        def kinds(ok: bool | None = None) -> int:  # distinct expected outcomes of the bad inputs
            return len(
                {
                    c["expect"]
                    for c in self.cases
                    if c["kind"] == "bad_input" and (ok is None or c["ok"] == ok)
                }
            )

        return {
            "faults_injected": count("fault"),
            "faults_survived": count("fault", True),
            "bad_inputs_tried": count("bad_input"),
            "bad_inputs_handled": count("bad_input", True),
            "bad_input_kinds_tried": kinds(),
            "bad_input_kinds_handled": kinds(True),
        }


_LEDGER = Ledger()


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    return _LEDGER


# Under pytest-xdist (`make test` runs `-n 2`) each worker holds only the cases of the tests it ran, and
# the controller does not load this file. So every worker writes its cases to a part file of this run
# (xdist's run id names the folder) and rewrites the summary from all the parts written so far, under a
# lock: the last worker to finish writes the whole run's summary.
RUN_PARTS = SUMMARY.parent / "parts" / os.environ.get("PYTEST_XDIST_TESTRUNUID", "")


def _write_json(path: Path, payload: dict) -> None:
    from eyas.core.atomic import atomic_file

    with atomic_file(path) as fh:
        json.dump(payload, fh, indent=1)
        fh.write("\n")


def _cases_of_all_workers(worker: str) -> list[dict]:
    """This worker's part written, the cases of every part of this run so far (the caller holds the lock)."""
    _write_json(RUN_PARTS / f"{worker}.json", {"cases": _LEDGER.cases})
    parts = sorted(RUN_PARTS.glob("*.json"))
    cases = [case for part in parts for case in json.loads(part.read_text())["cases"]]
    if len(parts) == int(os.environ["PYTEST_XDIST_WORKER_COUNT"]):  # the last worker: parts done with
        shutil.rmtree(RUN_PARTS)
    return cases


def pytest_sessionfinish(session, exitstatus):
    # a worker's sys.argv is its own bootstrap; xdist hands it the command line that started the run
    argv = getattr(session.config, "workerinput", {}).get("mainargv", sys.argv)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        _write_summary(_LEDGER.cases, argv)
        return
    RUN_PARTS.mkdir(parents=True, exist_ok=True)
    with open(RUN_PARTS.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_summary(_cases_of_all_workers(worker), argv)


def _write_summary(cases: list[dict], argv: list[str]) -> None:
    if not cases:
        return
    ledger = Ledger()
    ledger.cases = list(cases)
    command = " ".join(["pytest", *argv[1:]])
    if MERGE:  # a session in another venv (.venv-sglang) adds its cases to the main session's summary
        previous = json.loads(Path(MERGE).read_text())
        names = {c["name"] for c in ledger.cases}
        ledger.cases[:0] = [c for c in previous["cases"] if c["name"] not in names]
        venv = Path(sys.executable).parent.parent.name
        command = f"{previous['command']} && EYAS_FAULTS_MERGE={MERGE} {venv}/bin/python -m {command}"
    summary = {
        **ledger.counts(),
        "cases": ledger.cases,
        "command": command,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "euid_root": hasattr(os, "geteuid") and os.geteuid() == 0,
    }
    _write_json(SUMMARY, summary)


def pytest_terminal_summary(terminalreporter):
    if _LEDGER.cases:
        counts = ", ".join(f"{k}={v}" for k, v in _LEDGER.counts().items())
        terminalreporter.write_line(f"eyas faults/bad inputs: {counts} -> {SUMMARY}")


# --------------------------------------------------------------------------- a real store to break
from faultkit import CONVERSATIONS, EXTRACT_KW  # noqa: E402


@pytest.fixture(scope="session")
def token_shard_path(tmp_path_factory, tokenizer) -> Path:
    """One token shard of real chat-template samples, spanning several 256-token chunks."""
    import numpy as np
    from modelkit import token_shard_attrs

    from eyas.data.tokenize import build_sample
    from eyas.store import write_token_shard

    samples = []
    for n in range(3):  # three rounds: ~900 tokens, 4 chunks
        for user, assistant in CONVERSATIONS:
            messages = [
                {"role": "user", "content": f"{user} ({n})"},
                {"role": "assistant", "content": assistant},
            ]
            ids, mask = build_sample(tokenizer, messages, None)
            samples.append((np.asarray(ids, np.int32), np.asarray(mask, np.uint8)))
    path = tmp_path_factory.mktemp("fault_tokens") / "shard-00000.zarr"
    write_token_shard(path, samples, [f"s{i}" for i in range(len(samples))], token_shard_attrs(tokenizer))
    return path


@pytest.fixture(scope="session")
def reference_store(tmp_path_factory, token_shard_path, tiny_model_dir) -> Path:
    """The uninterrupted extraction every fault test compares against (one torch thread)."""
    import torch

    from eyas.extract.hf_backend import extract_shard

    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("fault_reference") / "shard-00000.zarr"
    try:
        extract_shard(str(token_shard_path), str(out), str(tiny_model_dir), **EXTRACT_KW)
    finally:
        torch.set_num_threads(threads)
    return out
