"""tools/compare_runs.py: which files of two results trees are identical, equal less timing, or differ."""

from __future__ import annotations

import json

from compare_runs import compare, main


def tree(root, summary: dict, weights: bytes, log: str):
    (root / "eval").mkdir(parents=True)
    (root / "train").mkdir()
    (root / "logs").mkdir()
    (root / "eval" / "summary.json").write_text(json.dumps(summary))
    (root / "train" / "model.safetensors").write_bytes(weights)
    (root / "logs" / "train.log").write_text(log)
    return root


def test_timing_fields_and_logs_do_not_count_but_data_does(tmp_path):
    a = tree(tmp_path / "a", {"tau": 1.5, "spec_tokens_per_s": 10.0, "train_seconds": 3}, b"w", "t=1")
    b = tree(tmp_path / "b", {"tau": 1.5, "spec_tokens_per_s": 12.0, "train_seconds": 4}, b"w", "t=2")
    out = compare(a, b)
    assert out["identical"] == ["train/model.safetensors"]
    assert out["equal_less_timing"] == ["eval/summary.json"]
    assert out["skipped"] == ["logs/train.log"] and out["differs"] == []
    assert main([str(a), str(b), "--out", str(tmp_path / "c.json")]) == 0

    (b / "train" / "model.safetensors").write_bytes(b"x")
    (b / "eval" / "summary.json").write_text(json.dumps({"tau": 1.6, "spec_tokens_per_s": 12.0}))
    (b / "eval" / "extra.png").write_bytes(b"p")
    out = compare(a, b)
    assert out["differs"] == ["eval/summary.json", "train/model.safetensors"]
    assert out["only_in_b"] == ["eval/extra.png"]
    assert main([str(a), str(b)]) == 1
