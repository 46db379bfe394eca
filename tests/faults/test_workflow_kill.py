"""Snakemake killed while a job writes its output (`export_sglang`, `specdec`, `regenerate`), and a second
Snakemake on the same results dir, on the real workflow with a tiny local target and data.

A `sitecustomize` on the jobs' PYTHONPATH pauses a job at the rename of its finished temporary output
into place (`os.replace`, which `eyas.core.atomic` uses) when `EYAS_TEST_PAUSE_AT` names that output; the
test then SIGKILLs Snakemake's whole process group (Snakemake and the job: a lost login node, an OOM kill,
`kill -9`). What must hold: nothing at the output path that looks finished, Snakemake's lock left for
`--unlock`, and the rerun completes with outputs equal to the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dryrun import planned_jobs  # tools/ (pytest pythonpath, pyproject.toml)
from faultkit import CONVERSATIONS

pytestmark = pytest.mark.workflow

REPO = Path(__file__).parents[2]
SITECUSTOMIZE = r"""
import os, time
_at = os.environ.get("EYAS_TEST_PAUSE_AT")
if _at:
    _replace = os.replace
    def _paused_replace(src, dst, *args, **kwargs):
        if os.path.abspath(dst).endswith(_at) and ".tmp-" in os.fspath(src):
            ready = os.environ["EYAS_TEST_READY"]
            with open(ready + ".part", "w") as fh:
                fh.write(str(os.getpid()))
            _replace(ready + ".part", ready)
            time.sleep(600)  # the test kills us here
        return _replace(src, dst, *args, **kwargs)
    os.replace = _paused_replace
"""
EXPORT = "results/export/sglang"
SPECDEC = "results/eval/specdec/heldout.json"
REGEN = "results/regenerated/train.jsonl"
REGEN_STATS = "results/regenerated/train.stats.json"
SPECULATORS = "results/export/speculators"
VOCAB = ("results/vocab/draft_vocab.safetensors", "results/vocab/vocab.json")
PREPARED = tuple(
    f"results/prepared/{n}" for n in ("train.jsonl", "eval.jsonl", "rejects.jsonl", "stats.json")
)
TARGETS = (EXPORT, SPECDEC, SPECULATORS)
# More jobs killed at the rename of their last output, the others already in place: (rule, outputs).
LAST_OUTPUT_KILLS = {"export_speculators": (SPECULATORS,), "vocab": VOCAB, "prepare": PREPARED}


def _config(workdir: Path, model: Path) -> Path:
    data = workdir / "chats.jsonl"
    with open(data, "w") as fh:
        for n in range(3):
            for i, (user, assistant) in enumerate(CONVERSATIONS):
                fh.write(
                    json.dumps({"id": f"c{n}-{i}", "instruction": f"{user} ({n})", "output": assistant})
                    + "\n"
                )
    config = workdir / "tiny.yaml"
    config.write_text(
        f"model: {{source: {model}, aux_layer_ids: [0, 1, 2]}}\n"
        f"data: {{inputs: [{{path: {data}}}], max_conversations: null, eval_fraction: 0.25, eval_max: 3}}\n"
        "tokenize: {max_length: 256, train_shards: 1, eval_shards: 1}\n"
        "vocab: {draft_vocab_size: 64}\n"
        "extract: {device: cpu, token_budget: 512}\n"
        "train: {epochs: 1, max_steps: 2, warmup_steps: 1, ttt_steps: 2, token_budget: 256,"
        " checkpoint_every: 2, device: cpu, progress: false, select_by_tau: false}\n"
        "evaluate: {num_prompts: 2, max_new_tokens: 6, num_draft_tokens: [2], device: cpu, sets: [heldout]}\n"
        # sampled (seeded): the random tiny target's greedy answer is empty, its samples are not
        "regenerate: {enabled: true, max_new_tokens: 6, batch_size: 4, device: cpu, temperature: 1.0}\n"
    )
    return config


class Project:
    def __init__(self, workdir: Path, config: Path, hooks: Path):
        self.workdir, self.config, self.hooks = workdir, config, hooks

    def cmd(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "snakemake",
            "-d",
            str(self.workdir),
            "--configfile",
            str(self.config),
            *args,
        ]

    def env(self, pause_at: str | None = None) -> dict:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(self.hooks), os.environ.get("PYTHONPATH", "")])
        )
        if pause_at:
            env |= {"EYAS_TEST_PAUSE_AT": pause_at, "EYAS_TEST_READY": str(self.workdir / "paused.pid")}
        return env

    def run(self, *args: str, ok: bool = True) -> str:
        result = subprocess.run(self.cmd(*args), cwd=REPO, env=self.env(), capture_output=True, text=True)
        output = result.stdout + result.stderr
        assert (result.returncode == 0) == ok, output[-6000:]
        return output

    def start_paused(self, pause_at: str, *args: str) -> subprocess.Popen:
        """Start Snakemake (own process group) and return once its job is paused at `pause_at`."""
        ready = self.workdir / "paused.pid"
        ready.unlink(missing_ok=True)
        proc = subprocess.Popen(
            self.cmd("--cores", "2", *args),
            cwd=REPO,
            env=self.env(pause_at),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 600
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
                pytest.fail(f"the job never reached the rename of {pause_at}:\n{proc.stdout.read()[-4000:]}")
            time.sleep(0.1)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while True:  # the whole group, the job included, is gone
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            assert time.monotonic() < deadline, "processes of the killed group are still alive"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir) -> Project:
    workdir = tmp_path_factory.mktemp("killed_workflow")
    hooks = workdir / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    project = Project(workdir, _config(workdir, tiny_model_dir), hooks)
    project.run("--cores", "2", *TARGETS)
    project.reference = {  # the uninterrupted run's outputs
        EXPORT: _tree(workdir / EXPORT),
        SPECDEC: _specdec(workdir / SPECDEC),
        REGEN: (workdir / REGEN).read_bytes(),
        REGEN_STATS: json.loads((workdir / REGEN_STATS).read_text()),
    }
    for outputs in LAST_OUTPUT_KILLS.values():
        project.reference |= {out: _tree(workdir / out) for out in outputs}
    return project


def _content(path: Path):
    """A file's bytes; a safetensors file's header as a dict and its tensor bytes: safetensors writes its
    string metadata in hash-map order, which differs from run to run (the draft vocab has several keys)."""
    data = path.read_bytes()
    if path.suffix != ".safetensors":
        return data
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _tree(path: Path) -> dict:
    if path.is_file():
        return {"": _content(path)}
    return {p.relative_to(path).as_posix(): _content(p) for p in sorted(path.rglob("*")) if p.is_file()}


def _specdec(path: Path) -> dict:
    """The decoded result without wall-clock figures (tokens, acceptance, tau; not tokens/s)."""

    def strip(value):
        if isinstance(value, dict):
            return {
                k: strip(v)
                for k, v in value.items()
                if not any(t in k for t in ("second", "per_s", "time", "speedup"))
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(path.read_text()))


def _looks_finished(project: Project, target: str) -> None:
    """After the kill: only temporary names where the output would be; the lock is left."""
    out = project.workdir / target
    assert not out.exists(), f"a killed job left {out}"
    assert any(".tmp-" in p.name for p in out.parent.iterdir()), "the job was not paused mid-write"
    assert list((project.workdir / ".snakemake" / "locks").iterdir()), "a killed Snakemake leaves its lock"


def test_second_snakemake_is_refused_then_export_killed_mid_write(project, ledger):
    proc = project.start_paused(EXPORT, EXPORT, "--forcerun", "export_sglang")
    before = {p: p.stat().st_mtime_ns for p in (project.workdir / "results").rglob("*") if p.is_file()}
    try:
        with ledger.case(
            "fault", "two Snakemakes on one results dir", "second refused by the lock, with --unlock advice"
        ):
            # Snakemake locks the files a run will write: a second run that writes the same ones is refused.
            out = project.run("--cores", "1", EXPORT, "--forcerun", "export_sglang", ok=False)
            assert "LockException" in out and "--unlock" in out, out[-3000:]
            after = {p: p.stat().st_mtime_ns for p in (project.workdir / "results").rglob("*") if p.is_file()}
            assert after == before  # the refused one wrote nothing
    finally:
        project.kill(proc)
    with ledger.case(
        "fault", "Snakemake killed during export_sglang writes", "nothing looks finished; rerun equal"
    ):
        _looks_finished(project, EXPORT)
        project.run("--unlock")
        assert planned_jobs(project.run("-n", EXPORT)) == {"export_sglang": 1}
        project.run("--cores", "2", EXPORT)
        assert _tree(project.workdir / EXPORT) == project.reference[EXPORT]


def test_specdec_killed_mid_write(project, ledger):
    proc = project.start_paused(SPECDEC, SPECDEC, "--forcerun", "specdec")
    project.kill(proc)
    with ledger.case(
        "fault", "Snakemake killed during specdec writes", "nothing looks finished; rerun equal"
    ):
        _looks_finished(project, SPECDEC)
        project.run("--unlock")
        assert planned_jobs(project.run("-n", SPECDEC)) == {"specdec": 1}
        project.run("--cores", "2", SPECDEC)
        assert _specdec(project.workdir / SPECDEC) == project.reference[SPECDEC]


def test_regenerate_killed_between_its_two_outputs(project, ledger):
    """Paused at the stats file's rename: the conversations file is already in place, whole. Snakemake
    has the job as incomplete and reruns it (the default profile sets --rerun-incomplete)."""
    proc = project.start_paused(REGEN_STATS, REGEN, "--forcerun", REGEN)
    project.kill(proc)
    with ledger.case(
        "fault", "Snakemake killed during regenerate writes", "job rerun, not taken as done; rerun equal"
    ):
        assert (project.workdir / REGEN).exists() and not (project.workdir / REGEN_STATS).exists()
        project.run("--unlock")
        assert planned_jobs(project.run("-n", REGEN)) == {"regenerate": 1}
        refused = project.run("-n", "--workflow-profile", "none", REGEN, ok=False)
        assert "IncompleteFilesException" in refused or "incomplete" in refused.lower(), refused[-2000:]
        project.run("--cores", "2", REGEN)
        assert (project.workdir / REGEN).read_bytes() == project.reference[REGEN]
        stats = json.loads((project.workdir / REGEN_STATS).read_text())
        assert stats == project.reference[REGEN_STATS]


@pytest.mark.parametrize("rule", list(LAST_OUTPUT_KILLS))
def test_job_killed_at_its_last_output(project, rule, ledger):
    """Paused at the rename of the job's last output, its other outputs already in place and whole-looking
    (prepare: train/eval/rejects before stats.json): the job is rerun all the same."""
    outputs = LAST_OUTPUT_KILLS[rule]
    proc = project.start_paused(outputs[-1], outputs[-1], "--forcerun", rule)
    project.kill(proc)
    with ledger.case(
        "fault", f"Snakemake killed during {rule} writes", "job rerun, not taken as done; rerun equal"
    ):
        assert not (project.workdir / outputs[-1]).exists()
        assert all((project.workdir / out).exists() for out in outputs[:-1])  # already renamed into place
        project.run("--unlock")
        assert planned_jobs(project.run("-n", outputs[-1])) == {rule: 1}
        project.run("--cores", "2", outputs[-1])
        for out in outputs:
            assert _tree(project.workdir / out) == project.reference[out], out
