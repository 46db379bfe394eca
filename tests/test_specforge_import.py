"""`eyas import-specforge`: a small dump in SpecForge's offline format converts into eyas stores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from eyas.core.layer_ids import LAYER_ID_CONVENTION
from eyas.core.provenance import model_hash, sha256_array
from eyas.interop.cli import main
from eyas.store import HiddenStore, check_provenance, read_token_shard
from eyas.train.loader import check_pair

HIDDEN, TAPS = 64, 3
LAYER_IDS = [0, 1, 2]


def _sample(rng: torch.Generator, length: int, padded: int) -> dict:
    """One SpecForge sample: ids/mask [T] int64, states [1, T', .] bf16 with T' - T padding rows."""
    return {
        "input_ids": torch.randint(0, 49152, (length,), generator=rng),
        "loss_mask": (torch.rand(length, generator=rng) > 0.4).long(),
        "hidden_state": torch.randn(1, padded, HIDDEN, generator=rng).to(torch.bfloat16),
        "aux_hidden_state": torch.randn(1, padded, TAPS * HIDDEN, generator=rng).to(torch.bfloat16),
    }


@pytest.fixture
def dump(tmp_path):
    """7 good samples over two rows_ folders (some padded), plus 3 bad files."""
    rng = torch.Generator().manual_seed(0)
    root = tmp_path / "dump"
    good = {}
    shapes = [(5, 5), (300, 310), (17, 20), (1, 1), (64, 64), (9, 30), (40, 40)]  # (T, padded T')
    for index, (length, padded) in enumerate(shapes):
        folder = root / ("rows_0-5000" if index < 4 else "rows_5000-10000")
        folder.mkdir(parents=True, exist_ok=True)
        number = index if index < 4 else 5000 + index
        good[number] = _sample(rng, length, padded)
        torch.save(good[number], folder / f"data_{number}.ckpt")
    (root / "rows_0-5000" / "data_4.ckpt").write_bytes(b"not a torch file")
    wrong_width = _sample(rng, 4, 4)
    wrong_width["hidden_state"] = torch.zeros(1, 4, HIDDEN + 1, dtype=torch.bfloat16)
    torch.save(wrong_width, root / "rows_0-5000" / "data_5.ckpt")
    no_aux = _sample(rng, 4, 4)
    del no_aux["aux_hidden_state"]
    torch.save(no_aux, root / "rows_0-5000" / "data_6.ckpt")
    return root, good


def test_import_round_trip_counts_and_provenance(tmp_path, dump, tiny_model_dir, capsys):
    root, good = dump
    out = tmp_path / "out"
    code = main([
        "import-specforge", str(root), str(out), "--model", str(tiny_model_dir), "--samples-per-shard", "4",
        "--layer-ids", "0,1,2", "--model-id", "tiny",
    ])  # fmt: skip
    assert code == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["read"] == 10 and stats["kept"] == 7 and stats["rejected"] == 3
    assert stats["read"] == stats["kept"] + stats["rejected"]
    assert stats["shards"] == 2 and stats["padding_rows_dropped"] == 10 + 3 + 21
    rejects = [json.loads(line) for line in (out / "import/train/rejects.jsonl").read_text().splitlines()]
    reasons = {r["source"].rsplit("/", 1)[1]: r["detail"] for r in rejects}
    assert set(reasons) == {"data_4.ckpt", "data_5.ckpt", "data_6.ckpt"}
    assert "hidden_state has shape [1, 4, 65]" in reasons["data_5.ckpt"]
    assert "missing field 'aux_hidden_state'" in reasons["data_6.ckpt"]

    numbers = sorted(good)
    seen = 0
    for shard in range(2):
        tokens = read_token_shard(out / f"tokens/train/shard-{shard:05d}.zarr")
        store = HiddenStore(out / f"hidden/train/shard-{shard:05d}.zarr")
        check_pair(tokens, store, "tokens", "hidden", {"model_id": "tiny", "layer_ids": LAYER_IDS})
        check_provenance(
            store.attrs,
            {"model_hash": model_hash(tiny_model_dir), "layer_id_convention": LAYER_ID_CONVENTION},
            "hidden",
        )
        assert store.attrs["tokens_checksum"] == sha256_array(tokens.input_ids)
        for s in range(tokens.num_samples):
            source = good[numbers[seen]]
            length = len(source["input_ids"])
            ids, mask = tokens.sample(s)
            assert np.array_equal(ids, source["input_ids"].numpy())
            assert np.array_equal(mask, source["loss_mask"].numpy())
            aux, final = store.sample(s)  # padding rows dropped, the rest bit for bit
            want_aux = source["aux_hidden_state"][0, :length].view(torch.uint16)
            want_final = source["hidden_state"][0, :length].view(torch.uint16)
            assert torch.equal(aux.view(torch.uint16), want_aux)
            assert torch.equal(final.view(torch.uint16), want_final)
            seen += 1
    assert seen == 7


def test_import_refuses_an_empty_dump(tmp_path, tiny_model_dir):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no SpecForge data_"):
        main([
            "import-specforge", str(tmp_path / "empty"), str(tmp_path / "o"), "--model", str(tiny_model_dir),
            "--layer-ids", "0,1,2",
        ])  # fmt: skip
