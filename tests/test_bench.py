"""bench/ is a second client of the package's internals: every bench module must import (without running
its work) and answer `--help`, so a refactor of eyas cannot break a benchmark, study or GPU-machine
script unseen."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
MODULES = sorted(p for p in BENCH.rglob("*.py") if "results" not in p.relative_to(BENCH).parts)
IDS = [str(p.relative_to(BENCH)) for p in MODULES]


def env() -> dict:
    """This checkout's package and tools first, whatever eyas the venv has installed."""
    paths = [str(REPO / "src"), str(REPO / "tools"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def test_bench_has_its_three_folders():
    assert MODULES, "no bench modules found"
    assert {p.parent.relative_to(BENCH).as_posix() for p in MODULES} <= {".", "studies", "gpu"}


@pytest.mark.parametrize("path", MODULES, ids=IDS)
def test_bench_module_imports(path, monkeypatch):
    """Importing runs no work: the script's own folder on the path, as when run, and a name other than
    __main__, so its `if __name__ == "__main__":` guard holds everything that measures."""
    monkeypatch.syspath_prepend(str(path.parent))
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    monkeypatch.setattr(sys, "argv", [str(path)])
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:  # bench modules it imported by bare name (`from train import ...`) leave with it
        for name in set(sys.modules) - before:
            if BENCH in Path(getattr(sys.modules[name], "__file__", None) or "/").resolve().parents:
                del sys.modules[name]


@pytest.mark.parametrize("path", MODULES, ids=IDS)
def test_bench_module_help(path):
    name = path.relative_to(REPO)
    command = [sys.executable, str(path), "--help"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env(), cwd=REPO, timeout=300)
    assert proc.returncode == 0, f"{name} --help exited {proc.returncode}:\n{proc.stderr[-2000:]}"
    assert "usage:" in proc.stdout, f"{name} --help printed no usage:\n{proc.stdout[-500:]}"


def test_synthetic_trainer_batches_carry_loss_where_real_ones_do(monkeypatch):
    """bench/train.py's batches train TRAINED_SHARE of their positions (the real data's share), and its
    random teacher's greedy token lies in the draft vocab, as 99.8% of real tokens do."""
    monkeypatch.syspath_prepend(str(BENCH))
    from train import SHAPES, TRAINED_SHARE, _batch, synthetic_teacher

    from eyas.train.loss import step_loss_mask, teacher_from_final

    shape = SHAPES["smollm2"] | {"draft": 16384}
    batch = _batch(shape, 2, 400, "cpu")
    head, _, t2d = synthetic_teacher(shape)  # trainer_step's teacher
    _, in_vocab = teacher_from_final(batch.final.float(), head, torch.arange(shape["draft"]), t2d)
    share = step_loss_mask(batch.loss_mask, batch.valid, in_vocab, 0).float().mean().item()
    assert share == pytest.approx(TRAINED_SHARE, abs=0.02)


def test_train_profile_times_the_settings_it_is_given(monkeypatch):
    """bench/train_profile.py's case runs the trainer step of its draft vocab, attention and compile
    settings (the drafter the step trains is built with them), and reports the step's time."""
    monkeypatch.syspath_prepend(str(BENCH))
    import train
    from train_profile import case_profile

    built = []
    real = train._drafter

    def spy(shape, device):
        model = real(shape, device)
        built.append((shape["draft"], model))
        return model

    monkeypatch.setattr(train, "_drafter", spy)
    result = case_profile(1, 32, "cpu", ttt=2, attention="lse", draft_vocab=256)
    ((draft, model),) = built
    assert draft == 256 and model.attention_impl == "lse" and not model.compiled
    assert result["tokens_per_step"] == 32 and result["seconds_per_step"] > 0
    assert result["tokens_per_s"] == pytest.approx(32 / result["seconds_per_step"])
    assert result["aten_calls_per_step"] > 0


def test_validate_bench_times_a_runs_store_and_its_parts(monkeypatch, tmp_path):
    """bench/validate.py --store times validate_store on an existing store, then its hash and its scan
    alone, over the store's own files and tokens."""
    monkeypatch.syspath_prepend(str(BENCH))
    from validate import time_run_store, write_inputs

    shard, stores = write_inputs(tmp_path, 1500, 16, 2)
    result = time_run_store(shard, stores["fp8_e4m3"], [1, 2])
    assert result["tokens"] == 1500 and result["storage"] == "fp8_e4m3"
    assert [r["threads"] for r in result["validate_store"]] == [1, 2]
    assert [r["threads"] for r in result["scan_alone"]] == [1, 2]
    hashed = result["sha256_alone_by_array"]
    assert set(hashed) == {"aux", "final", "scale"}
    # 1,500 tokens in 256-token chunks: 6 chunk files and the array's zarr.json each
    assert all(h["files"] == 7 and h["bytes"] > 0 for h in hashed.values())
    assert all([r["threads"] for r in h["by_threads"]] == [1, 2] for h in hashed.values())
    bf16 = time_run_store(shard, stores["bf16"], [1])["sha256_alone_by_array"]
    assert set(bf16) == {"aux", "final"}  # a bf16 store has no scales


def test_validate_bench_shards_its_synthetic_stores(monkeypatch, tmp_path):
    """--chunks-per-shard writes the synthetic stores sharded, as the GPU recipe does (16 a file); --store
    with --compare-src times that tree's scan alone too, and its counts must be this tree's."""
    monkeypatch.syspath_prepend(str(BENCH))
    from validate import time_run_store, write_inputs

    from eyas.store import HiddenStore

    shard, stores = write_inputs(tmp_path, 1500, 16, 2, chunks_per_shard=4)
    for store in stores.values():
        assert HiddenStore(store).aux.shards == (1024, 32)  # 4 chunks of 256 tokens, 2 taps x 16
    result = time_run_store(shard, stores["fp8_e4m3"], [2], compare=(str(REPO / "src"), "again"))
    assert all(h["files"] == 3 for h in result["sha256_alone_by_array"].values())  # 6 chunks, 2 shards
    scans = result["scan_alone"]  # --compare-src's scan (here this tree's, in a child process) first
    assert [(s["code"].endswith("(--compare-src)"), s["threads"]) for s in scans] == [(True, 2), (False, 2)]
    assert all(c == {"nan": 0, "inf": 0} for c in result["nonfinite"].values())


def test_regenerate_rounds_bench_writes_the_same_bytes_either_way(tmp_path, tokenizer_dir):
    """bench/regenerate_rounds.py on a small multi-turn split: both cases pass every round and write
    the same output (it exits non-zero when they differ)."""
    messages = []
    for t in range(3):
        messages += [
            {"role": "user", "content": f"Question {t}?"},
            {"role": "assistant", "content": f"Answer {t}."},
        ]
    records = [{"id": str(i), "source": f"x:{i}", "messages": messages[: 2 * (1 + i % 3)], "tools": None}
               for i in range(6)]  # fmt: skip
    prepared = tmp_path / "train.jsonl"
    prepared.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "rounds.json"
    command = [sys.executable, str(BENCH / "regenerate_rounds.py"), "--model", str(tokenizer_dir),
               "--prepared", str(prepared), "--out", str(out), "--samples", "2",
               "--repeats", "1"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=env(), cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [c["case"] for c in result["cases"]] == ["together", "one-at-a-time"]
    for case in result["cases"]:
        assert case["prompts_a_round"] == [12, 8, 4] and case["turns_regenerated"] == 24
