"""Shared fixtures: a committed copy of the SmolLM2 tokenizer, a tiny random Llama built on it, and small
random token shards.

Unit tests never fetch anything: the tiny model has SmolLM2's tokenizer, chat template and vocab,
with 4 layers of width 64, so every stage's code path runs in seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

DATA = Path(__file__).parent / "data"
TOKENIZER_DIR = DATA / "tokenizer"


@pytest.fixture(autouse=True)
def _stage_log_env_of_its_own():
    """`setup_stage_logging` exports EYAS_STAGE_LOG for the processes a stage spawns; a test that runs a
    stage in-process must not hand it on to a later test's spawned children (the extract writer
    process, engines), whose stage log, in that test's removed tmp_path, they could not open."""
    from eyas.core.logs import STAGE_LOG_ENV

    before = os.environ.pop(STAGE_LOG_ENV, None)
    yield
    os.environ.pop(STAGE_LOG_ENV, None)
    if before is not None:
        os.environ[STAGE_LOG_ENV] = before


# `make test` runs on pytest-xdist workers (`-n 2 --dist loadfile`: a test file is a unit, so its
# module-scoped fixtures are built once). Files start longest first, so that no long file starts last and
# runs alone at the end; the SLURM requeue test goes last, after the cluster test has had the one SLURM
# to itself (`slurm_lock`).
LONGEST_FIRST = (  # seconds on a 2-core machine, two workers (pytest --durations)
    "tests/cluster/test_slurm.py",  # ~500
    "tests/faults/test_workflow_kill.py",  # ~150
    "tests/test_rerun.py",  # ~140
    "tests/test_workflow.py",  # ~340
    "tests/test_gpu_recipe_on_cpu.py",  # ~210
)
LAST = ("tests/faults/test_slurm_preempt.py",)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = Path(item.path).relative_to(Path(__file__).parent.parent).as_posix()
        if path in LONGEST_FIRST:
            return LONGEST_FIRST.index(path)
        return len(LONGEST_FIRST) + (path in LAST)

    items.sort(key=rank)  # stable: collection order within a rank
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def random_shard(tmp_path):
    """`random_shard(lengths, name, attrs)` writes a token shard under tmp_path and returns (path,
    samples): sample i is `lengths[i]` random ids below 100 (seeded), every token trained on (mask 1)."""
    from eyas.store import write_token_shard

    def write(lengths: list[int], name: str = "tokens.zarr", attrs: dict | None = None):
        rng = np.random.default_rng(0)
        samples = [(rng.integers(0, 100, n).astype(np.int32), np.ones(n, np.uint8)) for n in lengths]
        path = tmp_path / name
        ids = [f"s{i}" for i in range(len(samples))]
        write_token_shard(path, samples, ids, attrs if attrs is not None else {"split": "train", "shard": 0})
        return path, samples

    return write


def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_torch_thread():
    """The test runs on one torch thread (tiny forwards: more threads only add contention on a shared
    CPU); the count is restored after. A whole module: `pytestmark = pytest.mark.usefixtures(...)`."""
    yield from _one_torch_thread()


@pytest.fixture(scope="module")
def one_torch_thread_per_module():
    """`one_torch_thread` held for a whole module, its module-scoped fixtures included."""
    yield from _one_torch_thread()


@pytest.fixture(scope="session")
def slurm_lock():
    """`with slurm_lock():` holds the one SLURM cluster of tests/cluster/ across pytest-xdist workers:
    the cluster test and the requeue test each wait for their own jobs, and must not find the other's
    queued ahead of them."""

    @contextlib.contextmanager
    def hold():
        with open(Path(tempfile.gettempdir()) / "eyas-slurm-tests.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    return hold


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    return TOKENIZER_DIR


@pytest.fixture(scope="session")
def tokenizer():
    from eyas.model.target import load_tokenizer

    return load_tokenizer(TOKENIZER_DIR)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random 4-layer Llama (hidden 64) with SmolLM2's tokenizer, saved as an HF dir."""
    from modelkit import tiny_llama_config
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny_model")
    config = tiny_llama_config()
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    for f in TOKENIZER_DIR.iterdir():
        shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def sharp_target(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny Llama with its (tied) embedding scaled up, so the teacher is peaked, not uniform."""
    import trainkit

    return trainkit.sharpen(tiny_model_dir, tmp_path_factory.mktemp("sharp_target"))


@pytest.fixture(scope="session")
def data(sharp_target, tmp_path_factory) -> dict:
    """Two (token shard, hidden store) pairs of the sharp target's greedy continuations + a draft vocab."""
    import trainkit

    return trainkit.build(sharp_target, tmp_path_factory.mktemp("train_data"))
