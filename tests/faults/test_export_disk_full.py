"""Disk full while the SGLang export is written over a previous one: the previous export stays whole.

A real full disk: a tmpfs just big enough for one export (needs root to mount; skipped otherwise).
`eyas.export.export_sglang` is exercised as it is.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from test_drafter import tiny_config  # tests/ is on sys.path (rootdir conftest, no package)

from eyas.export import export_sglang, load_export
from eyas.model.drafter import Eagle3Drafter


def _drafter_dir(root, seed: int):
    cfg = tiny_config(hidden_size=64, intermediate_size=128, vocab_size=512, draft_vocab_size=256)
    torch.manual_seed(seed)
    model = Eagle3Drafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    d2t = torch.zeros(256, dtype=torch.int64)
    t2d = torch.zeros(512, dtype=torch.bool)
    t2d[:256] = True
    model.set_vocab(d2t, t2d)
    model.save_pretrained(root / f"drafter{seed}", extra_config={"model_hash": f"m{seed}"})
    return root / f"drafter{seed}"


def _export_bytes(path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_disk_full_during_export_keeps_the_previous_export(tmp_path, ledger):
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    old_dir, new_dir = _drafter_dir(tmp_path, 0), _drafter_dir(tmp_path, 1)
    probe = tmp_path / "probe"
    export_sglang(old_dir, probe)
    size = sum(p.stat().st_size for p in probe.iterdir())
    mount = tmp_path / "small"
    mount.mkdir()
    pages = (size + 4095) // 4096 + 4  # one export and a little: a second copy does not fit
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={pages * 4}k", "tmpfs", str(mount)], capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        out = mount / "sglang"
        export_sglang(old_dir, out)
        before = _export_bytes(out)
        assert before == _export_bytes(probe)
        with ledger.case(
            "fault", "disk full during export", "previous export intact and loadable; no leftovers"
        ):
            # Today safetensors' own error comes through ("Error while serializing: I/O error: No space
            # left on device (os error 28)"), without the export path: the test checks what is left.
            with pytest.raises(Exception, match="No space left on device"):  # noqa: B017
                export_sglang(new_dir, out)
            assert [p.name for p in mount.iterdir()] == ["sglang"]  # the partial tmp dir is gone
            assert _export_bytes(out) == before
            embed = torch.zeros(512, 64)
            loaded = load_export(out, embed)
            want = Eagle3Drafter.from_pretrained(old_dir).state_dict()
            got = loaded.state_dict()
            assert torch.equal(
                got["fc.weight"], want["fc.weight"].to(torch.bfloat16).to(got["fc.weight"].dtype)
            )
    finally:
        subprocess.run(["umount", str(mount)], check=False)
