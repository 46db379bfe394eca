"""SpecForge 0.2.0's own EAGLE-3 trainer on eyas stores, on CPU, with nothing edited in SpecForge.

What this checks:
- `eyas specforge-prepare` writes what SpecForge reads: its typed config validates
  (specforge/config/schema.py), its draft builder loads eyas's d2t/t2d and the target's embedding
  (specforge/algorithms/model_providers.py `build_eagle3_draft`), and its frozen head loads the tied
  target's embedding through the index eyas writes (specforge/modeling/target/target_head.py).
- SpecForge's `LlamaForCausalLMEagle3` under its own TTT loop (`OnlineEagle3Model`) computes the logits
  eyas's drafter computes from the same weights (fp32, 4 TTT steps), so importing its checkpoint is a
  renaming: with sdpa at every position; with flex_attention (SpecForge's default, the GPU bench's) at
  every position t < T - k of step k. Its flex mask drops the last k rows of step k
  (specforge/modeling/draft/flex_attention.py `generate_eagle3_mask`, seq_lengths - lck), positions
  whose target x_{t+2+k} lies past the sample, which carry no loss in either trainer.
- The whole bench path: `export-specforge` (loss mask eyas-targets), `specforge-prepare`,
  bench/gpu/specforge_run.py (SpecForge's `specforge train`, one epoch; CPU-only changes: DDP for FSDP,
  sdpa, the plain-torch loss), `import-specforge-drafter`. Every token and exactly eyas's loss
  positions reach SpecForge's steps, and the drafter it trained loads in eyas with the stores' provenance.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The one skip line of this folder in an environment without SpecForge (see conftest.py).
pytest.importorskip(
    "specforge.training.assembly",
    reason="no specforge here: tests/specforge/ runs in .venv-specforge (make test-specforge)",
)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from modelkit import tiny_drafter_config

from eyas.core.provenance import DRAFTER_PROVENANCE  # noqa: E402
from eyas.data.vocab import load_draft_vocab  # noqa: E402
from eyas.export import sglang_config  # noqa: E402
from eyas.interop.specforge_export import export_specforge  # noqa: E402
from eyas.interop.specforge_train import eyas_state_dict, import_specforge_drafter, prepare_specforge_run  # noqa: E402
from eyas.model.drafter import Eagle3Drafter  # noqa: E402
from eyas.model.target import load_embed_and_head  # noqa: E402
from eyas.store import HiddenStore, read_token_shard  # noqa: E402

BENCH_RUN = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "specforge_run.py"
CPU = {"fsdp_sharding": "NO_SHARD", "attention_backend": "sdpa", "dataloader_num_workers": 0}


@pytest.fixture(scope="module")
def stores(data, tmp_path_factory):
    """The trainer tests' two (token shard, hidden store) pairs of the tiny target as a results root."""
    root = tmp_path_factory.mktemp("sf_results")
    for i, (tok, hid) in enumerate(zip(data["shards"], data["stores"], strict=True)):
        for kind, path in (("tokens", tok), ("hidden", hid)):
            (root / kind / "train").mkdir(parents=True, exist_ok=True)
            (root / kind / "train" / f"shard-{i:05d}.zarr").symlink_to(path)
    (root / "vocab").mkdir()
    (root / "vocab" / "draft_vocab.safetensors").symlink_to(data["vocab"])
    return root


@pytest.fixture(scope="module")
def prepared(stores, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("sf_run")
    export_specforge(stores, out / "dump", loss_mask="eyas-targets")
    settings = {**CPU, "num_epochs": 1, "learning_rate": 3e-3, "ttt_length": 3, "log_interval": 1}
    info = prepare_specforge_run(out / "dump", out / "run", data["model"], data["vocab"], settings)
    return out, info


def test_prepared_run_is_what_specforge_reads(prepared, data):
    from specforge.algorithms.model_providers import build_eagle3_draft
    from specforge.config import load_config
    from specforge.modeling.target.target_head import TargetHead
    from specforge.training.model_loading import load_draft_config_source

    _, info = prepared
    cfg = load_config(info["run_yaml"])
    assert cfg.mode == "offline" and cfg.training.ttt_length == 3
    assert info["lm_head_key"] == cfg.model.lm_head_key == "model.embed_tokens.weight"  # tied target
    draft_config = load_draft_config_source(cfg.model.draft_model_config)
    assert draft_config.architectures == ["LlamaForCausalLMEagle3"] and draft_config.draft_vocab_size == 64
    draft = build_eagle3_draft(cfg, draft_config)
    d2t, t2d, _ = load_draft_vocab(data["vocab"])
    assert torch.equal(draft.d2t.cpu(), d2t) and torch.equal(draft.t2d.cpu(), t2d)
    embed, head = load_embed_and_head(data["model"])
    assert torch.equal(draft.embed_tokens.weight, embed.to(torch.bfloat16))
    assert not draft.embed_tokens.weight.requires_grad
    target_head = TargetHead.from_pretrained(cfg.model.target_model_path, lm_head_key=cfg.model.lm_head_key)
    assert torch.equal(target_head.fc.weight, head.to(torch.bfloat16))


@pytest.mark.parametrize("backend", ["sdpa", "flex_attention"])
def test_specforge_draft_computes_eyas_drafter(monkeypatch, backend):
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.core import loss
    from specforge.modeling.auto import AutoDraftModel
    from specforge.training.model_loading import _draft_config_from_dict
    from specforge.utils import padding

    sys.path.insert(0, str(BENCH_RUN.parent))
    from specforge_run import reference_loss

    # the Triton kernel's function in plain torch (its launch needs a GPU)
    monkeypatch.setattr(loss.LogSoftmaxLoss, "apply", staticmethod(reference_loss))
    if backend == "flex_attention":  # flex attention on CPU runs only compiled (~15 s here)
        monkeypatch.setattr(torch._dynamo.config, "disable", False)
    cfg = tiny_drafter_config(
        hidden_size=64, intermediate_size=128, head_dim=16, rope_theta=1e5, max_position_embeddings=512,
        vocab_size=300, aux_layer_ids=[0, 1, 2],
    )  # fmt: skip
    torch.manual_seed(0)
    eyas = Eagle3Drafter(cfg)
    with torch.no_grad():
        for name, p in eyas.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5)
    target_ids = torch.randperm(300)[:40].sort().values
    t2d = torch.zeros(300, dtype=torch.bool)
    t2d[target_ids] = True
    eyas.set_vocab(target_ids - torch.arange(40), t2d)
    eyas.eval()

    config = _draft_config_from_dict(json.loads(json.dumps(sglang_config(cfg))))  # as SpecForge reads it
    sf = AutoDraftModel.from_config(config, attention_backend=backend, torch_dtype=torch.float32).eval()
    sf_names = {k.replace("layers.0.", "midlayer.", 1): v for k, v in eyas.state_dict().items()}
    sf.load_state_dict(sf_names, strict=True)
    assert eyas_state_dict(sf.state_dict()).keys() == eyas.state_dict().keys()

    steps, length = 4, 37
    aux, ids = torch.randn(1, length, 3 * 64), torch.randint(0, 300, (1, length))
    logits = []
    compute_logits = sf.compute_logits
    sf.compute_logits = lambda h: logits.append(compute_logits(h)) or logits[-1]
    ttt = OnlineEagle3Model(sf, length=steps, attention_backend=backend)
    with torch.no_grad():  # SpecForge's inputs: ids shifted left by one (TargetHead.preprocess)
        ttt(
            input_ids=padding(ids, left=False), attention_mask=torch.ones(1, length, dtype=torch.long),
            target=torch.randn(1, length, 300), loss_mask=torch.ones(1, length, 1), hidden_states=aux,
        )  # fmt: skip
        want = eyas.ttt_forward(aux, ids, steps)
    assert len(logits) == steps
    for k in range(steps):
        rows = length if backend == "sdpa" else length - k
        torch.testing.assert_close(logits[k][:, :rows], want[k][:, :rows], rtol=0, atol=1e-4)


def eyas_loss_positions(stores) -> int:
    """Step-0 loss positions of eyas's objective (loss_mask[t + 2] within the sample), over all stores."""
    total = 0
    for shard in sorted((stores / "tokens" / "train").iterdir()):
        tokens = read_token_shard(shard)
        for s in range(tokens.num_samples):
            _, mask = tokens.sample(s)
            total += int(np.count_nonzero(mask[2:]))
    return total


def test_specforge_trains_on_eyas_stores_and_imports(prepared, stores, data, tmp_path):
    out, info = prepared
    metrics = tmp_path / "train.json"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    command = [sys.executable, str(BENCH_RUN), "--config", info["run_yaml"], "--out", str(metrics)]
    run = subprocess.run(
        [*command, "--cpu-reference-loss"], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    m = json.loads(metrics.read_text())
    assert m["steps"] == info["samples"] == 10  # one epoch, one sample a step
    assert m["tokens"] == info["tokens"]  # every token reached SpecForge (none over max_length)
    assert m["loss_positions"] == eyas_loss_positions(stores)  # eyas-targets: eyas's positions exactly
    assert len(m["logged"]) == 10 and all(np.isfinite(row["loss"]) for row in m["logged"])
    assert "ploss_2" in m["logged"][0] and "ploss_3" not in m["logged"][0]  # ttt_length 3

    drafter = tmp_path / "drafter"
    dump = out / "dump"
    summary = import_specforge_drafter(info["output_dir"], drafter, data["model"], data["vocab"], dump)
    assert summary["global_step"] == 10
    model = Eagle3Drafter.from_pretrained(drafter)
    meta = json.loads((drafter / "config.json").read_text())
    store = HiddenStore(data["stores"][0])
    assert {k: meta[k] for k in DRAFTER_PROVENANCE} == {k: store.attrs.get(k) for k in DRAFTER_PROVENANCE}
    state = torch.load(summary["checkpoint"], map_location="cpu", weights_only=True)["draft_state_dict"]
    torch.testing.assert_close(model.lm_head.weight, state["lm_head.weight"].float(), rtol=0, atol=0)
    assert torch.equal(model.embed_tokens.weight, load_embed_and_head(data["model"])[0].float())

    # A checkpoint trained with another vocab mapping is refused, not silently imported.
    bad = tmp_path / "bad.pt"
    full = torch.load(summary["checkpoint"], map_location="cpu", weights_only=True)
    full["draft_state_dict"]["t2d"] = ~full["draft_state_dict"]["t2d"]
    torch.save(full, bad)
    with pytest.raises(ValueError, match="t2d"):
        import_specforge_drafter(bad, tmp_path / "bad", data["model"], data["vocab"], dump)
