"""eyas's speculators export read by vLLM 0.33.0's own config code (CPU, offline).

vLLM's engine does not run on CPU (it pins a CUDA torch 2.14.0), but the code that reads a speculators
directory is plain Python and imports here (installed with --no-deps, install_env.sh):
- `get_config(<export>)`: the draft model config vLLM builds (SpeculatorsConfig, transformers_utils/
  configs/speculators/): architecture, every Eagle-3 flag (a missing `norm_before_residual` would read
  as true), the aux ids, vocab sizes and layer shape;
- `SpeculatorsConfig.extract_vllm_speculative_config`: method and k;
- `maybe_override_with_speculators` (what `vllm serve <dir>` runs first): the target it takes from the
  verifier. 0.33.0 refuses a local verifier there, so the default export (a local dir) is served as
  `vllm serve <model dir> --speculative-config {...}` (README), and one naming a Hub id serves alone.
The weight-name mapping of its Eagle-3 model class (`llama_eagle3.py`, which imports the engine) is
checked against a table in tests/test_export.py.
"""

import json

import pytest

pytest.importorskip(
    "vllm.transformers_utils.config",
    reason="no vLLM config code here: tests/speculators/ runs in .venv-speculators (make test-speculators)",
)

from vllm.transformers_utils.config import get_config, maybe_override_with_speculators  # noqa: E402
from vllm.transformers_utils.configs.speculators import SpeculatorsConfig  # noqa: E402

from eyas.core.layer_ids import vllm_layer_ids  # noqa: E402
from eyas.export import export_speculators  # noqa: E402

HUB_ID = "eyas-test/tiny-target"  # well-formed, not a local path: accepted unchecked at export


@pytest.fixture(scope="module")
def hub_export(tiny_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "export"
    steps = tiny_export["steps"]
    export_speculators(tiny_export["drafter"], out, HUB_ID, ["LlamaForCausalLM"], speculative_tokens=steps)
    return out, steps


def test_vllm_builds_the_draft_config_eyas_means(tiny_export):
    model = tiny_export["model"]
    c = get_config(str(tiny_export["export"]), trust_remote_code=False)
    assert isinstance(c, SpeculatorsConfig) and c.architectures == ["Eagle3LlamaForCausalLM"]
    assert c.norm_before_residual is False  # eyas's layer (un-normed residual)
    assert c.norm_before_fc is False and c.fc_norm is False and c.norm_output is False
    assert c.eagle_aux_hidden_state_layer_ids == vllm_layer_ids(tiny_export["aux_ids"]) == [1, 2, 3]
    assert c.draft_vocab_size == tiny_export["draft_vocab"] and c.vocab_size == model.config.vocab_size
    assert c.hidden_size == c.target_hidden_size == model.config.hidden_size
    assert c.num_hidden_layers == 1 and c.head_dim == model.config.head_dim
    assert c.num_attention_heads == model.config.num_attention_heads
    assert c.num_key_value_heads == model.config.num_key_value_heads
    assert c.intermediate_size == model.config.intermediate_size
    assert c.rope_parameters["rope_theta"] == model.config.rope_theta
    assert c.tie_word_embeddings is False


def test_without_the_explicit_flag_vllm_would_build_the_other_residual(tiny_export, tmp_path):
    """The guard on the test: vLLM 0.33.0 defaults a missing norm_before_residual to true."""
    config = json.loads((tiny_export["export"] / "config.json").read_text())
    del config["norm_before_residual"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert get_config(str(tmp_path), trust_remote_code=False).norm_before_residual is True


def test_vllm_speculative_config_method_and_k(tiny_export):
    config = json.loads((tiny_export["export"] / "config.json").read_text())
    assert SpeculatorsConfig.extract_vllm_speculative_config(config) == {
        "method": "eagle3",
        "num_speculative_tokens": tiny_export["steps"],
    }


def test_vllm_serve_of_the_default_export_needs_the_target_named(tiny_export, tiny_model_dir):
    export = str(tiny_export["export"])
    with pytest.raises(
        ValueError, match="Select local verifiers explicitly with --model and --speculative-config"
    ):
        maybe_override_with_speculators(model=export, tokenizer=None, trust_remote_code=False)
    # README's form: the target as --model, the export in --speculative-config: passed through as given
    spec = {"model": export, "method": "eagle3", "num_speculative_tokens": tiny_export["steps"]}
    got = maybe_override_with_speculators(
        model=str(tiny_model_dir), tokenizer=None, trust_remote_code=False, vllm_speculative_config=dict(spec)
    )
    assert got == (str(tiny_model_dir), None, spec)


def test_vllm_serve_of_a_hub_verifier_export_alone(hub_export):
    export, steps = hub_export
    model, tokenizer, spec = maybe_override_with_speculators(
        model=str(export), tokenizer=None, trust_remote_code=False
    )
    assert model == tokenizer == HUB_ID
    assert spec == {"method": "eagle3", "num_speculative_tokens": steps, "model": str(export)}
