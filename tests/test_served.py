"""Served evaluation (SGLang backend), the parts that run without a GPU: SGLang outputs -> accept lengths,
acceptance by position and greedy equality; the served section of summary.json; the merge's checks.
`tests/data/served/outputs.json` holds engine outputs recorded on an H200 (`command`, `note` say how)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors.torch import save_file
from test_drafter import tiny_config  # tests/ is on sys.path (rootdir conftest, no package)

from eyas.config import EvaluateSettings
from eyas.core.acceptance import acceptance_by_position, counts_from_histograms
from eyas.evaluate.drafters import check_export
from eyas.evaluate.report import plot_tau, tau_table
from eyas.evaluate.served import (
    SERVED_FORMAT,
    aggregate,
    compare_to_plain,
    request_figures,
    specdec_view,
    tau_by_origin,
)
from eyas.evaluate.stage_served import read_served
from eyas.evaluate.summary import build_summary
from eyas.export import sglang_tensors
from eyas.model.drafter import Eagle3Drafter

RECORDED = Path(__file__).parent / "data" / "served"


def spec_output(ids, completion, verify, histogram):
    meta = {
        "completion_tokens": completion,
        "spec_verify_ct": verify,
        "spec_correct_drafts_histogram": histogram,
    }
    return {"output_ids": ids, "meta_info": meta}


def test_request_figures_read_sglang_meta_info_and_refuse_what_does_not_fit():
    figures = request_figures(spec_output([5, 6, 7, 8, 9], 5, 2, [0, 1, 1, 0]), k=3)
    assert figures == {"output_ids": [5, 6, 7, 8, 9], "completion": 5, "verify": 2, "histogram": [0, 1, 1, 0]}
    assert (
        request_figures({"output_ids": [1], "meta_info": {"completion_tokens": 1}}, k=None)["completion"] == 1
    )
    with pytest.raises(ValueError, match="not speculating"):
        request_figures({"output_ids": [1], "meta_info": {"completion_tokens": 1}}, k=3)
    with pytest.raises(ValueError, match="does not fit k=3 and 2 verify passes"):
        request_figures(spec_output([1], 5, 2, [0, 1, 0, 0]), k=3)  # 1 pass in the histogram, 2 counted
    with pytest.raises(ValueError, match="does not fit k=1"):
        request_figures(spec_output([1], 5, 2, [0, 1, 1]), k=1)  # 2 accepted with k=1
    with pytest.raises(ValueError, match="completion_tokens"):
        request_figures({"output_ids": [1], "meta_info": {}}, k=None)


def test_accept_lengths_in_both_definitions_and_by_position():
    # prompt 0: the prefill's token + 9 in 3 passes accepting 1, 2, 3 drafts (2 + 3 + 4 tokens);
    # prompt 1: the prefill's token + 3 in 3 passes accepting none.
    requests = [
        {"completion": 10, "verify": 3, "histogram": [0, 1, 1, 1]},
        {"completion": 4, "verify": 3, "histogram": [3, 0, 0, 0]},
    ]
    out = aggregate(requests, k=3)
    assert out["tau_sglang"] == pytest.approx(14 / 6)
    assert out["tau"] == pytest.approx(12 / 6)  # eyas: the prefill's token is not a pass's
    assert out["per_prompt_tau"] == [pytest.approx(3.0), pytest.approx(1.0)]
    assert out["per_prompt_completion"] == [10, 4] and out["per_prompt_verify"] == [3, 3]
    # passes by drafts accepted over both prompts: a=0: 3, a=1: 1, a=2: 1, a=3: 1 (6 passes)
    assert out["position_attempted"] == [6, 6, 6]
    assert out["position_reached"] == [6, 3, 2]
    assert out["position_accepted"] == [3, 2, 1]
    assert out["acceptance_by_position"] == [0.5, pytest.approx(1 / 3), pytest.approx(1 / 6)]
    assert out["conditional_acceptance_by_position"] == [0.5, pytest.approx(2 / 3), 0.5]
    assert acceptance_by_position(*counts_from_histograms([[0, 0]], 1))[
        "conditional_acceptance_by_position"
    ] == [None]


def test_greedy_equality_locates_each_mismatch_with_the_plain_margin():
    plain = [
        {"output_ids": [1, 2, 3], "top_logprobs": [[(-0.1, 1, None), (-3.0, 9, None)]] * 3},
        {
            "output_ids": [4, 5, 6],
            "top_logprobs": [[(-0.5, 4, None), (-2.0, 7, None)], [[-0.6, 5, None], [-0.61, 8, None]]],
        },
    ]
    spec = [{"output_ids": [1, 2, 3]}, {"output_ids": [4, 8, 6]}]
    got = compare_to_plain(spec, plain)
    assert got["prompts"] == 2 and got["equal"] == 1
    (miss,) = got["mismatches"]
    assert miss["prompt"] == 1 and miss["position"] == 1
    assert (miss["served_token"], miss["plain_token"]) == (8, 5)
    assert miss["plain_top2_margin"] == pytest.approx(0.01)
    shorter = compare_to_plain([{"output_ids": [1, 2]}], [{"output_ids": [1, 2, 3]}])
    assert shorter["mismatches"][0]["position"] == 2 and shorter["mismatches"][0]["served_token"] is None


def served_report(tau_passes: tuple[int, int], prompts=2, k=3, equal=2) -> dict:
    completion, verify = tau_passes
    report = aggregate(
        [{"completion": completion, "verify": verify, "histogram": [verify, 0, 0, 0][: k + 1]}] * prompts, k
    )
    return report | {
        "tau_batched": report["tau"],
        "max_new_tokens": 16,
        "tokens_per_s_bs1": 100.0,
        "tokens_per_s_batched": 400.0,
        "plain_tokens_per_s_bs1": 200.0,
        "speedup_bs1": 0.5,
        "speedup_batched": 0.8,
        "greedy_equal": {"prompts": prompts, "equal": equal, "mismatches": []},
        "greedy_equal_batched": {"prompts": prompts, "equal": equal, "mismatches": []},
    }


def served_result(ks=(3, 4)) -> dict:
    sets = {
        name: {
            d: {str(k): served_report((17, 16 if d == "untrained" else 8), k=k) for k in ks}
            for d in ("trained", "untrained")
        }
        for name in ("heldout", "humaneval")
    }
    return {
        "format": SERVED_FORMAT,
        "sglang_version": "0.5.17",
        "engine_args": {"tp_size": 1},
        "settings": {"num_prompts": 2, "max_new_tokens": 16, "num_draft_tokens": list(ks), "temperature": 0.0,
                     "seed": 0, "concurrency": 8},
        "identity": {"drafter_sha256": "abc"},
        "meta": {"heldout": {"prompts": 2}, "humaneval": {"prompts": 2}},
        "plain": {"heldout": {"tokens_per_s_bs1": 200.0, "tokens_per_s_batched": 500.0}},
        "sets": sets,
        "swap_check": None,
        "timings": {},
    }  # fmt: skip


OFFLINE = {
    "ttt_steps": 2, "accuracy": [0.5, 0.2], "conditional_accuracy": [0.5, 0.3], "simulated_tau": 1.6,
    "simulated_tau_by_k": [1.5, 1.6], "walked_tau_by_k": [1.4, 1.5], "count": [4, 4], "cond_count": [4, 2],
    "loss": [1.0, 2.0], "num_samples": 1, "num_tokens": 8,
}  # fmt: skip


def test_summary_from_served_figures_alone_and_beside_hf(tmp_path):
    served = served_result()
    by_origin = {"alpaca_zh_demo.json": {"prompts": 2, "tau": 2.0}}
    served["sets"]["heldout"]["trained"]["3"]["tau_by_origin"] = by_origin
    specdec = {
        name: {d: specdec_view(by_k["3"]) for d, by_k in drafters.items()}
        for name, drafters in served["sets"].items()
    }
    summary = build_summary(
        offline={"trained": OFFLINE, "untrained": OFFLINE}, specdec=specdec, meta={}, served=served
    )
    assert summary["headline"]["tau"] == pytest.approx(2.0)  # (17 - 1) / 8 per prompt
    assert summary["headline"]["tau_untrained"] == pytest.approx(1.0)
    assert summary["headline"]["served_tau_by_k"] == {"3": pytest.approx(2.0), "4": pytest.approx(2.0)}
    rows = summary["served"]["table"]
    assert len(rows) == 2 * 2 * 2  # sets x drafters x k
    assert {(r["set"], r["drafter"], r["k"]) for r in rows} >= {
        ("heldout", "trained", 4),
        ("humaneval", "untrained", 3),
    }
    row = next(r for r in rows if (r["set"], r["drafter"], r["k"]) == ("heldout", "trained", 3))
    assert row["tau_by_origin"] == by_origin  # tau by input file reaches the summary's served table
    assert summary["specdec"]["greedy_equal"] == {"checked": True, "mismatch_count": 0, "mismatches": []}
    assert summary["table"][0]["speedup"] == 0.5
    rows = tau_table(summary)  # HF and served rows side by side, each tagged
    assert {r["backend"] for r in rows} == {"hf", "sglang"} and len(rows) == 4 + 8
    served_only = tau_table(summary | {"meta": {"backend": "sglang"}})
    assert {r["backend"] for r in served_only} == {"sglang"}
    assert {r["k"] for r in served_only} == {3, 4} and served_only[0]["tokens_per_s_batched"] == 400.0
    assert {r["walked_tau"] for r in served_only} == {None}  # k = 3, 4: past the 2 TTT steps measured offline
    plot_tau(summary, tmp_path / "tau.png")
    assert (tmp_path / "tau.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_merge_refuses_a_served_result_of_other_settings_or_drafters(tmp_path):
    path = tmp_path / "served.json"
    path.write_text(json.dumps(served_result()))
    settings = EvaluateSettings(backend="sglang", num_prompts=2, max_new_tokens=16, num_draft_tokens=[3, 4])
    assert read_served(str(path), settings, {"drafter_sha256": "abc"})["sglang_version"] == "0.5.17"
    with pytest.raises(ValueError, match=r"served.json: field 'settings.num_draft_tokens' is \[3, 4\]"):
        read_served(str(path), replace(settings, num_draft_tokens=[3, 4, 5]), {"drafter_sha256": "abc"})
    with pytest.raises(ValueError, match="field 'settings.concurrency'"):
        read_served(str(path), replace(settings, concurrency=1), {"drafter_sha256": "abc"})
    with pytest.raises(ValueError, match="field 'identity.drafter_sha256'"):
        read_served(str(path), settings, {"drafter_sha256": "def"})


@pytest.mark.skipif(not (RECORDED / "outputs.json").exists(), reason="no recorded engine outputs")
def test_recorded_engine_outputs_give_the_recorded_figures():
    """Outputs of a real SGLang engine (plain and EAGLE-3 at each k) through the same functions."""
    recorded = json.loads((RECORDED / "outputs.json").read_text())
    plain = [request_figures(o, None) | {"top_logprobs": o["meta_info"].get("output_top_logprobs")}
             for o in recorded["plain"]]  # fmt: skip
    for k, outputs in recorded["spec"].items():
        figures = [request_figures(o, int(k)) for o in outputs]
        report = aggregate(figures, int(k))
        completion = sum(o["meta_info"]["completion_tokens"] for o in outputs)
        verify = sum(o["meta_info"]["spec_verify_ct"] for o in outputs)
        assert report["tau_sglang"] == pytest.approx(completion / verify)
        assert report["tau"] == pytest.approx((completion - len(outputs)) / verify)
        assert sum(report["position_attempted"][:1]) == verify
        mean_sglang = sum(
            o["meta_info"]["spec_accept_length"] * o["meta_info"]["spec_verify_ct"] for o in outputs
        )
        assert report["tau_sglang"] == pytest.approx(mean_sglang / verify)  # SGLang's own per-request figure
        equal = compare_to_plain(figures, plain)
        assert equal["equal"] + len(equal["mismatches"]) == len(outputs)


def test_a_broken_export_is_refused_before_serving_naming_file_and_key(tmp_path):
    config = tiny_config()
    export = tmp_path / "export"
    export.mkdir()
    tensors = sglang_tensors(Eagle3Drafter(config))
    save_file(tensors, str(export / "model.safetensors"))
    check_export(export, config)  # the exporter's own output passes
    tensors["midlayer.fc.weight"] = tensors.pop("fc.weight")
    save_file(tensors, str(export / "model.safetensors"))
    with pytest.raises(ValueError, match=r"export/model.safetensors: .*key 'fc.weight' missing"):
        check_export(export, config)
    (export / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights"):
        check_export(export, config)


def test_tau_by_origin_pools_each_inputs_prompts_as_the_set_is_pooled():
    requests = [
        {"completion": 10, "verify": 3, "histogram": []},  # 9 tokens after the prefill's in 3 passes
        {"completion": 4, "verify": 3, "histogram": []},  # 3 in 3
        {"completion": 7, "verify": 2, "histogram": []},  # 6 in 2
    ]
    report = aggregate(requests, k=3)
    by_origin = tau_by_origin(report, ["alpaca_zh_demo.json", "target.jsonl", "alpaca_zh_demo.json"])
    assert by_origin == {
        "alpaca_zh_demo.json": {"prompts": 2, "tau": pytest.approx(15 / 5)},
        "target.jsonl": {"prompts": 1, "tau": pytest.approx(1.0)},
    }
    assert sum(o["prompts"] for o in by_origin.values()) == report["prompts"]
    one_origin = tau_by_origin(report, ["x"] * 3)  # one input: the set's own tau
    assert one_origin["x"]["tau"] == pytest.approx(report["tau"])
    with pytest.raises(ValueError, match="2 prompt origins for 3 served prompts"):
        tau_by_origin(report, ["x", "y"])


class FakeEngine:
    """Stands in for `eyas.engine.sglang`'s engines: records what it was started with and asked to serve;
    a drafter accepts as many drafts a verify pass as its export dir's `accepts` file says."""

    def __init__(self, args: dict, log: list):
        self.draft = args.get("speculative_draft_model_path")
        self.k = args.get("speculative_num_steps")
        self.log, self.engine = log, sum(entry[0] == "start" for entry in log)
        log.append(("start", self.draft and Path(self.draft).name))

    def select(self, draft_dir, k):
        self.draft, self.k = draft_dir, k
        self.log.append(("select", Path(draft_dir).name, self.engine))

    def _output(self, prompt):
        n = 12
        if self.draft is None:
            return {"output_ids": list(range(n)), "meta_info": {"completion_tokens": n}}
        accepts = min(self.k, int((Path(self.draft) / "accepts").read_text()))
        verify = -(-(n - 1) // (accepts + 1))
        histogram = [0] * (self.k + 1)
        histogram[accepts] = verify
        meta = {"completion_tokens": n, "spec_verify_ct": verify, "spec_correct_drafts_histogram": histogram}
        return {"output_ids": list(range(n)), "meta_info": meta}

    def generate(self, input_ids, sampling_params, **_):
        if input_ids and isinstance(input_ids[0], list):
            return [self._output(p) for p in input_ids]
        return self._output(input_ids)

    def shutdown(self):
        self.log.append(("shutdown", self.draft and Path(self.draft).name))


def test_drafters_of_another_shape_are_served_in_an_engine_of_their_own(tmp_path, monkeypatch):
    import eyas.engine.sglang as sglang_engine
    from eyas.evaluate.served import serve_drafters

    widths = {"trained": 1536, "untrained": 1536, "wide": 6144, "lr4": 1536}
    accepts = {"trained": 2, "untrained": 0, "wide": 3, "lr4": 1}
    exports = {}
    for name, width in widths.items():
        export = tmp_path / name
        export.mkdir()
        config = {"intermediate_size": width, "eyas_provenance": {"name": name}}
        (export / "config.json").write_text(json.dumps(config))
        (export / "accepts").write_text(str(accepts[name]))
        exports[name] = str(export)
    log: list = []
    monkeypatch.setattr(sglang_engine, "start_engine", lambda args, **_: FakeEngine(args, log))
    served = serve_drafters(
        prompt_sets={"heldout": [[1, 2, 3], [4, 5]]},
        drafter_exports=exports,
        base_args={"model_path": "m"},
        ks=[3, 5],
        max_new_tokens=12,
        concurrency=4,
    )
    starts = [entry[1] for entry in log if entry[0] == "start"]
    assert starts == [None, "trained", "wide"]  # plain, then one EAGLE-3 engine per shape
    selected = {1: set(), 2: set()}  # the drafters each EAGLE-3 engine swapped to
    for entry in log:
        if entry[0] == "select":
            selected[entry[2]].add(entry[1])
    assert selected == {1: {"trained", "untrained", "lr4"}, 2: {"wide"}}
    by_drafter = served["sets"]["heldout"]
    for name, accepted in accepts.items():
        for k in ("3", "5"):
            verify = -(-11 // (min(int(k), accepted) + 1))
            assert by_drafter[name][k]["verify_passes"] == 2 * verify, (name, k)
    assert [check["drafter"] for check in served["swap_check"]] == ["trained", "wide"]
    assert len(served["timings"]["spec_start_seconds"]) == 2


def test_swap_groups_name_the_unreadable_export(tmp_path):
    from eyas.engine.sglang_draft_swap import swap_groups

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"a/config.json: cannot read"):
        swap_groups({"a": str(tmp_path / "a"), "b": str(tmp_path / "b")})


def test_a_study_of_trained_drafters_can_leave_the_untrained_control_out(tmp_path):
    from modelkit import tiny_drafter_config

    from eyas.core.provenance import DRAFTER_PROVENANCE
    from eyas.evaluate.drafters import load_drafters

    provenance = {field: f"{field}-value" for field in DRAFTER_PROVENANCE}
    Eagle3Drafter(tiny_drafter_config()).save_pretrained(tmp_path / "trained", extra_config=provenance)
    Eagle3Drafter(tiny_drafter_config()).save_pretrained(tmp_path / "other", extra_config=provenance)
    baselines = [{"name": "other", "path": str(tmp_path / "other")}]
    drafters, _, identity = load_drafters(
        str(tmp_path / "trained"), "no-model-needed", baselines, untrained_control=False
    )
    assert list(drafters) == ["trained", "other"]
    assert identity["untrained_seed"] is None
    assert set(identity["baselines_sha256"]) == {"other"}
