"""Tiny model configs the tests share: an EAGLE-3 drafter config and a Llama target config (as a
LlamaConfig or as a config.json), each with small defaults that a test overrides field by field (one
home, so a new config field lands everywhere); likewise the provenance attrs of a token shard."""

from __future__ import annotations

from eyas.core.provenance import chat_template_hash, tokenizer_hash
from eyas.model.drafter import DrafterConfig


def tiny_drafter_config(**overrides) -> DrafterConfig:
    """A drafter of hidden 32 over a 100-token vocab (40 drafted), taps [1, 2, 5]."""
    fields = dict(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=256,
        vocab_size=100,
        draft_vocab_size=40,
        aux_layer_ids=[1, 2, 5],
    )
    return DrafterConfig(**(fields | overrides))


# A random-weight Llama target of 4 layers, hidden 64, over SmolLM2's 49,152-token vocab (so the committed
# SmolLM2 tokenizer, tests/data/tokenizer, fits it).
TINY_LLAMA = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def tiny_llama_config(**overrides):
    """The tiny Llama target (`TINY_LLAMA`) as transformers' LlamaConfig."""
    from transformers import LlamaConfig

    return LlamaConfig(**(TINY_LLAMA | overrides))


def tiny_llama_config_json(**overrides) -> dict:
    """The tiny Llama target's config.json, for an engine that reads only the config (a stood-in
    scheduler needs no weights; ServerArgs resolves from the config alone)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama"} | TINY_LLAMA | overrides


def token_shard_attrs(tokenizer, **overrides) -> dict:
    """The attrs of a token shard made with `tokenizer`: shard 0 of 1 of the train split of model "tiny"."""
    fields = dict(
        split="train",
        shard=0,
        num_shards=1,
        model_id="tiny",
        tokenizer_hash=tokenizer_hash(tokenizer),
        chat_template_hash=chat_template_hash(tokenizer),
        max_length=2048,
        eyas_version="test",
    )
    return fields | overrides
