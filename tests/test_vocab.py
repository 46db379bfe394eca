"""Draft vocab: frequency selection over masked tokens, fill rules, mapping and file round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eyas.data.vocab import build_draft_vocab, load_draft_vocab, save_draft_vocab
from eyas.store import write_token_shard


def shard(path, samples, tokenizer_hash="tok"):
    write_token_shard(
        path,
        [(np.array(ids, np.int32), np.array(mask, np.uint8)) for ids, mask in samples],
        [f"s{i}" for i in range(len(samples))],
        {"tokenizer_hash": tokenizer_hash},
    )
    return str(path)


def test_most_frequent_masked_tokens_selected(tmp_path):
    # masked counts: 7 -> 3, 5 -> 2, 9 -> 2, 3 -> 1; 1 appears only unmasked (4 times).
    a = shard(tmp_path / "a.zarr", [([1, 7, 7, 5, 1], [0, 1, 1, 1, 0]), ([9, 9, 1], [1, 1, 0])])
    b = shard(tmp_path / "b.zarr", [([7, 3, 5, 1], [1, 1, 1, 0])])
    d2t, t2d, stats = build_draft_vocab([a, b], vocab_size=12, draft_vocab_size=3)
    target = torch.arange(3) + d2t
    assert target.tolist() == [5, 7, 9]  # 7 (3), then 5 and 9 tie at 2; sorted ascending
    assert int(t2d.sum()) == 3 and bool(t2d[target].all())
    assert stats["masked_tokens"] == 8 and stats["distinct"] == 4
    assert stats["coverage"] == pytest.approx(7 / 8)
    assert stats["filled_from_unmasked"] == 0


def test_tie_goes_to_smaller_id(tmp_path):
    a = shard(tmp_path / "a.zarr", [([4, 2, 8, 6], [1, 1, 1, 1])])
    d2t, _, _ = build_draft_vocab([a], vocab_size=10, draft_vocab_size=2)
    assert (torch.arange(2) + d2t).tolist() == [2, 4]


def test_fill_with_unmasked_then_lowest_ids(tmp_path):
    a = shard(tmp_path / "a.zarr", [([6, 6, 3, 8, 8, 8], [1, 0, 0, 0, 0, 0])])
    d2t, t2d, stats = build_draft_vocab([a], vocab_size=10, draft_vocab_size=5)
    # 6 masked; then unmasked 8 (3x), 3 (1x); 6 already in; then lowest ids 0, 1.
    assert (torch.arange(5) + d2t).tolist() == [0, 1, 3, 6, 8]
    assert stats["filled_from_unmasked"] == 2 and stats["filled_lowest_ids"] == 2
    assert stats["distinct"] == 1


def test_round_trip_and_validation(tmp_path):
    a = shard(tmp_path / "a.zarr", [([1, 2, 3, 3], [1, 1, 1, 1])])
    d2t, t2d, stats = build_draft_vocab([a], vocab_size=8, draft_vocab_size=2)
    save_draft_vocab(tmp_path / "v.safetensors", d2t, t2d, stats, tokenizer_hash="tok")
    d2t2, t2d2, meta = load_draft_vocab(tmp_path / "v.safetensors")
    assert torch.equal(d2t, d2t2) and torch.equal(t2d, t2d2)
    assert meta["tokenizer_hash"] == "tok" and meta["draft_vocab_size"] == 2 and meta["masked_tokens"] == 4
    bad = t2d.clone()
    bad[7] = True
    with pytest.raises(ValueError, match="t2d"):
        save_draft_vocab(tmp_path / "w.safetensors", d2t, bad, stats, tokenizer_hash="tok")


def test_refuses_out_of_range_ids_and_mixed_tokenizers(tmp_path):
    a = shard(tmp_path / "a.zarr", [([1, 20], [1, 1])])
    with pytest.raises(ValueError, match=r"a\.zarr.*outside vocab"):
        build_draft_vocab([a], vocab_size=8, draft_vocab_size=2)
    b = shard(tmp_path / "b.zarr", [([1, 2], [1, 1])], tokenizer_hash="x")
    c = shard(tmp_path / "c.zarr", [([1, 2], [1, 1])], tokenizer_hash="y")
    with pytest.raises(ValueError, match="tokenizer_hash"):
        build_draft_vocab([b, c], vocab_size=8, draft_vocab_size=2)


def test_the_vocab_file_is_the_same_bytes_in_every_process(tmp_path):
    """The draft vocab's file hash is provenance (`draft_vocab_hash`): saving the same vocab in two
    processes gives the same bytes, whatever order safetensors' metadata map has there."""
    import subprocess
    import sys

    code = (
        "import sys, torch; from eyas.data.vocab import save_draft_vocab;"
        "t2d = torch.zeros(50, dtype=torch.bool); t2d[[3, 7, 9]] = True;"
        "d2t = torch.tensor([3, 7, 9]) - torch.arange(3);"
        "save_draft_vocab(sys.argv[1], d2t, t2d, {'masked_tokens': 12, 'coverage': 0.5}, 'tok')"
    )
    outs = [tmp_path / f"v{i}.safetensors" for i in range(4)]
    for out in outs:
        subprocess.run([sys.executable, "-c", code, str(out)], check=True)
    assert len({out.read_bytes() for out in outs}) == 1
    d2t, t2d, meta = load_draft_vocab(outs[0])
    assert d2t.tolist() == [3, 6, 7] and t2d.sum() == 3 and meta["masked_tokens"] == 12
