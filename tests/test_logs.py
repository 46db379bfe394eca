"""Stage logging: the log file gets the stage's records, and SIGUSR1 writes the stacks of a running job."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

JOB = textwrap.dedent(
    """
    import os, signal, sys, time
    from eyas.core.logs import setup_stage_logging

    log = setup_stage_logging(sys.argv[1], "probe")
    log.info("started")

    def busy_in_a_named_function():
        os.kill(os.getpid(), signal.SIGUSR1)  # as `kill -USR1 <pid>` from a shell would
        time.sleep(0.2)

    busy_in_a_named_function()
    log.info("still running")
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_writes_stacks_into_the_log_and_the_job_goes_on(tmp_path):
    log_path = tmp_path / "stage.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", JOB, str(log_path)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = log_path.read_text()
    assert "eyas.probe INFO started" in text
    assert "busy_in_a_named_function" in text  # the frame the signal interrupted
    assert text.index("busy_in_a_named_function") < text.index("still running")


# What an engine start does to logging, as SGLang's `configure_logger` (sglang/srt/utils/common.py) does
# it: the root reset to WARNING (basicConfig force=True), or a dictConfig that disables unlisted loggers.
ENGINE_RESET = textwrap.dedent(
    """
    import logging, logging.config, sys
    from eyas.core.logs import keep_stage_logging, setup_stage_logging

    log = setup_stage_logging(sys.argv[1], "probe")
    module_log = logging.getLogger("eyas.regenerate")  # a module's logger, made before the reset
    log.info("before the engine")
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s] %(message)s", force=True)
    log.info("after a root reset")
    module_log.info("module line after a root reset")
    logging.config.dictConfig({"version": 1, "root": {"level": "WARNING"}})
    keep_stage_logging()
    log.info("after a dictConfig, re-asserted")
    module_log.info("module line after a dictConfig")
    """
)


def test_eyas_lines_survive_an_engine_resetting_the_root_logger(tmp_path):
    log_path = tmp_path / "stage.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", ENGINE_RESET, str(log_path)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    lines = ("before the engine", "after a root reset", "module line after a root reset")
    lines += ("after a dictConfig, re-asserted", "module line after a dictConfig")
    for line in lines:
        assert f"eyas.probe INFO {line}" in log_path.read_text(), line
        assert f"eyas.probe INFO {line}" in proc.stderr, line  # and on the terminal
    assert log_path.read_text().count("INFO after a root reset\n") == 1  # once: not through the root too


def test_progress_and_heartbeat_lines(caplog):
    import logging
    import time

    from eyas.core.logs import Progress, heartbeat

    log = logging.getLogger("eyas.test_progress")
    log.propagate = True  # caplog listens on the root
    caplog.set_level(logging.INFO, logger="eyas.test_progress")
    progress = Progress(log, "extract x", total=300, unit="tok", every=3600)
    progress.update(100)  # not yet: less than `every` since the last line, not done
    progress.update(200)
    with heartbeat(log, "regenerate: 4 prompts in the engine", every=0.05):
        time.sleep(0.3)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("extract x: 300 / 300 tok (100%)"), messages
    beats = [m for m in messages[1:] if m.startswith("regenerate: 4 prompts in the engine: running for")]
    assert len(beats) >= 2 and len(beats) == len(messages) - 1, messages


CHILD = textwrap.dedent(
    """
    import faulthandler, logging, multiprocessing, sys
    from eyas.core.logs import child_stage_logging, setup_stage_logging

    def scheduler():  # as eyas's run_scheduler_process_func wrappers do in a spawned engine process
        child_stage_logging()
        faulthandler.enable()  # as SGLang's configure_scheduler_process does (needs stderr's fileno)
        logging.basicConfig(level=logging.INFO, format="[child] %(message)s", force=True)
        logging.getLogger("sglang.scheduler").info("Prefill batch, #new-token: 12")
        logging.getLogger("eyas.sglang").info("hook installed")
        print("child stdout", flush=True)

    if __name__ == "__main__":
        log = setup_stage_logging(sys.argv[1], "probe")
        log.info("parent before")
        child = multiprocessing.get_context("spawn").Process(target=scheduler)
        child.start()
        child.join()
        assert child.exitcode == 0, child.exitcode
        log.info("parent after")
    """
)


def test_engine_processes_append_to_the_stage_log(tmp_path):
    script, log_path = tmp_path / "job.py", tmp_path / "stage.log"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(script), str(log_path)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    text = log_path.read_text()
    order = [
        "parent before",
        "Prefill batch, #new-token: 12",
        "hook installed",
        "child stdout",
        "parent after",
    ]
    positions = [text.find(line) for line in order]
    assert -1 not in positions and positions == sorted(positions), text
    assert "eyas.probe." in text.split("hook installed")[0].splitlines()[-1]  # the child's pid in its name


RESTARTED = textwrap.dedent(
    """
    import sys
    from eyas.core.logs import setup_stage_logging

    setup_stage_logging(sys.argv[1], "probe").info("this run")
    """
)


HEADER = "--- SLURM job 42, restart {count}: SLURM requeued this job (preemption, `scontrol requeue`) ---"


def _run_stage(tmp_path, env_extra: dict[str, str], path_dir=None) -> str:
    script, log_path = tmp_path / "job.py", tmp_path / "stage.log"
    script.write_text(RESTARTED)
    log_path.write_text("the run before: stopped on SIGTERM\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(env_extra, PYTHONPATH=os.pathsep.join(sys.path))
    if path_dir is not None:
        env["PATH"] = f"{path_dir}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [sys.executable, str(script), str(log_path)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return log_path.read_text()


def test_a_new_run_starts_a_fresh_log(tmp_path):
    text = _run_stage(tmp_path, {})
    assert "the run before" not in text and "this run" in text


def test_slurm_restart_of_a_requeued_job_is_named_on_the_logs_first_line(tmp_path):
    lines = _run_stage(tmp_path, {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}).splitlines()
    assert lines[0] == HEADER.format(count=1)
    assert "this run" in lines[1] and len(lines) == 2
    # a first run of a SLURM job (restart 0) has no such line
    assert "SLURM" not in _run_stage(tmp_path, {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "0"})


def test_restart_count_is_asked_of_scontrol_inside_snakemakes_job_step(tmp_path):
    # Snakemake's SLURM job step strips SLURM_RESTART_COUNT but keeps SLURM_JOB_ID
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$4" = 42 ] && echo "JobId=42 JobName=x Restarts=2 BatchFlag=1"\n')
    scontrol.chmod(0o755)
    text = _run_stage(tmp_path, {"SLURM_JOB_ID": "42"}, path_dir=bin_dir)
    assert text.splitlines()[0] == HEADER.format(count=2)
    scontrol.write_text('#!/bin/sh\necho "JobId=42 Restarts=0"\n')
    assert "SLURM" not in _run_stage(tmp_path, {"SLURM_JOB_ID": "42"}, path_dir=bin_dir)
