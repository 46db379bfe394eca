"""The extract stage with `backend: sglang` on a real GPU and a real model (through the device tool):
its store equals the HF backend's within bf16 noise, with chunked prefill on and off.

Needs CUDA, a model dir and a token shard, and sglang's site packages apart from the image's
(sglang pins its own transformers), given by environment:
    EYAS_GPU_MODEL=/root/smollm2 EYAS_GPU_SHARD=.dev/tokens/shard-00000.zarr \
    EYAS_SGLANG_SITE=/tmp/sgl_site EYAS_BASE_SITE=/tmp/site python3 -m pytest -q tests/gpu
The figures (with throughput vs SGLang alone) are bench/sglang_extract.py's JSON, written to
$EYAS_GPU_OUT or the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("EYAS_GPU_MODEL", "EYAS_GPU_SHARD", "EYAS_SGLANG_SITE", "EYAS_BASE_SITE")


def _step(step: str, work: Path, sites: list[str], *extra: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), *sites]))
    cmd = [sys.executable, str(ROOT / "bench/sglang_extract.py"), step, "--work", str(work), *extra]
    subprocess.run(cmd, env=env, check=True, cwd=ROOT)


@pytest.mark.skipif(any(not os.environ.get(k) for k in NEEDED), reason=f"set {', '.join(NEEDED)}")
def test_sglang_store_equals_hf_within_bf16_noise(tmp_path):
    model, shard = os.environ["EYAS_GPU_MODEL"], os.environ["EYAS_GPU_SHARD"]
    base, sgl = os.environ["EYAS_BASE_SITE"], os.environ["EYAS_SGLANG_SITE"]
    out = Path(os.environ.get("EYAS_GPU_OUT", tmp_path / "result.json"))
    _step("hf", tmp_path, [base], "--model", model, "--shard", shard)
    _step("sglang", tmp_path, [sgl, base], "--model", model, "--shard", shard)
    _step("compare", tmp_path, [base], "--out", str(out))
    result = json.loads(out.read_text())
    floor = result["stores"]["hf-bf16"]["vs_fp32"]  # bf16 compute's own distance to fp32, per tap
    for name in ("sglang", "sglang-chunked"):
        entry = result["stores"][name]
        for tap, (got, noise) in enumerate(zip(entry["vs_fp32"], floor, strict=True)):
            # SGLang's bf16 kernels drift further from fp32 than HF's in the middle layers (2.9x HF's
            # own error at layer 14 on the H200, bench/README.md): bounded, and checked against the
            # neighbouring layers below, which a capture one layer off would match instead
            assert got["rel_rms"] <= 4.0 * noise["rel_rms"] + 1e-4, (name, tap, got, noise)
        for tap in range(len(result["layer_ids"])):
            right = entry["vs_fp32"][tap]["rel_rms"]
            wrong = min(entry["vs_fp32_prev"][tap]["rel_rms"], entry["vs_fp32_next"][tap]["rel_rms"])
            assert right < wrong, (name, tap, right, wrong)  # the intended layer is the best match
    for tap, (diff, noise) in enumerate(zip(result["chunked_vs_unchunked"], floor, strict=True)):
        assert diff["rel_rms"] <= 2.0 * noise["rel_rms"] + 1e-4, (tap, diff, noise)
    attrs = result["stores"]["sglang"]["attrs"]
    assert attrs["backend"] == "sglang" and attrs["layer_ids"] == result["layer_ids"]
