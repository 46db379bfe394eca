"""What a hidden store takes on disk, estimated before it is written (the extraction's disk pre-flight).

A store holds, per token, `groups` = taps + 1 (the final state) vectors of `hidden` values: 2 bytes
each raw (bf16). Its Blosc zstd+shuffle chunks keep a measured fraction of that (bench/results,
`bytes_stored / bytes_raw_bf16` of the stores `bench/extract.py` wrote, real SmolLM2-135M states):
- bf16: 0.7024 (ratio 1.424) on 1,000,042 and 4,000,016 tokens on an H200 (extract-h200-smollm2.json,
  extract-h200-smollm2-4m.json); 0.682 on 6,151 tokens on the CPU (extract-cpu-smollm2.json); the
  byte-codec bound of such states is ~1.43-1.45x, so bf16 states do not compress much below this.
- fp8_e4m3 with its per-token scales: 0.4631 on an H200 (extract-h200-smollm2.json), 0.4496 on the CPU.
The estimate takes the larger of each and a 10% margin for targets whose states compress less.
Uncompressed stores (`extract.compression: none`) hold the raw bytes: 2 a value in bf16, 1 a value
and a 4-byte scale a vector in fp8; the same margin covers the padded last chunk and Blosc's headers.
"""

from __future__ import annotations

STORED_FRACTION_OF_BF16 = {"bf16": 0.7024, "fp8_e4m3": 0.4631}
MARGIN = 1.10


def estimated_store_bytes(
    tokens: int, hidden: int, groups: int, storage: str, compression: str = "zstd"
) -> int:
    """Bytes a hidden store of `tokens` tokens is expected to take (see the module docstring)."""
    raw_bf16 = tokens * groups * hidden * 2
    if compression == "none":
        raw = raw_bf16 if storage == "bf16" else tokens * groups * (hidden + 4)
        return int(raw * MARGIN)
    return int(raw_bf16 * STORED_FRACTION_OF_BF16[storage] * MARGIN)
