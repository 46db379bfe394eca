"""The served-evaluation and regeneration engines on the real sglang classes (CPU, no engine started):
their arguments are ServerArgs that SGLang accepts, and the drafter swap routes a draft directory to
the draft runners only, through the real scheduler weight-updater and its real request/reply types."""

import json
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput
from sglang.srt.managers.scheduler_components import weight_updater
from sglang.srt.server_args import ServerArgs

from eyas.config import SglangSettings
from eyas.sglang_engine import (
    SERVED_OWNED_ARGS,
    base_engine_args,
    generation_engine_args,
    install_draft_swap,
    plain_engine_args,
    server_arg_names,
    spec_engine_args,
    user_engine_args,
)

TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}


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


def test_every_arg_eyas_sets_is_a_server_args_field():
    known = server_arg_names()
    assert SERVED_OWNED_ARGS <= known
    base = base_engine_args(SglangSettings(attention_backend="triton"), "/m", "bfloat16", False)
    for args in (
        spec_engine_args(base, "/d", 3, 8),
        plain_engine_args(base, 8),
        generation_engine_args(base, 1),
    ):
        assert set(args) <= known, set(args) - known
    with pytest.raises(ValueError, match="engine_args.speculative_num_steps: set by eyas"):
        user_engine_args({"speculative_num_steps": 2}, known, SERVED_OWNED_ARGS)


@pytest.mark.parametrize("k", [3, 5])
def test_eagle3_chain_args_resolve_as_sglang_resolves_them(dirs, k):
    """ServerArgs built from the served engine's kwargs and resolved as the engine does before it starts
    any process: EAGLE-3, a chain of k drafts (top-k 1, k + 1 tokens a verify pass)."""
    target, draft = dirs
    base = base_engine_args(SglangSettings(), target, "bfloat16", False)
    args = ServerArgs(**spec_engine_args(base, draft, k, 8), device="cpu")
    args.resolve_once()
    resolved = args.resolved_dict()
    assert resolved["speculative_algorithm"] == "EAGLE3"
    assert resolved["speculative_num_steps"] == k
    assert resolved["speculative_eagle_topk"] == 1
    assert resolved["speculative_num_draft_tokens"] == k + 1
    assert resolved["speculative_draft_model_path"] == str(draft)
    assert resolved["max_running_requests"] == 8 and resolved["disable_radix_cache"] is True


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
