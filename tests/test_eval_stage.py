"""Evaluate stage: baseline drafters must share the trained drafter's provenance; the per-set
speculative decoding JSONs merge into the summary, and one made with another drafter or settings is
refused naming the file and the field (tiny random target, CPU)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from figkit import assert_figure_png

from eyas.config import EvaluateSettings
from eyas.evaluate.drafters import _load_baseline
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import read_config

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


# --------------------------------------------------------------------------- per-set jobs and the merge
SETTINGS = EvaluateSettings(num_prompts=2, max_new_tokens=4, num_draft_tokens=[2], device="cpu")


@pytest.fixture(scope="module")
def specdec_run(tmp_path_factory, tiny_model_dir):
    """A tiny drafter dir, held-out stores with its provenance, both prompt sets decoded by
    `run_specdec_set`: (root, drafter dir, {set: JSON path}, {set: returned dict}, stores)."""
    import numpy as np

    from eyas.core.provenance import sha256_array
    from eyas.evaluate.stage_specdec import run_specdec_set
    from eyas.store import bf16_to_uint16, hidden_store_writer, write_token_shard

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("specdec")
    torch.manual_seed(0)
    drafter = Eagle3Drafter(DrafterConfig.from_target_config(read_config(tiny_model_dir), 256, [0, 1, 2]))
    drafter.save_pretrained(root / "drafter", extra_config=PROVENANCE)

    gen = np.random.default_rng(0)
    samples = [(gen.integers(0, 256, n).astype(np.int32), np.r_[0, 0, np.ones(n - 2)].astype(np.uint8))
               for n in (7, 9)]  # fmt: skip
    write_token_shard(root / "tokens.zarr", samples, ["a", "b"], PROVENANCE)
    ids = np.concatenate([s for s, _ in samples])
    offsets = np.array([0, 7, 16], dtype=np.int64)
    attrs = {**PROVENANCE, "tokens_checksum": sha256_array(ids)}
    with hidden_store_writer(root / "hidden.zarr", offsets, 64, 3, attrs) as writer:
        for s in range(2):
            n = int(offsets[s + 1] - offsets[s])
            writer.write_sample(s, bf16_to_uint16(torch.randn(n, 192)), bf16_to_uint16(torch.randn(n, 64)))

    heldout = root / "eval.jsonl"
    heldout.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"h{i}",
                    "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}],
                    "tools": None,
                }
            )
            + "\n"
            for i, text in enumerate(["Name a colour.", "Count to three.", "Say hi."])
        )  # fmt: skip
    )
    humaneval = root / "humaneval.jsonl"
    humaneval.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def add(a, b):\n"}) + "\n")
    paths, results = {}, {}
    for name, path in (("heldout", heldout), ("humaneval", humaneval)):
        paths[name] = str(root / "specdec" / f"{name}.json")
        results[name] = run_specdec_set(
            set_name=name, set_path=str(path), drafter_dir=str(root / "drafter"),
            model_dir=str(tiny_model_dir), out_json=paths[name], settings=SETTINGS, threads=1,
        )  # fmt: skip
    return (
        root,
        str(root / "drafter"),
        paths,
        results,
        ([str(root / "tokens.zarr")], [str(root / "hidden.zarr")]),
    )


def merge(root, drafter_dir, paths, stores, model_dir, settings=SETTINGS):
    from eyas.evaluate.stage_merge import run_evaluation

    return run_evaluation(
        drafter_dir=drafter_dir, specdec_paths=paths, token_shards=stores[0], hidden_stores=stores[1],
        model_dir=str(model_dir), out_summary=str(root / "eval" / "summary.json"),
        out_plot=str(root / "eval" / "acceptance.png"), settings=settings, ttt_steps=2,
    )  # fmt: skip


def test_per_set_jsons_merge_into_the_summary(specdec_run, tiny_model_dir):
    from eyas.evaluate.summary import SPECDEC_FIELDS, SUMMARY_FORMAT

    root, drafter_dir, paths, results, stores = specdec_run
    for name, path in paths.items():
        on_disk = json.loads(Path(path).read_text())
        assert on_disk == results[name] and on_disk["set"] == name
        assert list(on_disk["reports"]) == ["trained", "untrained"]
        assert on_disk["reports"]["trained"]["greedy_equal"]["mismatch_count"] == 0
    assert results["heldout"]["meta"]["prompts"] == 2 and results["humaneval"]["meta"]["prompts"] == 1

    summary = merge(root, drafter_dir, paths, stores, tiny_model_dir)
    assert json.loads((root / "eval" / "summary.json").read_text()) == summary
    assert summary["format"] == SUMMARY_FORMAT and list(summary["sets"]) == ["heldout", "humaneval"]
    assert summary["meta"]["sets"] == {name: r["meta"] for name, r in results.items()}
    assert summary["meta"]["device"] == "cpu" and summary["meta"]["drafter_model_hash"] == "abc"
    for name, result in results.items():
        for drafter, report in result["reports"].items():
            assert summary["sets"][name][drafter] == {f: report[f] for f in SPECDEC_FIELDS}
    assert summary["headline"]["tau"] == results["heldout"]["reports"]["trained"]["tau"]
    assert summary["headline"]["greedy_equal"] is True
    assert summary["offline_by_drafter"]["trained"]["num_samples"] == 2
    assert_figure_png(root / "eval" / "acceptance.png", (10, 4))


def test_merge_refuses_a_set_made_with_another_drafter_or_settings(specdec_run, tiny_model_dir, tmp_path):
    root, _, paths, _, stores = specdec_run
    torch.manual_seed(1)  # same config and provenance, other weights: a retrained drafter
    other = Eagle3Drafter(DrafterConfig.from_target_config(read_config(tiny_model_dir), 256, [0, 1, 2]))
    other.save_pretrained(tmp_path / "retrained", extra_config=PROVENANCE)
    with pytest.raises(ValueError, match=r"heldout\.json: field 'identity\.drafter_sha256'"):
        merge(tmp_path, str(tmp_path / "retrained"), paths, stores, tiny_model_dir)
    with pytest.raises(ValueError, match=r"heldout\.json: field 'settings\.max_new_tokens' is 4.* 5"):
        merge(
            tmp_path,
            specdec_run[1],
            paths,
            stores,
            tiny_model_dir,
            dataclasses.replace(SETTINGS, max_new_tokens=5),
        )
    swapped = {"heldout": paths["humaneval"], "humaneval": paths["heldout"]}
    with pytest.raises(ValueError, match=r"humaneval\.json: field 'set' is 'humaneval', expected 'heldout'"):
        merge(tmp_path, specdec_run[1], swapped, stores, tiny_model_dir)
    assert not (tmp_path / "eval").exists()  # nothing written on refusal


def test_without_the_untrained_control_only_the_trained_is_decoded(specdec_run, tiny_model_dir, tmp_path):
    from eyas.evaluate.stage_specdec import run_specdec_set

    root, drafter_dir, paths, _, stores = specdec_run
    no_control = dataclasses.replace(SETTINGS, untrained_control=False)
    with pytest.raises(ValueError, match=r"heldout\.json: field 'identity\.untrained_seed'"):
        merge(tmp_path, drafter_dir, paths, stores, tiny_model_dir, no_control)  # made with the control
    alone = {"heldout": str(tmp_path / "specdec" / "heldout.json")}
    result = run_specdec_set(
        set_name="heldout", set_path=str(root / "eval.jsonl"), drafter_dir=drafter_dir,
        model_dir=str(tiny_model_dir), out_json=alone["heldout"], settings=no_control, threads=1,
    )  # fmt: skip
    assert list(result["reports"]) == ["trained"]
    summary = merge(tmp_path, drafter_dir, alone, stores, tiny_model_dir, no_control)
    assert summary["headline"]["tau_untrained"] is None and list(summary["offline_by_drafter"]) == ["trained"]
