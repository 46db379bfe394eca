"""eyas's stage log keeps eyas's lines after SGLang's real `configure_logger` has reset logging, in the
job process and in the engine's spawned processes (sglang 0.5.23 of .venv-sglang, on the CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from modelkit import tiny_llama_config_json

pytest.importorskip("sglang.srt", reason="runs in .venv-sglang (make test-sglang)")

HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}

# The job process: SGLang's configure_logger as `Engine.__init__` runs it (root reset to WARNING,
# force=True), then with SGLANG_LOGGING_CONFIG_PATH (dictConfig: unlisted loggers disabled), each
# followed by what eyas's engines do after a start (keep_stage_logging). Then one spawned process as
# the engine spawns its scheduler: eyas's wrapper (in_stage_log) around a function that configures
# logging as SGLang's scheduler does (configure_logger with its " TP0" prefix) and logs at INFO.
JOB = textwrap.dedent(
    """
    import json, logging, multiprocessing, os, sys
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.common import configure_logger
    from eyas.core.logs import keep_stage_logging, setup_stage_logging
    from eyas.engine.sglang import in_stage_log
    import functools

    def scheduler(server_args):
        configure_logger(server_args, prefix=" TP0")
        logging.getLogger("sglang.srt.managers.scheduler").info("Prefill batch. #new-seq: 1")
        logging.getLogger("eyas.extract").info("capture hook in the scheduler")

    if __name__ == "__main__":
        args = ServerArgs(model_path="dummy", device="cpu", log_level="info")
        log = setup_stage_logging(sys.argv[1], "probe")
        served = logging.getLogger("eyas.evaluate.served")
        log.info("before the engine")
        configure_logger(args)
        assert logging.getLogger().level == logging.INFO and logging.getLogger().handlers
        keep_stage_logging()
        served.info("served heldout / trained / k=3: tau 2.5")
        os.environ["SGLANG_LOGGING_CONFIG_PATH"] = sys.argv[2]
        configure_logger(args)
        assert logging.getLogger("eyas.evaluate.served").disabled  # what dictConfig did
        keep_stage_logging()
        served.info("after a logging config file")
        del os.environ["SGLANG_LOGGING_CONFIG_PATH"]
        child = multiprocessing.get_context("spawn").Process(
            target=functools.partial(in_stage_log, scheduler), args=(args,)
        )
        child.start()
        child.join()
        assert child.exitcode == 0, child.exitcode
        log.info("after the engine")
    """
)


def test_real_configure_logger_leaves_eyas_lines_in_the_stage_log(tmp_path):
    script, log_path, config = tmp_path / "job.py", tmp_path / "stage.log", tmp_path / "logging.json"
    script.write_text(JOB)
    config.write_text(json.dumps({"version": 1, "root": {"level": "WARNING"}}))
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(script), str(log_path), str(config)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = log_path.read_text()
    order = [
        "eyas.probe INFO before the engine",
        "eyas.probe INFO served heldout / trained / k=3: tau 2.5",
        "eyas.probe INFO after a logging config file",
        "TP0] Prefill batch. #new-seq: 1",  # SGLang's own scheduler line, from the spawned process
        "INFO capture hook in the scheduler",
        "eyas.probe INFO after the engine",
    ]
    positions = [text.find(line) for line in order]
    assert -1 not in positions and positions == sorted(positions), text
    for line in order[:3] + order[-1:]:
        assert line in proc.stderr  # and on the terminal


def test_regeneration_on_a_real_engine_front_end_logs_its_rounds(tmp_path, tokenizer_dir):
    """The regenerate stage on the real `Engine` front end (stood-in schedulers, standin_engine.py):
    its round lines and stats, logged after the engine started, are in the stage's log."""
    model = tmp_path / "model"
    shutil.copytree(tokenizer_dir, model)
    (model / "config.json").write_text(json.dumps(tiny_llama_config_json()))
    records = [
        {
            "id": str(i),
            "source": f"x:{i}",
            "messages": [
                {"role": "user", "content": f"Question {i}.{t}"}
                if r == 0
                else {"role": "assistant", "content": "A"}
                for t in range(2)
                for r in range(2)
            ],
            "tools": None,
        }
        for i in range(3)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "results" / "regenerated"
    job = {
        "stage": "regenerate",
        "log": str(tmp_path / "regenerate.log"),
        "paths": [str(tmp_path / "train.jsonl"), str(out / "train.jsonl"), str(out / "train.stats.json"),
                  str(model)],
        "settings": {"enabled": True, "backend": "sglang", "turns": "all", "max_new_tokens": 16},
        "engine_settings": {"engine_args": {"device": "cpu"}},
        "max_length": 512,
    }  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = ENV | {"TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / "engine_job.py"), str(tmp_path / "job.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "regenerate.log").read_text()
    for line in ("regenerate: turn round 1 / 2 done", "regenerate: turn round 2 / 2 done"):
        assert f"INFO {line}" in text, text[-3000:]
        assert f"INFO {line}" in proc.stderr
