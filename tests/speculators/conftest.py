"""tests/speculators/ runs in its own environment (.venv-speculators, made by install_env.sh: `make
test-speculators`) where the real speculators 0.9.0 imports on CPU. In the main .venv, which has no
speculators, the folder is one skip line (test_load_export.py skips itself at module level).

Offline on purpose: the export must load without the Hugging Face Hub. huggingface_hub reads
HF_HUB_OFFLINE once, when it is first imported, so it is set here, before any test module imports it;
only where speculators is installed (the distribution's metadata, nothing imported), so that a main
suite collecting this folder keeps its environment as it was.
"""

import os
from importlib.metadata import PackageNotFoundError, version

import pytest

try:
    version("speculators")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
except PackageNotFoundError:
    pass


def pytest_configure(config):
    # speculators drafts with flex attention; on CPU without torch.compile it runs unfused (correct, slow).
    config.addinivalue_line("filterwarnings", "ignore:flex_attention called without torch.compile")


DRAFT_VOCAB = 512
AUX_IDS = [0, 1, 2]  # drafter convention on the 4-layer tiny target; vLLM/speculators [1, 2, 3]
STEPS = 3  # speculative tokens in the export; TTT steps compared


@pytest.fixture(scope="session")
def tiny_export(tiny_model_dir, tmp_path_factory):
    """A drafter shaped like the tiny target (its embedding, a random draft vocab, weights at the scale
    trained ones have), exported with the target's dir as verifier (what `export.verifier: null`
    writes). Returns the drafter dir, the export dir, the drafter, and the constants above."""
    import torch

    from eyas.core.provenance import model_hash
    from eyas.export import export_speculators
    from eyas.model.drafter import DrafterConfig, Eagle3Drafter
    from eyas.model.target import load_embed_and_head, read_config

    out = tmp_path_factory.mktemp("speculators")
    cfg = DrafterConfig.from_target_config(read_config(tiny_model_dir), DRAFT_VOCAB, AUX_IDS)
    cfg.rope_theta = 1e5  # not transformers' default 1e4: a reader that dropped it would draft differently
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif p.dim() == 2 and name != "embed_tokens.weight":
                p.normal_(0, p.shape[1] ** -0.5)
    embed, _ = load_embed_and_head(tiny_model_dir)
    model.set_target_embedding(embed)
    target_ids = torch.randperm(cfg.vocab_size)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    model.set_vocab(target_ids - torch.arange(DRAFT_VOCAB), t2d)
    model.save_pretrained(out / "drafter", extra_config={"model_hash": model_hash(tiny_model_dir)})
    info = export_speculators(
        out / "drafter", out / "export", str(tiny_model_dir), ["LlamaForCausalLM"], speculative_tokens=STEPS
    )
    assert info["verifier"] == str(tiny_model_dir) and info["verifier_checked"] is True
    return {
        "drafter": out / "drafter",
        "export": out / "export",
        "model": model.eval(),
        "aux_ids": AUX_IDS,
        "draft_vocab": DRAFT_VOCAB,
        "steps": STEPS,
    }
