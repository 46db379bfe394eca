"""Zarr I/O for token shards and hidden-state stores: the schema (`layout`), the write side
(`writer`) and the read side (`reader`); formats in docs/design.md. Import from here."""

from eyas.store.layout import (
    CHUNK_TOKENS,
    CODEC_NAMES,
    COPIED_SHARD_ATTRS,
    HIDDEN_FORMAT,
    REQUIRED_ATTRS,
    SHARD_FIELDS,
    STORE_IDENTITY,
    STORED_DTYPES,
    TOKENS_FORMAT,
    ProvenanceError,
    bf16_to_uint16,
    check_provenance,
    chunk_encoder,
    hidden_codec,
    hidden_layout,
    shard_name,
    shard_paths,
    uint16_to_bf16,
)
from eyas.store.reader import HiddenStore, TokenShard, list_hidden_stores, read_token_shard
from eyas.store.writer import HiddenStoreWriter, hidden_store_writer, write_token_shard

__all__ = [
    "CHUNK_TOKENS",
    "CODEC_NAMES",
    "COPIED_SHARD_ATTRS",
    "HIDDEN_FORMAT",
    "REQUIRED_ATTRS",
    "SHARD_FIELDS",
    "STORE_IDENTITY",
    "STORED_DTYPES",
    "TOKENS_FORMAT",
    "HiddenStore",
    "HiddenStoreWriter",
    "ProvenanceError",
    "TokenShard",
    "bf16_to_uint16",
    "check_provenance",
    "chunk_encoder",
    "hidden_codec",
    "hidden_layout",
    "hidden_store_writer",
    "list_hidden_stores",
    "read_token_shard",
    "shard_name",
    "shard_paths",
    "uint16_to_bf16",
    "write_token_shard",
]
