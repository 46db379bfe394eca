"""eyas's SGLang export fed to the real sglang 0.5.23 `LlamaForCausalLMEagle3.load_weights` on CPU.

What this checks (issue 17): the model is built from the export's own config.json (as SGLang reads it,
through transformers' AutoConfig), every parameter is set to NaN, and the export's tensors go through
its real `load_weights` (which skips unknown names silently). Then:
- every parameter received a tensor: no NaN is left in any of them, except `model.embed_tokens.weight`,
  which SGLang's EAGLE-3 worker replaces with the target's (`set_embed`, called here with the target
  embedding, after which it is the target's) and the vocab-parallel padding rows SGLang adds;
- none was skipped: each export key is accounted for by where it lands, and the loaded values equal
  the export's (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`, `d2t` as `hot_token_id`);
  `t2d` is the one key SGLang ignores by design;
- the aux layer ids and draft vocab reach the model as SGLang reads them.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
from modelkit import tiny_drafter_config
from objects import load_into_nan
from sglang.srt.distributed import parallel_state
from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
from sglang.srt.server_args import ServerArgs
from transformers import AutoConfig

from eyas.export import export_sglang
from eyas.model.drafter import Eagle3Drafter

# SGLang pads vocab-parallel tables to a multiple of 64 rows: sizes that are not exercise the padding.
VOCAB, DRAFT_VOCAB = 100, 40


@pytest.fixture(scope="module")
def sglang_cpu_groups():
    """One-process gloo groups and a published ServerArgs: what sglang's layers read at construction
    (the steps of sglang's own single-process layer tests, sglang/test/layer_ut_utils.py in 0.5.23)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu"), role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    parallel_state.initialize_model_parallel(backend="gloo")
    yield
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    reset_context()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang_export")
    cfg = tiny_drafter_config(
        intermediate_size=80,
        rope_theta=1e5,
        max_position_embeddings=512,
        vocab_size=VOCAB,
        draft_vocab_size=DRAFT_VOCAB,
        aux_layer_ids=[1, 14, 26],
    )
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    target_ids = torch.randperm(VOCAB)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[target_ids] = True
    model.set_vocab(target_ids - torch.arange(DRAFT_VOCAB), t2d)
    model.save_pretrained(out / "drafter")
    export_sglang(out / "drafter", out / "export")
    return out / "export", model


@pytest.fixture(scope="module")
def loaded(sglang_cpu_groups, exported, monkeypatch_module):
    import sglang.srt.layers.rotary_embedding.base as rope_base
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    # RoPE picks its kernel at construction: the CPU path needs SGLANG_USE_CPU_ENGINE=1 read before
    # sglang's first import, which the other modules of this folder have already done; the flag it sets
    # is module state, patched here for construction only (load_weights does not use RoPE).
    monkeypatch_module.setattr(rope_base, "_is_cpu", True)
    export_dir, _ = exported
    return load_into_nan(LlamaForCausalLMEagle3, AutoConfig.from_pretrained(str(export_dir)), export_dir)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


# export key -> (sglang parameter, rows of it) ; q/k/v and gate/up are stacked in that order
def _landing(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, slice]]:
    q, k = tensors["layers.0.self_attn.q_proj.weight"], tensors["layers.0.self_attn.k_proj.weight"]
    gate = tensors["layers.0.mlp.gate_proj.weight"]
    nq, nk, ng = q.shape[0], k.shape[0], gate.shape[0]
    out = {}
    for key, t in tensors.items():
        if key in ("d2t", "t2d"):
            continue
        name, rows = f"model.{key}", slice(0, t.shape[0])
        if key == "lm_head.weight":
            name = key
        elif ".q_proj" in key:
            name = name.replace(".q_proj", ".qkv_proj")
        elif ".k_proj" in key:
            name, rows = name.replace(".k_proj", ".qkv_proj"), slice(nq, nq + nk)
        elif ".v_proj" in key:
            name, rows = name.replace(".v_proj", ".qkv_proj"), slice(nq + nk, nq + 2 * nk)
        elif ".gate_proj" in key:
            name = name.replace(".gate_proj", ".gate_up_proj")
        elif ".up_proj" in key:
            name, rows = name.replace(".up_proj", ".gate_up_proj"), slice(ng, 2 * ng)
        out[key] = (name, rows)
    return out


def test_config_as_sglang_reads_it(exported, loaded):
    export_dir, drafter = exported
    model, _ = loaded
    config = json.loads((export_dir / "config.json").read_text())
    assert model.config.draft_vocab_size == DRAFT_VOCAB and model.config.vocab_size == VOCAB
    assert model.model.num_aux_hidden_states == 3 and model.model.fc.in_features == 3 * 32
    assert model.model.input_norm is None and model.model.fc_norm is None  # no norm before fc
    assert model.load_lm_head_from_target is False and model.lm_head is not model.model.embed_tokens
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == drafter.config.aux_layer_ids
    assert len(model.model.layers) == 1


def test_every_parameter_receives_a_tensor(loaded):
    model, tensors = loaded
    landed = {name for name, _ in _landing(tensors).values()}
    for name, p in model.named_parameters():
        if name == "model.embed_tokens.weight":
            continue  # the target's, set by the EAGLE worker: test_target_embedding_is_shared
        assert name in landed, f"{name}: no export key loads it"
        rows = DRAFT_VOCAB if name == "lm_head.weight" else p.shape[0]  # past that: vocab padding
        assert not torch.isnan(p[:rows]).any(), f"{name} left (partly) at its initial value"


def test_no_export_key_is_skipped_and_values_equal_the_export(loaded):
    model, tensors = loaded
    params = dict(model.named_parameters())
    landing = _landing(tensors)
    assert set(landing) | {"d2t", "t2d"} == set(tensors)
    for key, (name, rows) in landing.items():
        got = params[name][rows]
        assert got.dtype == torch.bfloat16 == tensors[key].dtype, key
        assert torch.equal(got, tensors[key]), f"{key} -> {name}[{rows}] differs from the export"
    # d2t becomes the draft -> target id table; t2d is not read by SGLang
    assert torch.equal(model.get_hot_token_id(), tensors["d2t"] + torch.arange(DRAFT_VOCAB))


def test_target_embedding_is_shared(loaded):
    """SGLang's EAGLE-3 worker calls `set_embed(target embedding)` (speculative/eagle_worker_v2.py):
    the export carries none, the drafter drafts with the target's."""
    model, _ = loaded
    target_embed = torch.randn(VOCAB, 32, dtype=torch.bfloat16)
    model.set_embed(target_embed)
    assert model.model.embed_tokens.weight is target_embed


def test_an_unknown_key_would_be_skipped_silently(loaded):
    """Why eyas validates the exact key set at export: a misnamed tensor reaches no parameter and
    SGLang says nothing (the tests above would then see a NaN parameter)."""
    model, tensors = loaded
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.load_weights([("layers.0.self_attn.qproj.weight", tensors["layers.0.self_attn.q_proj.weight"])])
    for name, p in model.named_parameters():
        assert torch.equal(p.nan_to_num(), before[name].nan_to_num()), name  # NaN: padding, unset embed
