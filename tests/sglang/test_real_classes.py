"""The sglang surface eyas's SGLang backend relies on, checked on the real installed classes (CPU).

If an sglang release renames or moves one of these, this file fails first and names what moved.
Also checks that the CPU recipe in objects.py builds real objects without any runtime context.
"""

import dataclasses
import inspect
import json

import pytest

# The one skip line of this folder in an environment without sglang (see conftest.py).
pytest.importorskip(
    "sglang.srt", reason="no sglang here: tests/sglang/ runs in .venv-sglang (make test-sglang)"
)

import torch  # noqa: E402
from modelkit import tiny_llama_config_json  # noqa: E402
from objects import decode_batch, extend_batch, logits_output, packed_states, runner_output  # noqa: E402
from sglang.srt.entrypoints.engine import Engine  # noqa: E402
from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.managers import scheduler  # noqa: E402
from sglang.srt.model_executor import model_runner  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import (  # noqa: E402
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerOutput  # noqa: E402
from sglang.srt.model_executor.model_runner_components import spec_aux_hidden_state  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_engine_scheduler_entry_point_is_a_replaceable_staticmethod():
    # A subclass replaces it with its own function, which the spawned scheduler process runs.
    assert isinstance(inspect.getattr_static(Engine, "run_scheduler_process_func"), staticmethod)
    assert Engine.run_scheduler_process_func is scheduler.run_scheduler_process
    params = list(inspect.signature(scheduler.run_scheduler_process).parameters)
    assert params[:3] == ["server_args", "port_args", "gpu_id"]


def test_model_runner_forward_takes_the_forward_batch_and_returns_model_runner_output():
    sig = inspect.signature(ModelRunner.forward)
    assert list(sig.parameters)[:2] == ["self", "forward_batch"]
    assert sig.return_annotation in (ModelRunnerOutput, "ModelRunnerOutput")
    assert {"logits_output", "can_run_graph"} <= field_names(ModelRunnerOutput)


def test_forward_batch_has_the_fields_the_hook_slices_by():
    needed = {"rids", "extend_prefix_lens_cpu", "extend_seq_lens_cpu", "forward_mode", "capture_hidden_mode"}
    assert needed <= field_names(ForwardBatch)
    assert ForwardMode.EXTEND.is_extend() and not ForwardMode.DECODE.is_extend()
    assert CaptureHiddenMode.FULL.is_full() and CaptureHiddenMode.FULL > CaptureHiddenMode.LAST


def test_logits_output_carries_aux_and_post_norm_final_states():
    assert {"hidden_states", "last_hidden_states", "next_token_logits"} <= field_names(LogitsProcessorOutput)


def test_capture_switches_exist():
    # 0.5.22+: the built-in capture-only mode; model_runner calls the resolver by its own imported name.
    assert {"enable_return_aux_hidden_states", "return_aux_hidden_state_layer_ids"} <= set(
        ServerArgs.__struct_fields__  # a msgspec.Struct in 0.5.23, no longer a dataclass
    )
    resolve = spec_aux_hidden_state.resolve_spec_aux_hidden_state_config
    assert model_runner.resolve_spec_aux_hidden_state_config is resolve
    assert list(inspect.signature(resolve).parameters) == [
        "server_args",
        "model_config",
        "spec_algorithm",
        "is_draft_worker",
    ]
    config = spec_aux_hidden_state.SpecAuxHiddenStateConfig()
    assert config.eagle_use_aux_hidden_state is False and config.eagle_aux_hidden_state_layer_ids is None


def test_hook_registry_is_importable():
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    assert {"BEFORE", "AFTER", "AROUND"} <= set(HookType.__members__)
    assert callable(HookRegistry.register)


def test_recipe_builds_a_chunked_extend_batch_and_its_outputs_with_no_runtime_context():
    k, h = 3, 8
    extend_lens = [5, 3, 4]
    fb = extend_batch(["a", "b", "c"], prefix_lens=[0, 6, 0], extend_lens=extend_lens)  # "b": a later chunk
    assert fb.forward_mode.is_extend() and fb.capture_hidden_mode.is_full()
    assert fb.input_ids.shape == (12,) and fb.seq_lens.tolist() == [5, 9, 4]
    assert fb.positions[5:8].tolist() == [6, 7, 8]  # "b" continues after its 6-token prefix

    aux, last = packed_states(extend_lens, k, h)
    out = runner_output(logits_output(aux, last, batch_size=fb.batch_size))
    assert out.logits_output.hidden_states.shape == (12, k * h)
    assert out.logits_output.last_hidden_states.shape == (12, h)
    assert out.can_run_graph is False
    # Row t of the packed batch is recognisable: the rows of "b" are 5..7.
    assert out.logits_output.hidden_states[5:8, 0].tolist() == [5000.0, 6000.0, 7000.0]

    dec = decode_batch(["a", "b"], seq_lens=[6, 10])
    assert not dec.forward_mode.is_extend() and dec.capture_hidden_mode.is_full()
    assert dec.extend_seq_lens_cpu is None and dec.extend_prefix_lens_cpu is None
    assert torch.equal(dec.positions, torch.tensor([5, 9]))


def test_capture_only_engine_args_resolve_to_full_capture_and_no_speculation(tmp_path):
    """The kwargs an eyas caller gives Engine(**kwargs) on 0.5.22+ (Engine builds ServerArgs from them):
    the EAGLE3 name only picks the capture convention, is reset to None (no draft, prefill-only requests
    stay prefill-only), and every forward batch is captured in full without per-request flags."""
    from sglang.srt.model_executor.forward_batch_info import get_server_return_hidden_states_mode
    from sglang.srt.runtime_context import get_exec, get_spec, publish, reset_context

    (tmp_path / "config.json").write_text(json.dumps(tiny_llama_config_json()))
    args = ServerArgs(
        model_path=str(tmp_path),
        device="cpu",
        enable_return_aux_hidden_states=True,
        speculative_algorithm="EAGLE3",
        return_aux_hidden_state_layer_ids=[0, 1, 2],
        disable_radix_cache=True,
    )
    args.resolve_once()
    resolved = args.resolved_dict()
    assert resolved["speculative_algorithm"] is None
    assert resolved["aux_hidden_state_capture"] == "eagle3"
    assert resolved["return_hidden_states_mode"] == "full"
    try:
        publish(args, role="scheduler")  # what the scheduler process does first
        assert get_spec().speculative_algorithm is None
        assert get_exec().features.return_aux_hidden_state_layer_ids == [0, 1, 2]
        assert get_server_return_hidden_states_mode() == CaptureHiddenMode.FULL
    finally:
        reset_context()


def test_user_engine_args_are_checked_against_the_real_server_args():
    """`sglang.engine_args` keys are ServerArgs fields of this release, or refused by name; every
    arg eyas sets itself is a field too (a rename upstream would show here, not in a GPU job)."""
    from eyas.config import SglangSettings
    from eyas.engine.sglang_args import server_arg_names, user_engine_args
    from eyas.extract.sglang_backend import OWNED_ARGS, engine_args

    known = server_arg_names()
    assert user_engine_args({"ep_size": 2, "enable_dp_attention": True}, known) == {
        "ep_size": 2,
        "enable_dp_attention": True,
    }
    with pytest.raises(ValueError, match="engine_args.ep_sise: not a ServerArgs field"):
        user_engine_args({"ep_sise": 2}, known)
    settings = SglangSettings(tp_size=1, mem_fraction_static=0.8, chunked_prefill_size=512)
    for route in ("builtin", "scheduler"):
        assert set(engine_args(route, [1], settings, "/m", "bfloat16", False, known)) <= known, route
    assert OWNED_ARGS <= known
