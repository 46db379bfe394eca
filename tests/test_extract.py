"""Extract stage (HF backend) on the tiny random Llama: taps, final state, provenance, atomicity."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from modelkit import token_shard_attrs

from eyas.core.layer_ids import LAYER_ID_CONVENTION, hf_hidden_index, validate_layer_ids
from eyas.core.provenance import FINAL_NORM, chat_template_hash, sha256_array, tokenizer_hash
from eyas.extract.batching import plan_batches
from eyas.extract.hf_backend import extract_shard, resolve_dtype
from eyas.store import HiddenStore, ProvenanceError, check_provenance, write_token_shard
from eyas.validate import validate_store

LAYER_IDS = [1, 0, 2]  # not sorted: the store must follow this order, not layer order
PROMPTS = [
    ("Hi", "Hello!"),
    ("What is the capital of France?", "The capital of France is Paris."),
    (
        "Write a haiku about rain.",
        "Soft rain on the roof,\nthe garden drinks in silence,\nclouds drift slowly east.",
    ),
    ("2+2?", "4"),
    ("Name three colours.", "Red, green and blue are three primary colours of light."),
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def samples(tokenizer) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for user, assistant in PROMPTS:
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
        ids = np.asarray(ids["input_ids"] if isinstance(ids, dict) else ids, dtype=np.int32)
        out.append((ids, np.ones(len(ids), np.uint8)))
    assert len({len(ids) for ids, _ in out}) > 1  # varied lengths, so batches really pad
    return out


@pytest.fixture
def token_shard(tmp_path, samples, tokenizer):
    path = tmp_path / "tokens" / "shard-00000.zarr"
    write_token_shard(path, samples, [f"s{i}" for i in range(len(samples))], token_shard_attrs(tokenizer))
    return path


@pytest.fixture(scope="module")
def reference(tiny_model_dir, samples):
    """Unbatched fp32 forward per sample: (HF hidden_states, raw output of the last decoder layer)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    last_layer_out = {}
    handle = model.model.layers[-1].register_forward_hook(
        lambda m, a, out: last_layer_out.__setitem__("x", out[0] if isinstance(out, tuple) else out)
    )
    refs = []
    with torch.no_grad():
        for ids, _ in samples:
            out = model(torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
            refs.append(([h[0] for h in out.hidden_states], model.model.norm(last_layer_out["x"])[0]))
    handle.remove()
    return refs


def _extract(token_shard, out, model_dir, **kwargs) -> dict:
    kwargs = {"layer_ids": LAYER_IDS, "model_id": "tiny", "progress": False, **kwargs}
    return extract_shard(str(token_shard), str(out), str(model_dir), **kwargs)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


# --------------------------------------------------------------------------- batching maths
def test_plan_batches_budget_coverage_and_padding():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(0, 300) for _ in range(rng.randint(0, 40))]
        budget = rng.randint(1, 1000)
        plan = plan_batches(lengths, budget)
        seen = [i for batch in plan.batches for i in batch] + plan.empty
        assert sorted(seen) == list(range(len(lengths)))  # every sample exactly once
        assert all(lengths[i] == 0 for i in plan.empty)
        padded = 0
        for batch in plan.batches:
            width = max(lengths[i] for i in batch)
            assert len(batch) * width <= budget or len(batch) == 1  # only a lone sample may exceed
            padded += len(batch) * width
        assert plan.padded_tokens == padded
        assert plan.real_tokens == sum(lengths)
        expected = 1 - sum(lengths) / padded if padded else 0.0
        assert plan.padding_fraction == pytest.approx(expected)


def test_plan_batches_sorted_packing_and_oversize():
    plan = plan_batches([3, 10, 4, 20, 0], token_budget=12)
    # Longest first; 20 > budget goes alone; 10 fills a batch; 4 and 3 share one (2 * 4 <= 12).
    assert plan.batches == [[3], [1], [2, 0]]
    assert plan.empty == [4]
    assert plan.padded_tokens == 20 + 10 + 8
    assert plan.padding_fraction == pytest.approx(1 - 37 / 38)
    with pytest.raises(ValueError, match="token_budget"):
        plan_batches([1], 0)


def _brute_force_cost(widths: list[int], budget: int, overhead: int) -> float:
    """Least padded + overhead cost over all contiguous partitions of descending widths."""
    best = [0.0] + [float("inf")] * len(widths)
    for j in range(1, len(widths) + 1):
        for i in range(j):
            size = j - i
            if size * widths[i] <= budget or size == 1:
                best[j] = min(best[j], best[i] + size * widths[i] + overhead)
    return best[-1]


def test_plan_batches_is_optimal_among_sorted_partitions():
    rng = random.Random(1)
    for _ in range(200):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 12))]
        budget, overhead = rng.randint(1, 200), rng.choice([0, 5, 50])
        plan = plan_batches(lengths, budget, batch_overhead_tokens=overhead)
        cost = plan.padded_tokens + overhead * len(plan.batches)
        widths = sorted(lengths, reverse=True)
        assert cost == _brute_force_cost(widths, budget, overhead)


def test_plan_batches_pads_conversation_like_lengths_under_five_percent():
    # Lognormal lengths with the seed job's mean (~1.7k tokens), few samples per shard, large budgets:
    # where a greedy fill pads 8-12%.
    rng = np.random.default_rng(0)
    for samples in (100, 230, 1000):
        lengths = np.clip(rng.lognormal(np.log(1400), 0.65, samples), 64, 4096).astype(int).tolist()
        for budget in (8192, 32768):
            assert plan_batches(lengths, budget).padding_fraction < 0.05


def test_windowed_plan_bounds_chunks_held_in_memory(tmp_path):
    """A shard-wide length sort leaves most chunks waiting for a short sample until the end; planning
    in windows of consecutive samples keeps the partly filled chunks to about one window."""
    from eyas.store import hidden_store_writer

    rng = random.Random(3)
    lengths = [rng.randint(1, 300) for _ in range(400)]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    peaks = {}
    for window in (None, 2048):
        plan = plan_batches(lengths, 1024, window_tokens=window)
        assert sorted(i for b in plan.batches for i in b) == list(range(len(lengths)))
        with hidden_store_writer(tmp_path / f"w{window}.zarr", offsets, 2, 1, {}, chunk_tokens=64) as w:
            for batch in plan.batches:
                for i in batch:
                    rows = np.zeros((lengths[i], 2), np.uint16)
                    w.write_sample(i, rows, rows)
            peaks[window] = w.peak_pending_chunks
    assert peaks[2048] <= 2048 // 64 + 2
    assert peaks[None] > 4 * peaks[2048]  # what the window prevents


def test_validate_layer_ids_and_dtype():
    assert validate_layer_ids([1, 14, 26], 30) == [1, 14, 26]
    for bad in ([30], [-1], [1, 1], [], [1.5]):
        with pytest.raises(ValueError):
            validate_layer_ids(bad, 30)
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", torch.device("cpu"))


# --------------------------------------------------------------------------- capture
def test_hf_last_hidden_state_is_post_norm(reference):
    for hidden_states, normed_last in reference:
        assert torch.equal(hidden_states[-1], normed_last)


def test_alone_in_batch_is_exact(tmp_path, token_shard, tiny_model_dir, reference, samples):
    stats = _extract(token_shard, tmp_path / "hidden.zarr", tiny_model_dir, token_budget=1)
    assert stats["batches"] == len(samples) and stats["padding_fraction"] == 0.0
    store = HiddenStore(tmp_path / "hidden.zarr")
    for s, (hidden_states, _) in enumerate(reference):
        aux, final = store.sample(s)
        want = torch.cat([hidden_states[hf_hidden_index(v)] for v in LAYER_IDS], dim=-1)  # [T, 3H]
        assert torch.equal(aux.float(), _bf16(want))
        assert torch.equal(final.float(), _bf16(hidden_states[-1]))


@pytest.mark.parametrize("writer_threads", [1, 2])
def test_padded_batches_match_reference(
    tmp_path, token_shard, tiny_model_dir, reference, samples, writer_threads
):
    stats = _extract(
        token_shard, tmp_path / "h.zarr", tiny_model_dir, token_budget=4096, writer_threads=writer_threads
    )
    lengths = [len(ids) for ids, _ in samples]
    # fewer forwards than samples, some of them padded
    assert stats["batches"] < len(samples) and stats["padding_fraction"] > 0
    assert stats["tokens"] == sum(lengths) and stats["samples"] == len(samples)
    assert stats["padding_fraction"] == pytest.approx(1 - sum(lengths) / stats["padded_tokens"])
    assert stats["bytes_raw_bf16"] == sum(lengths) * 4 * 64 * 2 and stats["bytes_stored"] > 0
    store = HiddenStore(tmp_path / "h.zarr")
    for s, (hidden_states, _) in enumerate(reference):
        aux, final = store.sample(s)
        assert aux.shape == (lengths[s], 3 * 64) and final.shape == (lengths[s], 64)
        want = torch.cat([hidden_states[hf_hidden_index(v)] for v in LAYER_IDS], dim=-1)
        # Padded-batch kernels differ from unbatched ones by fp32 noise, which can flip a bf16 rounding:
        # allow ~2 bf16 ulps.
        torch.testing.assert_close(aux.float(), _bf16(want), rtol=8e-3, atol=1e-3)
        torch.testing.assert_close(final.float(), _bf16(hidden_states[-1]), rtol=8e-3, atol=1e-3)


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_writer_process_writes_the_thread_writers_store(tmp_path, token_shard, tiny_model_dir, storage):
    """`extract.writer_process`: whole-sample padded batches through a child process give the store the
    writer threads give, byte for byte (chunks, metadata, attrs); the child's figures come back."""
    kwargs = dict(token_budget=256, storage=storage, chunks_per_shard=2, writer_threads=2)
    threads = _extract(token_shard, tmp_path / "t.zarr", tiny_model_dir, **kwargs)
    process = _extract(token_shard, tmp_path / "p.zarr", tiny_model_dir, writer_process=True, **kwargs)

    def files(store: str) -> dict[str, bytes]:
        root = tmp_path / store
        return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()}

    assert files("p.zarr") == files("t.zarr") and len(files("p.zarr")) > 4
    assert process["writer_process"] and not threads["writer_process"]
    assert process["peak_pending_chunks"] == threads["peak_pending_chunks"] > 0
    assert process["writer_process_batches"] == process["batches"] > 1
    assert not list(tmp_path.glob(".*.zarr*"))  # no temporary left beside the stores


def test_fp8_storage_round_trip(tmp_path, token_shard, tiny_model_dir, reference, samples):
    """fp8_e4m3 stores about half the bytes; what it reads back is within e4m3's rounding."""
    exact = _extract(token_shard, tmp_path / "bf16.zarr", tiny_model_dir, token_budget=1)
    lossy = _extract(token_shard, tmp_path / "fp8.zarr", tiny_model_dir, token_budget=1, storage="fp8_e4m3")
    store = HiddenStore(tmp_path / "fp8.zarr")
    assert store.attrs["storage"] == "fp8_e4m3" and store.attrs["dtype"] == "float8_e4m3fn"
    assert store.attrs["scale_rule"] == "per_token_per_tap_absmax"
    manifest = validate_store(token_shard, tmp_path / "fp8.zarr")  # the validate rule accepts it
    assert manifest["ok"] and set(manifest["arrays"]) == {"aux", "final", "scale"}
    # At H=64 the float32 scales are 4 bytes per 64-byte row (6%): real widths make them negligible.
    assert lossy["bytes_stored"] < 0.7 * exact["bytes_stored"]
    for s, (hidden_states, _) in enumerate(reference):
        aux, final = store.sample(s)
        assert aux.dtype == torch.float32 and aux.shape == (len(samples[s][0]), 3 * 64)
        want = torch.cat([hidden_states[hf_hidden_index(v)] for v in LAYER_IDS], dim=-1)
        for got, ref in (
            (aux.view(len(aux), 3, 64), want.view(len(want), 3, 64)),
            (final[:, None], hidden_states[-1][:, None]),
        ):
            err = (got - ref).norm(dim=-1) / ref.norm(dim=-1)  # per token and tap
            assert float(err.max()) < 0.05  # e4m3: 3 mantissa bits, relative step <= 2**-4


def test_provenance_attrs(tmp_path, token_shard, tiny_model_dir, samples, tokenizer):
    from eyas.core.provenance import EYAS_VERSION, model_hash

    _extract(token_shard, tmp_path / "h.zarr", tiny_model_dir, token_budget=64)
    store = HiddenStore(tmp_path / "h.zarr")
    input_ids = np.concatenate([ids for ids, _ in samples])
    expected = {
        "format": "eyas.hidden/1",
        "model_id": "tiny",
        "model_hash": model_hash(tiny_model_dir),
        "layer_ids": LAYER_IDS,
        "layer_id_convention": LAYER_ID_CONVENTION,
        "final_norm": FINAL_NORM,
        "hidden_size": 64,
        "num_taps": 3,
        "dtype": "bfloat16",
        "compute_dtype": "float32",
        "device": "cpu",
        "backend": "hf",
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "chat_template_hash": chat_template_hash(tokenizer),
        "tokens_checksum": sha256_array(input_ids),
        "token_shard": str(token_shard),
        "split": "train",
        "shard": 0,
        "num_samples": len(samples),
        "num_tokens": len(input_ids),
        "eyas_version": EYAS_VERSION,
    }
    check_provenance(store.attrs, expected, tmp_path / "h.zarr")
    assert store.attrs["codec"].startswith("blosc:zstd")
    assert np.array_equal(
        store.sample_offsets, np.concatenate([[0], np.cumsum([len(i) for i, _ in samples])])
    )


# --------------------------------------------------------------------------- failures and edge cases
def test_failure_mid_extraction_leaves_nothing(tmp_path, token_shard, tiny_model_dir, monkeypatch):
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaModel.forward
    calls = []

    def failing_forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom on batch 2")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaModel, "forward", failing_forward)
    out = tmp_path / "hidden" / "shard-00000.zarr"
    with pytest.raises(RuntimeError, match="boom on batch 2"):
        _extract(token_shard, out, tiny_model_dir, token_budget=1)
    assert len(calls) == 2
    assert list(out.parent.iterdir()) == []  # no store, no stray temp dir


def test_writer_failure_surfaces_and_leaves_nothing(tmp_path, token_shard, tiny_model_dir, monkeypatch):
    from eyas.store import HiddenStoreWriter

    def broken_write(self, index, aux, final):
        raise OSError("disk full")

    monkeypatch.setattr(HiddenStoreWriter, "write_sample", broken_write)
    out = tmp_path / "hidden" / "shard-00000.zarr"
    with pytest.raises(RuntimeError, match="writer thread failed"):
        _extract(token_shard, out, tiny_model_dir, token_budget=1)
    assert list(out.parent.iterdir()) == []


def test_empty_shard_and_empty_sample(tmp_path, tiny_model_dir, tokenizer, samples):
    empty = tmp_path / "empty.zarr"
    write_token_shard(empty, [], [], token_shard_attrs(tokenizer))
    stats = _extract(empty, tmp_path / "h0.zarr", tiny_model_dir)
    store = HiddenStore(tmp_path / "h0.zarr")
    assert stats["samples"] == 0 and stats["tokens"] == 0 and store.num_samples == 0
    assert store.aux.shape == (0, 3 * 64) and store.final.shape == (0, 64)
    assert store.attrs["tokens_checksum"] == sha256_array(np.zeros(0, np.int32))

    # A zero-length sample among real ones is written as zero rows and keeps its place.
    with_empty = [samples[0], (np.zeros(0, np.int32), np.zeros(0, np.uint8)), samples[1]]
    path = tmp_path / "with_empty.zarr"
    write_token_shard(path, with_empty, ["a", "b", "c"], token_shard_attrs(tokenizer))
    _extract(path, tmp_path / "h1.zarr", tiny_model_dir)
    store = HiddenStore(tmp_path / "h1.zarr")
    assert [store.sample(i)[0].shape[0] for i in range(3)] == [len(samples[0][0]), 0, len(samples[1][0])]


def test_bad_inputs_are_refused(tmp_path, token_shard, tiny_model_dir, tokenizer, samples):
    with pytest.raises(ValueError, match=r"layer id 4 is outside \[0, 3\]"):
        _extract(token_shard, tmp_path / "h.zarr", tiny_model_dir, layer_ids=[0, 1, 4])
    bad = tmp_path / "bad.zarr"
    write_token_shard(
        bad, [(np.array([5, 49152], np.int32), np.ones(2, np.uint8))], ["x"], token_shard_attrs(tokenizer)
    )
    with pytest.raises(ValueError, match=r"bad.zarr: input_ids\[1\] \(sample 0\) = 49152"):
        _extract(bad, tmp_path / "h.zarr", tiny_model_dir)
    unprovenanced = tmp_path / "noprov.zarr"
    write_token_shard(unprovenanced, samples[:1], ["x"], {"split": "train", "shard": 0})
    with pytest.raises(ProvenanceError, match="tokenizer_hash"):
        _extract(unprovenanced, tmp_path / "h.zarr", tiny_model_dir)
    assert not (tmp_path / "h.zarr").exists()


# --------------------------------------------------------------------------- CUDA (skipped without it)
@pytest.mark.gpu
def test_cuda_fp8_matches_cpu_fp8(tmp_path, token_shard, tiny_model_dir):
    """fp8 encoded on the GPU (fp32 compute) equals fp8 encoded on the CPU within one e4m3 step."""
    _extract(token_shard, tmp_path / "cpu.zarr", tiny_model_dir, token_budget=64, storage="fp8_e4m3")
    _extract(
        token_shard, tmp_path / "gpu.zarr", tiny_model_dir, token_budget=64, storage="fp8_e4m3",
        device="cuda", dtype="float32", writer_threads=2,
    )  # fmt: skip
    cpu, gpu = HiddenStore(tmp_path / "cpu.zarr"), HiddenStore(tmp_path / "gpu.zarr")
    for s in range(cpu.num_samples):
        for a, b in zip(cpu.sample(s), gpu.sample(s), strict=True):
            assert float(((a - b).norm(dim=-1) / a.norm(dim=-1)).max()) < 0.07


@pytest.mark.gpu
@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_cuda_writer_process_writes_the_thread_writers_store(tmp_path, token_shard, tiny_model_dir, storage):
    """On CUDA the batches reach the writer process through page-locked shared memory: the same store."""
    kwargs = dict(device="cuda", dtype="float32", token_budget=64, storage=storage, writer_threads=2)
    _extract(token_shard, tmp_path / "t.zarr", tiny_model_dir, **kwargs)
    stats = _extract(token_shard, tmp_path / "p.zarr", tiny_model_dir, writer_process=True, **kwargs)
    assert stats["writer_process_batches"] == stats["batches"] > 1

    def files(store: str) -> dict[str, bytes]:
        root = tmp_path / store
        return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()}

    assert files("p.zarr") == files("t.zarr")


@pytest.mark.gpu
def test_cuda_path_matches_cpu_reference(tmp_path, token_shard, tiny_model_dir, reference):
    """Pinned staging, non-blocking copies and the writer pool on a real GPU, fp32 and bf16 compute."""
    for dtype, tol in (("float32", 8e-3), ("auto", 6e-2)):
        out = tmp_path / f"h-{dtype}.zarr"
        _extract(
            token_shard, out, tiny_model_dir, device="cuda", dtype=dtype, token_budget=64, writer_threads=2
        )
        store = HiddenStore(out)
        assert store.attrs["device"] == "cuda"
        assert store.attrs["compute_dtype"] == ("float32" if dtype == "float32" else "bfloat16")
        for s, (hidden_states, _) in enumerate(reference):
            aux, final = store.sample(s)
            want = torch.cat([hidden_states[hf_hidden_index(v)] for v in LAYER_IDS], dim=-1)
            torch.testing.assert_close(aux.float(), _bf16(want), rtol=tol, atol=tol)
            torch.testing.assert_close(final.float(), _bf16(hidden_states[-1]), rtol=tol, atol=tol)
