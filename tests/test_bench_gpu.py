"""The GPU campaign's benches (bench/gpu/) on a CPU: arguments, variants, prompt and shard loading and the
result JSON (`--dry`: everything but the engines). Their speed is measured on the GPU, never here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[1]
BENCH = ROOT / "bench" / "gpu"
RECIPE = ROOT / "config" / "gpu-smollm2.yaml"
sys.path.insert(0, str(BENCH))

import extraction  # noqa: E402
import generation  # noqa: E402
import gpubench  # noqa: E402  (tools/, on pytest's path)


def _run(script: str, *args) -> None:
    """The bench as the campaign runs it: its own process, its own command line in the JSON."""
    out = subprocess.run(
        [sys.executable, str(BENCH / script), *map(str, args)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.parametrize("script", ["generation.py", "extraction.py"])
def test_help_runs_without_a_gpu(script):
    out = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--out" in out.stdout and "--dry" in out.stdout


def test_variants_by_name_or_json_and_bad_ones_refused():
    defaults = {"a": {"x": 1}, "b": {}}
    assert gpubench.parse_variants([], defaults) == defaults
    assert gpubench.parse_variants(["b", 'c={"engines": 2}'], defaults) == {"b": {}, "c": {"engines": 2}}
    with pytest.raises(SystemExit, match="--variant z: not one of"):
        gpubench.parse_variants(["z"], defaults)
    with pytest.raises(SystemExit, match="--variant c: not JSON"):
        gpubench.parse_variants(["c={engines"], defaults)
    with pytest.raises(SystemExit, match="--variant c: expected a JSON object"):
        gpubench.parse_variants(["c=[1]"], defaults)


def test_a_bench_runs_or_runs_the_child_mode_it_is_given(capsys):
    """`run_or_child`: a child mode (as `run_child` re-runs the script) calls its function with the
    hidden flags parsed; a run calls `run` and refuses a missing required flag."""
    import argparse

    calls = []

    def main(argv):
        ap = argparse.ArgumentParser()
        ap.add_argument("--out")
        children = {"_child": lambda a: calls.append(("child", a.result))}
        run = lambda a: calls.append(("run", a.out))  # noqa: E731
        gpubench.run_or_child(ap, argv, run, children, ["--result"], ["out"])

    main(["_child", "--result", "r.json"])
    main(["--out", "o"])
    assert calls == [("child", "r.json"), ("run", "o")]
    with pytest.raises(SystemExit):
        main([])
    assert "--out are required" in capsys.readouterr().err


def test_every_builtin_generation_variant_is_a_valid_regenerate_engine_setting():
    for overrides in generation.VARIANTS.values():
        _, settings = generation.load_settings(str(RECIPE), overrides)
        for key, value in overrides.items():
            assert getattr(settings.engine, key) == value


def _prepared(root: Path, counts: dict[str, int]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, n in counts.items():
        records = [
            {"id": f"{split}{i}", "source": "t", "tools": None,
             "messages": [{"role": "user", "content": f"Question {i}?"},
                          {"role": "assistant", "content": "An answer."}]}
            for i in range(n)
        ]  # fmt: skip
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def test_generation_dry_run_plans_the_recipes_prompts(tmp_path, tokenizer_dir):
    prepared = _prepared(tmp_path / "prepared", {"train": 5, "eval": 2})
    out = tmp_path / "out"
    _run("generation.py", "--model", tokenizer_dir, "--prepared", prepared, "--out", out, "--config", RECIPE,
         "--limit", "4", "--variant", "graphs-1024", "--dry")  # fmt: skip
    result = json.loads((out / "generation.json").read_text())
    samples = result["plan"]["regenerate"]["samples"]
    assert samples > 1  # the recipe samples several responses per prompt
    assert result["plan"]["prompts"]["train"]["round0_prompts"] == 4 * samples  # --limit 4
    assert result["plan"]["prompts"]["eval"]["round0_prompts"] == 2 * samples
    assert result["variants"] == {"graphs-1024": generation.VARIANTS["graphs-1024"]}
    assert "bench/gpu/generation.py" in result["command"] and "--dry" in result["command"]


def test_generation_refuses_a_missing_split(tmp_path, tokenizer_dir):
    prepared = _prepared(tmp_path / "prepared", {"train": 1})
    with pytest.raises(SystemExit, match=r"eval\.jsonl: no prepared split"):
        generation.main(
            [
                "--model",
                str(tokenizer_dir),
                "--prepared",
                str(prepared),
                "--out",
                str(tmp_path / "o"),
                "--dry",
            ]
        )


def test_rates_are_tokens_over_seconds():
    eyas = {"new_tokens": 1000, "process_seconds": 10.0, "stage_seconds": 6.0, "engine_start_seconds": [2.0]}
    assert generation.rates(eyas) == {"end_to_end": 100.0, "after_engine_start": 250.0}
    theirs = {
        "new_tokens": 1000,
        "process_seconds": 8.0,
        "benchmark_seconds": 2.0,
        "engine_start_seconds": [4.0],
    }
    assert generation.rates(theirs) == {
        "end_to_end": 125.0,
        "after_engine_start": 500.0,
        "while_generating": 500.0,
    }
    # eyas's generate calls timed alone: the like-for-like rate beside SGLang's timed calls
    timed = eyas | {"generate_seconds": 3.2}
    assert generation.rates(timed) == {
        "end_to_end": 100.0,
        "after_engine_start": 250.0,
        "while_generating": 312.5,
    }


def test_projected_seconds_rank_variants_by_the_recipes_whole_generation():
    quick_start = {
        "new_tokens": 1000,
        "process_seconds": 20.0,
        "new_tokens_per_s": {"after_engine_start": 100.0},
    }
    fast_decode = {
        "new_tokens": 1000,
        "process_seconds": 60.0,
        "new_tokens_per_s": {"after_engine_start": 200.0},
    }
    assert generation.projected_seconds(quick_start, 1000) == 20.0  # 10 s outside + 10 s generating
    assert generation.projected_seconds(fast_decode, 1e5) == 55.0 + 500.0
    assert generation.projected_seconds(quick_start, 1e5) == 10.0 + 1000.0  # slower at the recipe's scale


def test_extraction_dry_run_reads_the_shard_and_repeats_it(tmp_path):
    from eyas.store import read_token_shard, write_token_shard

    samples = [(np.arange(n, dtype=np.int32), np.ones(n, np.uint8)) for n in (5, 0, 7)]
    shard = tmp_path / "shard.zarr"
    write_token_shard(shard, samples, ["a", "b", "c"], {"model_id": "t"})
    out = tmp_path / "out"
    _run("extraction.py", "--model", "/nonexistent", "--shard", shard, "--out", out, "--config", RECIPE,
         "--variant", 'w4={"writer_threads": 4}', "--dry")  # fmt: skip
    result = json.loads((out / "extraction.json").read_text())
    assert result["workload"] == {"shard": str(shard), "samples": 3, "tokens": 12}
    assert result["variants"] == {"w4": {"writer_threads": 4}}
    assert result["extract"]["storage"] == extraction.extract_settings(str(RECIPE), {}).extract.storage
    repeated = read_token_shard(extraction.workload(str(shard), tmp_path, 30))
    assert repeated.num_samples == 6 and int(repeated.sample_offsets[-1]) == 36  # 5+7+5+7+5+7: empty skipped


def test_extract_overrides_merge_the_nested_engine_section():
    cfg = extraction.extract_settings(str(RECIPE), {"writer_threads": 3, "sglang": {"requests_per_call": 64}})
    base = extraction.extract_settings(str(RECIPE), {})
    assert cfg.extract.writer_threads == 3 and cfg.sglang.requests_per_call == 64
    assert cfg.sglang.attention_backend == base.sglang.attention_backend  # kept


def test_engine_start_help_runs_without_a_gpu():
    out = subprocess.run(
        [sys.executable, str(BENCH / "engine_start.py"), "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "--out" in out.stdout and "--no-engine" in out.stdout


def test_engine_start_summary_compares_the_modes_medians():
    import engine_start

    runs = [
        {"mode": "all", "registry_import_seconds": 3.0},
        {"mode": "needed", "registry_import_seconds": 0.5},
        {"mode": "all", "registry_import_seconds": 5.0},
        {"mode": "needed", "registry_import_seconds": 1.5},
        {"mode": "needed", "exit_code": 1},  # a child that failed has no figure
    ]
    out = engine_start.summary(runs, "registry_import_seconds")
    assert out["median_seconds"] == {"all": 4.0, "needed": 1.0}
    assert out["all_over_needed"] == 4.0 and out["saved_seconds"] == 3.0


def test_extraction_profile_top_ranks_by_own_and_cumulative_time(tmp_path):
    import cProfile

    def inner():
        return sum(i * i for i in range(20000))

    def outer():
        return [inner() for _ in range(3)]

    profiler = cProfile.Profile()
    profiler.runcall(outer)
    profiler.dump_stats(tmp_path / "p.prof")
    top = extraction.profile_top(tmp_path / "p.prof", count=5)
    cumulative = top["by_cumulative_time"]
    assert [r["cumulative_seconds"] for r in cumulative] == sorted(
        (r["cumulative_seconds"] for r in cumulative), reverse=True
    )
    assert any(r["function"].endswith("(outer)") and r["calls"] == 1 for r in cumulative)
    assert top["total_seconds"] >= cumulative[0]["own_seconds"]


def test_extraction_ratios_hold_capture_to_the_faster_bare_run():
    result = {
        "bare_prefill": {"tokens_per_s_by": {"after_engine_start": 100.0, "end_to_end": 10.0}},
        "bare_prefill_last": {"tokens_per_s_by": {"after_engine_start": 200.0, "end_to_end": 8.0}},
        "variants": {
            "a": {"tokens_per_s_by": {"after_engine_start": 150.0, "end_to_end": 5.0}},
            "failed": {"exit_code": 1},
        },
    }
    extraction.add_ratios(result)
    a = result["variants"]["a"]
    assert a["ratio_to_bare"] == {"after_engine_start": 0.75, "end_to_end": 0.5}
    assert a["ratio_to_each_bare"] == [
        {"after_engine_start": 1.5, "end_to_end": 0.5},
        {"after_engine_start": 0.75, "end_to_end": 0.625},
    ]
    assert "ratio_to_bare" not in result["variants"]["failed"]
    del result["bare_prefill_last"]  # a last bare run that failed: the first one alone
    extraction.add_ratios(result)
    assert a["ratio_to_bare"] == {"after_engine_start": 1.5, "end_to_end": 0.5}


def test_discard_writes_keeps_the_capture_and_drops_the_writers_work(
    tmp_path, tiny_model_dir, tokenizer, monkeypatch
):
    """`discard_writes` (the capture without its writers): an extraction runs to its end through the
    writer thread, waits for each batch, and leaves a store without chunk files."""
    from modelkit import token_shard_attrs

    from eyas.extract.hf_backend import extract_shard
    from eyas.extract.writer import BatchWriter
    from eyas.store import write_token_shard
    from eyas.store.writer import HiddenStoreWriter

    for cls, name in ((BatchWriter, "write"), (HiddenStoreWriter, "finish")):  # restored after the test
        monkeypatch.setattr(cls, name, getattr(cls, name))
    samples = [(np.arange(3, 3 + n, dtype=np.int32), np.ones(n, np.uint8)) for n in (5, 9, 300)]
    shard = tmp_path / "tokens.zarr"
    write_token_shard(shard, samples, ["a", "b", "c"], token_shard_attrs(tokenizer))
    kept = extract_shard(str(shard), str(tmp_path / "kept.zarr"), str(tiny_model_dir), layer_ids=[0, 1],
                         model_id="tiny", progress=False, writer_threads=2)  # fmt: skip
    extraction.drop_writes()
    dropped = extract_shard(str(shard), str(tmp_path / "dropped.zarr"), str(tiny_model_dir), layer_ids=[0, 1],
                            model_id="tiny", progress=False, writer_threads=2)  # fmt: skip
    assert kept["tokens"] == dropped["tokens"] == 314

    def files(store: str) -> set[str]:
        return {
            f.name for name in ("aux", "final") for f in (tmp_path / store / name).rglob("*") if f.is_file()
        }

    assert files("kept.zarr") > {"zarr.json"}  # chunk files beside the arrays' metadata ...
    assert files("dropped.zarr") == {"zarr.json"}  # ... and none where the writes were dropped
    assert dropped["bytes_stored"] < kept["bytes_stored"] / 10
