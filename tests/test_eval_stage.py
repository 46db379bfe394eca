"""Evaluate stage helpers: baseline drafters must share the trained drafter's provenance."""

from __future__ import annotations

import pytest

from eyas.evaluate.stage import _load_baseline
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.target import read_config

PROVENANCE = {
    "model_id": "tiny",
    "model_hash": "abc",
    "layer_ids": [0, 1, 2],
    "layer_id_convention": "drafter:output_of_layer",
    "tokenizer_hash": "t",
    "chat_template_hash": "c",
}


def test_baseline_provenance_is_checked(tmp_path, tiny_model_dir):
    drafter = Eagle3Drafter(DrafterConfig.from_target_config(read_config(tiny_model_dir), 256, [0, 1, 2]))
    drafter.save_pretrained(tmp_path / "same", extra_config=PROVENANCE)
    drafter.save_pretrained(tmp_path / "other", extra_config={**PROVENANCE, "model_hash": "zzz"})
    loaded = _load_baseline("same", str(tmp_path / "same"), PROVENANCE)
    assert loaded.config.draft_vocab_size == 256
    with pytest.raises(ValueError, match=r"baselines 'fp8'.*'model_hash' is 'zzz'.*'abc'"):
        _load_baseline("fp8", str(tmp_path / "other"), PROVENANCE)
