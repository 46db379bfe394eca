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
