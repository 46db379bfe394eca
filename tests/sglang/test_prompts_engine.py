"""The prompts stage on its SGLang backend: a job of rule prompts on the real `Engine` front end with
the stood-in scheduler (standin_engine.py), as Snakemake runs it; its counts add up, and a rerun on two
engines started together (`regenerate.engine`) writes the same files (the stand-in's tokens are a
function of the prompt, whichever engine it goes to)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from modelkit import tiny_llama_config_json

JOB = Path(__file__).parent / "engine_job.py"
TOOLS = [{"name": "get_weather", "description": "Weather of a city", "parameters": {}}]


def _job(root: Path, model: Path, tool_file: Path, engine: dict) -> dict:
    out = root / "results" / "prompts"
    return {
        "stage": "prompts",
        "log": str(root / "prompts.log"),
        "paths": [str(out / "target.jsonl"), str(out / "target.rejects.jsonl"),
                  str(out / "target.stats.json"), str(model), [str(tool_file)]],
        "settings": {"backend": "sglang", "conversations": 12, "turns": 2, "chinese_share": 0.0,
                     "tool_share": 0.5, "max_new_tokens": 8, "max_tokens": 8},
        "answer_settings": {"max_new_tokens": 6, "temperature": 0.7, "engine": engine},
        "engine_settings": {"engine_args": {"device": "cpu"}},
    }  # fmt: skip


def _run(job: dict, root: Path) -> subprocess.CompletedProcess:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    spec = root / "job.json"
    spec.write_text(json.dumps(job))
    env = os.environ | {"TMPDIR": str(root / "tmp")}
    return subprocess.run(
        [sys.executable, "-W", "ignore", str(JOB), str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_prompts_job_counts_add_up_and_two_engines_write_what_one_writes(tmp_path, tokenizer_dir):
    model = tmp_path / "model"
    shutil.copytree(tokenizer_dir, model)
    (model / "config.json").write_text(json.dumps(tiny_llama_config_json()))
    tool_file = tmp_path / "tools.json"
    rows = [{"conversations": [{"from": "human", "value": "Weather?"}, {"from": "gpt", "value": "ok"}],
             "tools": json.dumps(TOOLS)}]  # fmt: skip
    tool_file.write_text(json.dumps(rows))
    runs = []
    for name, engine in (("a", {}), ("b", {"engines": 2, "start_together": True})):
        done = _run(_job(tmp_path / name, model, tool_file, engine), tmp_path / name)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(tmp_path / name / "results" / "prompts")
    assert "2 engines started together" in (tmp_path / "b" / "prompts.log").read_text()
    stats = json.loads((runs[0] / "target.stats.json").read_text())
    assert stats["conversations"] == 12 == stats["kept"] + stats["rejected"]
    assert stats["turns_written"] == stats["turns_kept"] + stats["turns_rejected"] >= 12
    assert stats["answers_written"] == stats["answers_kept"] + stats["answers_rejected"]
    rejects = (runs[0] / "target.rejects.jsonl").read_text().splitlines()
    assert len(rejects) == stats["turns_rejected"]
    for name in ("target.jsonl", "target.rejects.jsonl", "target.stats.json"):
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name
