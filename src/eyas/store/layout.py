"""The hidden-store and token-shard schema: names, formats, on-disk dtypes and codecs, the attribute
fields producers write and consumers check, and the shard file names of a split (docs/design.md).

Both kinds of store are zarr v3 groups. Hidden states are ragged and token-major: sample `s` owns rows
`[offsets[s], offsets[s+1])` of every array. bf16 lives on disk as a uint16 view because zarr-python 3
has no bfloat16 dtype; the real dtype is recorded in the `dtype` attribute.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numcodecs
import numpy as np
import torch
from zarr.codecs import BloscCodec

from eyas.store.quant import check_storage

TOKENS_FORMAT = "eyas.tokens/1"
HIDDEN_FORMAT = "eyas.hidden/1"
# 256-token chunks: random whole-sample reads then match per-sample files in speed while storing
# less; 1024-token chunks read at half that (bench/chunks.py, bench/results/chunks-cpu.json).
CHUNK_TOKENS = 256
# An inner chunk a shard does not hold (zarr v3 sharding_indexed: offset and nbytes both 2**64 - 1).
SHARD_EMPTY = 2**64 - 1
CODEC_NAMES = {
    "bf16": "blosc:zstd:clevel=1:shuffle=byte:typesize=2:blocksize=1MiB",
    "fp8_e4m3": "blosc:zstd:clevel=1:shuffle=bit:typesize=1:blocksize=1MiB (scale: float32, byte shuffle)",
}
COMPRESSIONS = ("zstd", "none")  # extract.compression: the Blosc settings below, or Blosc's copy
UNCOMPRESSED_CODEC_NAME = "blosc:clevel=0 (uncompressed frames)"
STORED_DTYPES = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn"}

# --------------------------------------------------------------------------- attribute fields
# Provenance a token shard carries that its hidden store copies (and must equal).
COPIED_SHARD_ATTRS = ("tokenizer_hash", "chat_template_hash", "split", "shard")
# Provenance every hidden store must carry.
REQUIRED_ATTRS = (
    "format",
    "model_id",
    "model_hash",
    "layer_ids",
    "layer_id_convention",
    "final_norm",
    "hidden_size",
    "num_taps",
    "dtype",
    "tokenizer_hash",
    "chat_template_hash",
    "tokens_checksum",
    "num_samples",
    "num_tokens",
    "split",
    "shard",
    "eyas_version",
)
SHARD_FIELDS = (*COPIED_SHARD_ATTRS, "model_id")  # a hidden store's, equal to its token shard's
# The stores a drafter trains on must agree on these (same target, same taps, same width).
STORE_IDENTITY = ("model_id", "model_hash", "layer_ids", "layer_id_convention", "hidden_size", "num_taps")


class ProvenanceError(ValueError):
    """A store was made from a different model, tokenizer, template or layer set than expected."""


def check_provenance(attrs: Mapping, expected: Mapping, where: str | os.PathLike) -> None:
    """Raise `ProvenanceError` naming the first field whose stored value differs from `expected`."""
    for field, want in expected.items():
        have = attrs.get(field)
        if isinstance(want, tuple):
            want = list(want)
        if have != want:
            raise ProvenanceError(f"{where}: provenance field {field!r} is {have!r}, expected {want!r}")


# --------------------------------------------------------------------------- shard names
def shard_name(index: int | str) -> str:
    """File name of shard `index` of a split (token shard and hidden store alike): shard-00000.zarr.
    A string index is a Snakemake `{shard}` wildcard, already zero-padded."""
    return f"shard-{index if isinstance(index, str) else f'{index:05d}'}.zarr"


def shard_paths(directory: str | os.PathLike) -> list[str]:
    """The shards in a split's directory (e.g. results/tokens/train), in shard order."""
    return sorted(str(p) for p in Path(directory).glob("shard-*.zarr"))


# --------------------------------------------------------------------------- encodings
# Blosc settings per on-disk encoding. In bf16 only the exponent compresses (sign and mantissa bits
# are noise); a 1 MiB block lets zstd see whole exponent runs: ratio 1.42 on real SmolLM2 states vs
# 1.22 at Blosc's default block (bench/chunks.py). fp8 bytes hold sign, 4 exponent and 3 mantissa
# bits, so bit planes separate the compressible exponent; scales are float32.
BLOSC_SETTINGS = {
    "bf16": {"cname": "zstd", "clevel": 1, "shuffle": "shuffle", "typesize": 2, "blocksize": 1 << 20},
    "fp8_e4m3": {"cname": "zstd", "clevel": 1, "shuffle": "bitshuffle", "typesize": 1, "blocksize": 1 << 20},
    "scale": {"cname": "zstd", "clevel": 1, "shuffle": "shuffle", "typesize": 4, "blocksize": 1 << 20},
}
_NUMCODECS_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def blosc_settings(encoding: str, compression: str = "zstd") -> dict:
    """Blosc settings of an array with this encoding (`bf16`, `fp8_e4m3` or `scale`). `none` is Blosc's
    copy (level 0): the same frames, so every reader reads either, and a 256-token fp8 chunk decodes
    in 16 us instead of 300 and encodes in 14 instead of 469, for ~12% more bytes on real fp8 states
    (bench/results/chunk-codec-cpu.json)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression {compression!r}: expected one of {', '.join(COMPRESSIONS)}")
    settings = dict(BLOSC_SETTINGS[encoding])
    if compression == "none":
        settings.update(clevel=0, shuffle="noshuffle")
    return settings


def codec_name(storage: str, compression: str = "zstd") -> str:
    """The store's `codec` attribute."""
    return CODEC_NAMES[storage] if compression == "zstd" else UNCOMPRESSED_CODEC_NAME


def hidden_codec(encoding: str = "bf16", compression: str = "zstd") -> BloscCodec:
    """The zarr codec of an array with this encoding (`bf16`, `fp8_e4m3` or `scale`)."""
    return BloscCodec(**blosc_settings(encoding, compression))


def chunk_encoder(encoding: str, compression: str = "zstd") -> numcodecs.Blosc:
    """The same Blosc as `hidden_codec`, called directly: it releases the GIL while compressing."""
    settings = blosc_settings(encoding, compression)
    settings["shuffle"] = _NUMCODECS_SHUFFLE[settings["shuffle"]]
    return numcodecs.Blosc(**settings)


def hidden_layout(storage: str, hidden_size: int, num_taps: int) -> dict[str, tuple[int, type]]:
    """Token-major arrays of a hidden store: name -> (row width, numpy dtype on disk)."""
    if check_storage(storage) == "bf16":
        return {"aux": (num_taps * hidden_size, np.uint16), "final": (hidden_size, np.uint16)}
    return {
        "aux": (num_taps * hidden_size, np.uint8),
        "final": (hidden_size, np.uint8),
        "scale": (num_taps + 1, np.float32),  # taps in layer_ids order, then the final state
    }


def bf16_to_uint16(tensor: torch.Tensor) -> np.ndarray:
    """Round to bf16 (if needed) and return the raw bits as a uint16 numpy array (CPU)."""
    return tensor.detach().to(torch.bfloat16).cpu().contiguous().view(torch.uint16).numpy()


def uint16_to_bf16(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint16)).view(torch.bfloat16)
