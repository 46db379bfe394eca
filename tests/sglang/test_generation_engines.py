"""The generation engines (`regenerate.engine`) on the real sglang classes: their arguments resolve as SGLang
resolves them, and a regenerate job with two engines on the real `Engine` front end (stood-in scheduler
processes, tests/sglang/standin_engine.py) writes what one engine writes, and fails clearly when a
scheduler of either dies."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from modelkit import tiny_llama_config_json
from sglang.srt.server_args import ServerArgs

from eyas.config import RegenerateEngineSettings, SglangSettings
from eyas.engine.generation import GenerationEngines, deal, memory_shares
from eyas.engine.sglang_args import base_engine_args, generation_engine_args

sys.path.insert(0, str(Path(__file__).parents[1] / "faults"))
import test_sglang_engine_death as death  # noqa: E402  (its engine-job harness and inputs)

regen_inputs = death.regen_inputs  # the module fixture: prepared conversations and a target dir


def test_generation_args_resolve_as_sglang_resolves_them(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama_config_json()))
    settings = RegenerateEngineSettings(
        max_running_requests=2048,
        cuda_graph_max_bs=2048,
        prefill_cuda_graph=False,
        engine_args={"enable_mixed_chunk": True},
    )
    base = base_engine_args(SglangSettings(), tmp_path, "bfloat16", False)
    args = ServerArgs(**generation_engine_args(base, 3, settings), device="cpu")
    args.resolve_once()
    resolved = args.resolved_dict()
    assert resolved["max_running_requests"] == 2048
    assert resolved["cuda_graph_max_bs_decode"] == 2048
    assert resolved["cuda_graph_config"]["prefill"]["backend"] == "disabled"  # no prefill graphs captured
    assert resolved["enable_mixed_chunk"] is True and resolved["random_seed"] == 3
    # SGLang's own choice unless asked (on a CPU it disables prefill graphs by itself)
    assert "disable_prefill_cuda_graph" not in generation_engine_args(base, 3, RegenerateEngineSettings())


@pytest.mark.parametrize("key", ["max_running_requests", "disable_prefill_cuda_graph", "model_path"])
def test_generation_engine_args_refuse_keys_eyas_sets(key):
    settings = RegenerateEngineSettings(engine_args={key: 1})
    with pytest.raises(ValueError, match=rf"regenerate\.engine\.engine_args\.{key}: set by eyas"):
        generation_engine_args({}, 0, settings)


def test_prompts_are_dealt_evenly_in_order():
    assert deal(list("abcdefg"), 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert deal(["a"], 4) == [[0], [], [], []]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_engines_started_in_turn_take_equal_shares_of_the_memory(count):
    # each engine takes its mem_fraction_static of the memory free when it starts (sglang 0.5.17)
    started = []

    def start(args, **_):
        started.append(args["mem_fraction_static"])
        return type("Engine", (), {"loop": None, "shutdown": lambda self: None})()

    GenerationEngines({"mem_fraction_static": 0.5}, count=count, stage="test", start=start)
    assert started == memory_shares(0.5, count)
    free, taken = 1.0, []
    for share in started:
        taken.append(share * free)
        free -= taken[-1]
    assert taken == pytest.approx([0.5 / count] * count) and free == pytest.approx(0.5)


def _job(inputs: Path, root: Path, engines: int, pipeline_turns: bool = True, together: bool = False) -> dict:
    job = death._regen_job(inputs, root)
    job["settings"]["engine"] = {
        "engines": engines,
        "pipeline_turns": pipeline_turns,
        "start_together": together,
    }
    return job


def test_two_engines_write_what_one_engine_writes(tmp_path, regen_inputs):
    """Through the real `Engine` front end (`async_generate` per turn, pipelined), and the same with one
    generate call a turn round: the stood-in schedulers answer as a function of the prompt, so every
    way of sending the same prompts writes the same bytes."""
    runs = {
        "one": (1, True, False),
        "two": (2, True, False),
        "rounds": (2, False, False),
        "together": (3, True, True),
    }
    for name, (engines, pipeline, together) in runs.items():
        job = _job(regen_inputs, tmp_path / name, engines, pipeline, together)
        out = death._engine_job(job, tmp_path / name)
        assert out["code"] == 0, (name, out["stderr"][-2000:])
    log = (tmp_path / "together" / "regenerate.log").read_text()
    assert re.search(r"3 engines started together in [0-9.]+ s", log), log[-2000:]
    for name in ("train.jsonl", "train.stats.json"):
        want = (tmp_path / "one" / "results" / "regenerated" / name).read_bytes()
        for run in ("two", "rounds", "together"):
            assert (tmp_path / run / "results" / "regenerated" / name).read_bytes() == want, (run, name)
    assert json.loads(want)["turns_regenerated"] == 12


def test_a_scheduler_killed_among_two_engines_fails_the_job_clearly(tmp_path, regen_inputs):
    job = _job(regen_inputs, tmp_path, 2)
    run = death._engine_job(job, tmp_path, hang="plain:1")  # each scheduler holds its first request
    assert run["code"] == 1, run["stderr"][-3000:]
    last = run["stderr"].strip().splitlines()[-1]
    stage = re.escape(f"regenerate {job['paths'][1]}")
    what = rf"scheduler_0 \(pid {run['killed']}, exit code -9\).* exited while the engine was in use"
    assert re.fullmatch(
        rf"eyas\.engine\.sglang\.EngineDied: {stage}: the SGLang engine died: .*{what}.*", last
    ), last
    assert list((tmp_path / "results" / "regenerated").iterdir()) == []
    death._engine_processes_gone(tmp_path)


@pytest.mark.parametrize("fail", ["plain:0", "hang"])
def test_a_scheduler_failing_as_engines_start_together_fails_the_job_clearly(tmp_path, regen_inputs, fail):
    """A scheduler that fails as it starts (SGLang's way: SIGQUIT to the job, then exit) or is killed
    before it is ready, while two engines start together: the job ends with `EngineDied`, no output,
    and no engine process left (the other engine's scheduler was waiting for its turn or working)."""
    job = _job(regen_inputs, tmp_path, 2, together=True)
    run = death._engine_job(job, tmp_path, **({"hang": "plain:0"} if fail == "hang" else {"fail": fail}))
    assert run["code"] == 1, run["stderr"][-3000:]
    last = run["stderr"].strip().splitlines()[-1]
    stage = re.escape(f"regenerate {job['paths'][1]}")
    assert re.fullmatch(
        rf"eyas\.engine\.sglang\.EngineDied: {stage}: the SGLang engine died: it did not start: .*", last
    ), last
    assert list((tmp_path / "results" / "regenerated").iterdir()) == []
    assert death._eyas_temp_files(tmp_path) == []
    death._engine_processes_gone(tmp_path)


def test_sglang_offline_benchmark_imports_without_hf_datasets():
    # bench/gpu/generation.py's SGLang child on the H200 died importing the benchmark package (its MMMU
    # loader imports Hugging Face `datasets`, which neither the GPU image nor this venv has).
    import importlib.util

    sys.path.insert(0, str(Path(__file__).parents[2] / "bench" / "gpu"))
    import generation

    had_datasets = importlib.util.find_spec("datasets") is not None
    row_class, throughput_test_once = generation.import_sglang_benchmark()
    row = row_class(prompt="hi", prompt_len=1, output_len=4)
    assert (row.prompt_len, row.output_len) == (1, 4) and callable(throughput_test_once)
    if not had_datasets:
        with pytest.raises(RuntimeError, match="not installed"):
            sys.modules["datasets"].load_dataset("mmmu")
