"""The drafter a run trains and what it records of its inputs: the hidden stores and the draft vocab
checked against each other, the drafter built from the target's config (its head optionally from
the target's), the teacher head, and the provenance the drafter's config carries with the run's
checkpoint fingerprint.
"""

from __future__ import annotations

import dataclasses

import torch

from eyas.config import TrainSettings
from eyas.core.provenance import DRAFTER_PROVENANCE, sha256_file
from eyas.data.vocab import load_draft_vocab
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import load_embed_and_head, load_target_tensor, read_config
from eyas.store import STORE_IDENTITY, ProvenanceError, check_provenance
from eyas.train import distributed
from eyas.train.checkpoint import fingerprint
from eyas.train.loader import BATCH_PLAN, PairedLoader
from eyas.train.step import Teacher


def build_drafter(
    settings: TrainSettings,
    loader: PairedLoader,
    hidden_stores: list[str],
    vocab_path: str,
    model_dir: str,
    device: torch.device,
    amp: torch.dtype | None,
) -> tuple[Eagle3Drafter, Teacher, dict]:
    """The drafter (on `device`, in train mode), the teacher head, and the stores' attrs."""
    d2t, t2d, vocab_meta = load_draft_vocab(vocab_path)
    attrs = _check_inputs(loader, hidden_stores, vocab_meta)
    model, head = _build_model(model_dir, attrs, d2t, t2d, settings)
    model.to(device).train()
    teacher = Teacher(head, d2t, t2d, device, amp or torch.float32)
    return model, teacher, attrs


def _check_inputs(loader: PairedLoader, hidden_stores: list[str], vocab_meta: dict) -> dict:
    """Stores must agree with each other and with the draft vocab; returns the first store's attrs."""
    first = loader.store_attrs[0]
    for attrs, path in zip(loader.store_attrs[1:], hidden_stores[1:], strict=True):
        check_provenance(attrs, {k: first.get(k) for k in STORE_IDENTITY}, path)
    if first.get("num_taps") != 3:
        raise ProvenanceError(
            f"{hidden_stores[0]}: provenance field 'num_taps' is {first.get('num_taps')!r}, expected 3"
        )
    if vocab_meta["tokenizer_hash"] != first.get("tokenizer_hash"):
        raise ProvenanceError(
            f"draft vocab: field 'tokenizer_hash' is {vocab_meta['tokenizer_hash']!r}, "
            f"the hidden stores have {first.get('tokenizer_hash')!r}"
        )
    return first


def _build_model(
    model_dir: str, attrs: dict, d2t: torch.Tensor, t2d: torch.Tensor, settings: TrainSettings
) -> tuple:
    config = DrafterConfig.from_target_config(
        read_config(model_dir),
        len(d2t),
        attrs["layer_ids"],
        attention=settings.drafter,
        fc_norm=settings.fc_norm,
        norm_output=settings.norm_output,
        intermediate_size=settings.intermediate_size,
    )
    if config.hidden_size != attrs["hidden_size"]:
        raise ProvenanceError(f"target hidden_size {config.hidden_size} != stores' {attrs['hidden_size']}")
    torch.manual_seed(settings.seed)
    model = Eagle3Drafter(config)
    model.attention_impl = settings.tree_attention
    if settings.compile:
        model.compile_steps()
    embed, head = load_embed_and_head(model_dir)
    model.set_target_embedding(embed.float())
    model.set_vocab(d2t, t2d)
    if settings.init_head_from_target:
        draft_target_ids = torch.arange(len(d2t)) + d2t  # [D] target id of each draft id
        with torch.no_grad():
            model.lm_head.weight.copy_(head[draft_target_ids].float())  # [D, H]
            model.norm.weight.copy_(load_target_tensor(model_dir, "model.norm.weight").float())
    return model, head


def stores_summary(store_attrs: list[dict]) -> dict:
    """What the drafter was trained on, beyond the identity fields every store shares: how the states
    were computed and stored (a drafter trained on fp8 stores says so in its config)."""

    def values(field: str, default=None) -> list[str]:
        return sorted({str(v) for a in store_attrs if (v := a.get(field, default)) is not None})

    return {
        "count": len(store_attrs),
        "tokens": sum(int(a.get("num_tokens", 0)) for a in store_attrs),
        "storage": values("storage", "bf16"),  # stores before the fp8 option are bf16
        "backend": values("backend"),
        "compute_dtype": values("compute_dtype"),
    }


def provenance(
    settings: TrainSettings, loader: PairedLoader, attrs: dict, vocab_path: str, world: distributed.World
) -> tuple[dict, str]:
    """(what the drafter's config records of its inputs, the checkpoint fingerprint of this run)."""
    vocab_hash = sha256_file(vocab_path)
    extra = {k: attrs.get(k) for k in DRAFTER_PROVENANCE}
    extra.update(
        {
            "draft_vocab_hash": vocab_hash,
            "train_settings": dataclasses.asdict(settings),
            "train_stores": stores_summary(loader.store_attrs),
        }
    )
    stores = [a.get("tokens_checksum") for a in loader.store_attrs]
    inputs = {"stores": stores, "vocab": vocab_hash, "world_size": world.size, "batch_plan": BATCH_PLAN}
    # the settings enter through `fingerprint`'s own filter (NOT_FINGERPRINTED), not a second time whole
    recorded = {k: v for k, v in extra.items() if k != "train_settings"}
    fp = fingerprint(settings, {**inputs, **recorded})
    return extra, fp
