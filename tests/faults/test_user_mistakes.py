"""A new user's mistakes on the command line, through the real `snakemake -n`.

- `--config` overrides: Snakemake hands nested values over as strings; the schema types them (every key
  type works), a wrong one is refused naming the key, and a config file stays strict beside them.
- Local paths that do not exist (data inputs, model.source, evaluate baselines and prompt files) are
  refused when the workflow is parsed, naming the key, before any job: on a finished run Snakemake would
  otherwise find nothing to do and keep using the old data.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dryrun import planned_jobs  # tools/ (pytest pythonpath, pyproject.toml)

REPO = Path(__file__).parents[2]
REFUSED_BEFORE_ANY_JOB = "snakemake -n refuses naming the key, before any job"


def dry_run(workdir: Path, *args: str, ok: bool = True) -> str:
    cmd = [sys.executable, "-m", "snakemake", "-n", "-d", str(workdir), *args]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert (result.returncode == 0) == ok, output[-4000:]
    return output


def test_every_key_type_overrides_from_the_command_line(tmp_path):
    plan = planned_jobs(
        dry_run(
            tmp_path,
            "--config",
            "train={'epochs': 1, lr: 1e-3, progress: false, max_steps: null}",
            "data={max_conversations: 100, eval_fraction: 0.2}",
            "model={aux_layer_ids: [1, 14, 26], trust_remote_code: false}",
            "tokenize={train_shards: 3}",
            "sglang={tp_size: 2, engine_args: {ep_size: 8, enable_dp_attention: true}}",
            "evaluate={sets: [heldout], baselines: []}",
        )
    )
    assert plan["extract"] == 3 + 1  # tokenize.train_shards 3 (+ 1 eval shard) took effect
    assert plan["specdec"] == 1  # evaluate.sets [heldout]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("train={epochs: one}", "train.epochs: expected an integer, got 'one'"),
        ("train={epochs: 0}", "train.epochs must be >= 1, got 0"),  # would train nothing
        ("train={lr: -1}", "train.lr must be > 0, got -1.0"),  # would climb the loss
        ("extract={sglang: {tp_size: 2}}", "config key extract.sglang has moved: it is sglang"),
    ],
)
def test_wrong_command_line_value_names_the_key(tmp_path, ledger, entry, message):
    with ledger.case("bad_input", f"--config {entry}", "snakemake refuses naming the --config key"):
        out = dry_run(tmp_path, "--config", entry, ok=False)
        assert message in out, out[-2000:]
        assert not (tmp_path / "results").exists()


def test_config_file_stays_strict_beside_command_line_values(tmp_path, ledger):
    config = tmp_path / "my.yaml"
    config.write_text('train: {epochs: "1"}\n')  # a quoted number in a file is a mistake, not an int
    with ledger.case(
        "bad_input", 'config file epochs: "1" beside --config', "file values stay strict beside --config"
    ):
        out = dry_run(tmp_path, "--configfile", str(config), "--config", "train={lr: 0.01}", ok=False)
        assert "train.epochs: expected an integer, got '1'" in out, out[-2000:]


def test_local_paths_that_do_not_exist_are_refused_before_any_job(tmp_path, ledger):
    data = tmp_path / "chats.jsonl"
    data.write_text('{"instruction": "Hi", "output": "Hello"}\n')
    good = tmp_path / "good.yaml"
    good.write_text(f"data: {{inputs: [{{path: {data}}}]}}\n")
    assert planned_jobs(dry_run(tmp_path, "--configfile", str(good)))["prepare"] == 1
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        "model: {source: meta-llama/Llama-3.1-8B-Instruct}\n"
        f"data: {{inputs: [{{path: {data}}}, {{path: {tmp_path}/chat.jsonl}}, {{path: {tmp_path}}}]}}\n"
        f"evaluate: {{baselines: [{{name: old, path: {tmp_path}/no_drafter}}],"
        f" sets: [heldout, {{name: mine, path: {tmp_path}/prompts.jsonl}}]}}\n"
    )
    out = dry_run(tmp_path, "--configfile", str(typo), ok=False)
    cases = {
        "data.inputs[1].path": f"{tmp_path}/chat.jsonl does not exist",
        "data.inputs[2].path": f"{tmp_path} is a directory, not a file",
        "model.source": "meta-llama/Llama-3.1-8B-Instruct does not exist (a hub id is never downloaded",
        "evaluate.baselines[0].path": f"{tmp_path}/no_drafter does not exist",
        "evaluate.sets[1].path": f"{tmp_path}/prompts.jsonl does not exist",
    }
    for key, message in cases.items():
        with ledger.case("bad_input", f"missing local path: {key}", REFUSED_BEFORE_ANY_JOB):
            assert f"{key}: {message}" in out, out[-3000:]
            assert "Job stats" not in out and not (tmp_path / "results").exists()
    assert "data.inputs[0]" not in out  # the file that exists is not named


@pytest.mark.parametrize("entry", ["data={inputs: [{path: /no/such/chats.jsonl}]}"])
def test_missing_path_given_on_the_command_line(tmp_path, entry):
    out = dry_run(tmp_path, "--config", entry, ok=False)
    assert "data.inputs[0].path: /no/such/chats.jsonl does not exist" in out, out[-2000:]
