"""The served-evaluation and regeneration engines on the real sglang classes (CPU, no engine started):
their arguments are ServerArgs that SGLang accepts, and the drafter swap routes a draft directory to
the draft runners only, through the real scheduler weight-updater and its real request/reply types."""

import json
from types import SimpleNamespace

import pytest
import torch
from modelkit import tiny_llama_config_json
from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput
from sglang.srt.managers.scheduler_components import weight_updater
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

from eyas.config import SglangSettings
from eyas.engine.sglang_args import (
    SERVED_OWNED_ARGS,
    base_engine_args,
    generation_engine_args,
    plain_engine_args,
    server_arg_names,
    spec_engine_args,
    user_engine_args,
)
from eyas.engine.sglang_draft_swap import STEPS_PREFIX, install_draft_swap, pin_draft_steps

TARGET = tiny_llama_config_json()


def model_dir(path, config):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def dirs(tmp_path):
    target = model_dir(tmp_path / "target", TARGET)
    draft = model_dir(
        tmp_path / "draft",
        TARGET
        | {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "draft_vocab_size": 64},
    )
    return target, draft


def test_every_arg_eyas_sets_is_a_server_args_field(tmp_path):
    known = server_arg_names()
    assert SERVED_OWNED_ARGS <= known
    base = base_engine_args(SglangSettings(attention_backend="triton"), "/m", "bfloat16", False)
    for args in (
        spec_engine_args(base, "/d", [3], 8, tmp_path),
        spec_engine_args(base, "/d", [3, 5], 8, tmp_path),
        plain_engine_args(base, 8),
        generation_engine_args(base, 1),
    ):
        assert set(args) <= known, set(args) - known
    with pytest.raises(ValueError, match="engine_args.speculative_num_steps: set by eyas"):
        user_engine_args({"speculative_num_steps": 2}, known, SERVED_OWNED_ARGS)


@pytest.mark.parametrize("ks", [[3], [5, 3, 4]])
def test_eagle3_chain_args_resolve_as_sglang_resolves_them(dirs, ks, tmp_path):
    """ServerArgs built from the served engine's kwargs and resolved as the engine does before it starts
    any process: EAGLE-3, a chain of k drafts (top-k 1, k + 1 tokens a verify pass), starting at the
    longest; with several k, SGLang's adaptive mode with the k list as its candidates."""
    target, draft = dirs
    base = base_engine_args(SglangSettings(), target, "bfloat16", False)
    args = ServerArgs(**spec_engine_args(base, draft, ks, 8, tmp_path), device="cpu")
    args.resolve_once()
    resolved = args.resolved_dict()
    assert resolved["speculative_algorithm"] == "EAGLE3"
    assert resolved["speculative_num_steps"] == max(ks)  # the longest chain first: buffers fit every k
    assert resolved["speculative_eagle_topk"] == 1
    assert resolved["speculative_num_draft_tokens"] == max(ks) + 1
    assert resolved["speculative_draft_model_path"] == str(draft)
    assert resolved["max_running_requests"] == 8 and resolved["disable_radix_cache"] is True
    assert resolved["speculative_adaptive"] is (len(ks) > 1)
    if len(ks) > 1:  # the policy SGLang reads: every k a candidate, adaptation never starting
        policy = json.loads(open(resolved["speculative_adaptive_config"]).read())
        assert policy["1"]["candidate_steps"] == sorted(ks) and policy["1"]["warmup_batches"] > 10**12


class Worker:
    """The AdaptiveSpecWorker protocol SGLang's controller drives: it records the state applied."""

    def __init__(self, steps):
        self.speculative_num_steps, self.applied = steps, []

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ):
        return SimpleNamespace(
            speculative_num_steps=speculative_num_steps, tokens=speculative_num_draft_tokens
        )

    def apply_runtime_state(self, state):
        self.speculative_num_steps = state.speculative_num_steps
        self.applied.append((state.speculative_num_steps, state.tokens))


def test_the_real_adaptive_controller_is_pinned_to_each_k_and_stays_there(tmp_path):
    base = base_engine_args(SglangSettings(), "/m", "bfloat16", False)
    args = spec_engine_args(base, "/d", [4, 3, 5], 8, tmp_path)
    worker = Worker(steps=args["speculative_num_steps"])
    # built as sglang 0.5.23's EAGLEWorkerV2 builds it (0.5.17 passes the config path instead)
    policy = AdaptiveSpeculativeParams(
        initial_steps=worker.speculative_num_steps, cfg_path=args["speculative_adaptive_config"]
    )
    controller = AdaptiveController(worker, policy)
    controller.init_states(cuda_graph_bs=[1, 2, 4, 8])
    assert controller.candidate_steps == [3, 4, 5] and worker.speculative_num_steps == 5  # the longest first
    worker.adaptive_controller = controller
    for k in (5, 3):
        pin_draft_steps(worker, k)
        assert worker.applied[-1] == (k, k + 1)
        for batch in (1, 3, 8):  # SGLang asks before every decode round, per batch size
            controller.activate_step_by_batch(batch)
            controller.on_verify_complete([k] * batch, batch_size=batch)  # all accepted: would step up
        assert worker.speculative_num_steps == k
    with pytest.raises(ValueError, match="k=6 is not one of the engine's steps"):
        pin_draft_steps(worker, 6)
    single = SimpleNamespace(speculative_num_steps=3)
    pin_draft_steps(single, 3)
    with pytest.raises(ValueError, match="drafts 3 tokens only, not 4"):
        pin_draft_steps(single, 4)


def test_plain_and_generation_args_resolve_without_speculation(dirs):
    target, _ = dirs
    base = base_engine_args(SglangSettings(), target, "bfloat16", False)
    for kwargs in (plain_engine_args(base, 4), generation_engine_args(base, 7)):
        args = ServerArgs(**kwargs, device="cpu")
        args.resolve_once()
        assert args.resolved_dict()["speculative_algorithm"] is None


class Updater:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def update_weights_from_disk(self, path, load_format, **kwargs):
        self.calls.append((self.name, path))
        return True, "ok"


def test_draft_swap_reaches_the_draft_runners_only(dirs, monkeypatch):
    target, draft = dirs
    calls = []
    draft_model = SimpleNamespace(hot_token_id=torch.arange(4) + 10)
    draft_runner = SimpleNamespace(weight_updater=Updater("draft", calls), model=draft_model)
    inner = SimpleNamespace(draft_runners=[draft_runner], hot_token_id=torch.arange(4))
    spec_worker = SimpleNamespace(
        draft_worker=inner,
        weight_update_runners=lambda: [("draft", runner) for runner in inner.draft_runners],
    )
    target_runner = SimpleNamespace(weight_updater=Updater("target", calls))
    tp_worker = SimpleNamespace(weight_update_runners=lambda: [("target", target_runner)])
    monkeypatch.setattr(weight_updater.SchedulerWeightUpdaterManager, "__post_init__", lambda self: None)
    monkeypatch.setattr(
        weight_updater.SchedulerWeightUpdaterManager,
        "update_weights_from_disk",
        weight_updater.SchedulerWeightUpdaterManager.update_weights_from_disk,
    )  # restored after the test: install_draft_swap replaces it on the class
    flushed = []
    manager = weight_updater.SchedulerWeightUpdaterManager(
        tp_worker=tp_worker,
        draft_worker=spec_worker,
        memory_saver_adapter=None,
        flush_cache=lambda **kw: flushed.append(kw) or True,
        is_fully_idle=lambda: True,
        scheduler=SimpleNamespace(record_weight_version_change=lambda **kw: None),
    )
    install_draft_swap()
    install_draft_swap()  # idempotent
    out = manager.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path=str(draft)))
    assert isinstance(out, UpdateWeightFromDiskReqOutput) and out.success, out.message
    assert calls == [("draft", str(draft))]
    assert torch.equal(inner.hot_token_id, torch.arange(4) + 10)  # refreshed in place
    assert flushed
    calls.clear()
    out = manager.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path=str(target)))
    assert out.success and calls[0] == ("target", str(target))  # a target path: SGLang's own path
    draft_model.hot_token_id = torch.arange(5)
    out = manager.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path=str(draft)))
    assert not out.success and "draft vocabulary of 4 tokens cannot become 5" in out.message
    spec_worker.speculative_num_steps = 3  # no adaptive controller: the engine serves one k
    calls.clear()
    request = UpdateWeightFromDiskReqInput(model_path=str(target), weight_version=f"{STEPS_PREFIX}4")
    out = manager.update_weights_from_disk(request)
    assert not out.success and "drafts 3 tokens only, not 4" in out.message and calls == []
