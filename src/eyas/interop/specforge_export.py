"""Write eyas stores as SpecForge offline training samples (one `torch.save` dict per sample), streaming.

The format is what SpecForge 0.2.0 (PyPI `specforge==0.2.0`) reads and what its
`scripts/prepare_hidden_states.py` writes (sgl-project/SpecForge): files `rows_{g}-{g+G}/data_{i}.ckpt`
(G = `--file-group-size`, 2000 there; g = i // G * G), found by walking the directory for `.ckpt`
(`specforge/runtime/data_plane/offline_reader.py`, `list_feature_files`), each a dict of
  `input_ids` [T] int64, `loss_mask` [T] int64, `hidden_state` [1, T, H] bf16 (the target's post-norm
  last hidden state), `aux_hidden_state` [1, T, K*H] bf16 (the K aux taps concatenated in layer order).
eyas's `import-specforge` reads the same files back (`eyas.interop.specforge_import`).

Alignment. Every tensor is stored unshifted, row t belonging to token x_t, as SpecForge stores them: its
trainer shifts by itself. `specforge/algorithms/eagle3/data.py` (`normalize_offline_sample`) truncates
to max_len and zeroes `loss_mask[-1]`; `specforge/modeling/target/target_head.py` (`TargetHead.preprocess`)
shifts `input_ids` and `hidden_state` left by one (`specforge/utils.py`, `padding(left=False)`), and
`specforge/algorithms/eagle3/model.py` shifts `loss_mask` left by one more per TTT step. So SpecForge's
step k at index t consumes a_t (step 0) and the embedding of x_{t+1+k}, is taught by lm_head(f_{t+1+k})
to predict x_{t+2+k}, exactly as eyas (docs/design.md, drafter data alignment), but carries loss iff
`loss_mask[t+k] == 1`, where eyas asks `loss_mask[t+2+k] == 1`.
`loss_mask` choices:
  - `assistant` (default): eyas's mask as is, 1 on assistant tokens; that is the mask SpecForge's own
    preprocessing writes (`specforge/data/parse.py`), so SpecForge trains as it would on its own dump.
    The export round-trips through `import-specforge` unchanged.
  - `eyas-targets`: written mask[t] = eyas mask[t+2] (0 for the last two), so SpecForge's gate
    `mask[t+k]` selects exactly eyas's loss positions; position-for-position the same objective.

fp8_e4m3 stores are decoded by the store reader (`HiddenStore.sample_into` into bf16 buffers: the
dequantized float32 values rounded to bf16); bf16 stores are copied bit for bit. The whole output
directory is written under a temporary sibling and renamed into place (`eyas.core.atomic.atomic_dir`), with
`eyas-export.json` (count, tokens, sources, provenance, dtype) beside the samples; SpecForge lists only
`.ckpt` files, so the manifest is not taken for a sample.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from eyas.core.atomic import atomic_dir
from eyas.core.provenance import EYAS_VERSION
from eyas.store import STORE_IDENTITY, HiddenStore, ProvenanceError, read_token_shard, shard_paths
from eyas.train.loader import check_pair

EXPORT_FORMAT = "eyas.specforge-export/1"
MANIFEST = "eyas-export.json"
LOSS_MASKS = ("assistant", "eyas-targets")
FILE_GROUP_SIZE = 2000  # SpecForge's prepare_hidden_states default (--file-group-size)
# Provenance every exported store must share with the first: its identity, and what made its tokens.
AGREED_FIELDS = (*STORE_IDENTITY, "final_norm", "tokenizer_hash", "chat_template_hash", "split")


def sample_path(out_dir: Path, index: int, group: int) -> Path:
    """`rows_{g}-{g+group}/data_{index}.ckpt`, SpecForge's layout (prepare_hidden_states `_get_file_path`)."""
    start = index // group * group
    return out_dir / f"rows_{start}-{start + group}" / f"data_{index}.ckpt"


def store_pairs(stores_dir: str | os.PathLike, split: str) -> list[tuple[str, str]]:
    """(token shard, hidden store) paths of one split of a results root, paired by shard name."""
    root = Path(stores_dir)
    tokens = shard_paths(root / "tokens" / split)
    hidden = shard_paths(root / "hidden" / split)
    if not tokens:
        raise FileNotFoundError(f"{root / 'tokens' / split}: no token shards (shard-*.zarr)")
    names_tok = [Path(p).name for p in tokens]
    names_hid = [Path(p).name for p in hidden]
    if names_tok != names_hid:
        missing = sorted(set(names_tok) ^ set(names_hid))
        raise FileNotFoundError(f"{root}: token shards and hidden stores of {split!r} differ: {missing[:5]}")
    return list(zip(tokens, hidden, strict=True))


def check_stores(pairs: list[tuple[str, str]]) -> dict:
    """Check every pair (offsets, token checksum, provenance equal to the first store's); return that
    provenance. Raises ProvenanceError naming the file and the field. One token shard in memory at a time."""
    expected: dict | None = None
    for tok_path, hid_path in pairs:
        store = HiddenStore(hid_path)
        if expected is None:
            expected = {field: store.attrs.get(field) for field in AGREED_FIELDS}
        check_pair(read_token_shard(tok_path), store, tok_path, hid_path, expected)
        width = store.aux.shape[1]
        if width != expected["num_taps"] * expected["hidden_size"]:
            raise ProvenanceError(
                f"{hid_path}: field 'aux' is {width} wide, expected num_taps * hidden_size = "
                f"{expected['num_taps']} * {expected['hidden_size']}"
            )
    return expected


def shifted_mask(mask: np.ndarray, loss_mask: str) -> np.ndarray:
    """The loss_mask to write for one sample (see the module docstring)."""
    if loss_mask == "assistant":
        return mask
    out = np.zeros_like(mask)
    out[:-2] = mask[2:]
    return out


def sample_dict(ids: np.ndarray, mask: np.ndarray, aux: torch.Tensor, final: torch.Tensor) -> dict:
    """One SpecForge sample; tensors own exactly their data (torch.save writes a view's whole storage)."""
    return {
        "input_ids": torch.from_numpy(ids.astype(np.int64)),
        "loss_mask": torch.from_numpy(mask.astype(np.int64)),
        "hidden_state": final.unsqueeze(0).clone(),
        "aux_hidden_state": aux.unsqueeze(0).clone(),
    }


def _export_pair(tok_path: str, hid_path: str, out_dir: Path, first: int, group: int, loss_mask: str) -> dict:
    """Write one pair's samples as data_{first + s}.ckpt; returns its manifest entry."""
    shard = read_token_shard(tok_path)
    store = HiddenStore(hid_path)
    width, hidden = store.aux.shape[1], store.final.shape[1]
    for s in range(shard.num_samples):  # one sample's states in memory at a time
        ids, mask = shard.sample(s)
        aux = torch.empty(len(ids), width, dtype=torch.bfloat16)
        final = torch.empty(len(ids), hidden, dtype=torch.bfloat16)
        store.sample_into(s, aux, final)  # bf16 bits as stored, or fp8 dequantized and rounded to bf16
        path = sample_path(out_dir, first + s, group)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(sample_dict(ids, shifted_mask(mask, loss_mask), aux, final), path)
    return {
        "tokens": tok_path,
        "hidden": hid_path,
        "samples": shard.num_samples,
        "num_tokens": int(shard.sample_offsets[-1]),
        "storage": store.storage,
        "first_index": first,
    }


def export_specforge(
    stores_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    split: str = "train",
    file_group_size: int = FILE_GROUP_SIZE,
    loss_mask: str = "assistant",
) -> dict:
    """Write the `split` stores of results root `stores_dir` (tokens/{split}/, hidden/{split}/) as a
    SpecForge offline dump at `out_dir` (replaced atomically); returns the manifest."""
    if file_group_size < 1:
        raise ValueError(f"file_group_size must be >= 1, got {file_group_size}")
    if loss_mask not in LOSS_MASKS:
        raise ValueError(f"loss_mask {loss_mask!r} is not one of {', '.join(LOSS_MASKS)}")
    pairs = store_pairs(stores_dir, split)
    provenance = check_stores(pairs)  # refuse before writing anything
    sources = []
    with atomic_dir(out_dir) as tmp:
        count = 0
        for tok_path, hid_path in pairs:
            sources.append(_export_pair(tok_path, hid_path, tmp, count, file_group_size, loss_mask))
            count += sources[-1]["samples"]
        manifest = {
            "format": EXPORT_FORMAT,
            "specforge_format": "specforge_hidden_states_v1 (specforge 0.2.0 offline eagle3)",
            "count": count,
            "tokens": sum(s["num_tokens"] for s in sources),
            "dtype": {"input_ids": "int64", "loss_mask": "int64", "hidden_state": "bfloat16",
                      "aux_hidden_state": "bfloat16"},
            "loss_mask": loss_mask,
            "file_group_size": file_group_size,
            "split": split,
            "provenance": provenance,
            "sources": sources,
            "eyas_version": EYAS_VERSION,
        }  # fmt: skip
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest
