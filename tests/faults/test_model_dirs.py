"""Bad target model dirs: each refused before any job with an error naming the path and the fix.

Every bad dir is the tiny test target (tests/conftest.py) with one thing broken; the weights are
symlinked, not copied. `check_model_dir` is what the Snakefile runs when it is parsed; one case goes
through the real `snakemake -n` as well.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eyas.config import load_config_file
from eyas.core.model_dir import ModelDirError, check_model_dir

REPO = Path(__file__).parents[2]


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            (dst / f.name).symlink_to(f)
        else:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _break(folder: Path, what: str) -> None:
    if what == "no tokenizer files":
        (folder / "tokenizer.json").unlink()
        (folder / "tokenizer_config.json").unlink()
    elif what == "no chat template":
        (folder / "chat_template.jinja").unlink()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        assert not config.get("chat_template")
    elif what == "tokenizer of another model":
        _edit_config(folder, vocab_size=32000)  # SmolLM2's tokenizer has ids up to 49151
    elif what == "encoder-only architecture":
        _edit_config(folder, architectures=["BertForMaskedLM"], model_type="bert")
    elif what == "custom code, trust_remote_code off":
        _edit_config(
            folder,
            model_type="eyas_custom_lm",
            architectures=["EyasCustomForCausalLM"],
            auto_map={"AutoModelForCausalLM": "modeling_custom.EyasCustomForCausalLM"},
        )
    elif what == "model_type unknown, no code":
        _edit_config(folder, model_type="eyas_future_lm", architectures=["EyasFutureForCausalLM"])
    elif what == "config.json not JSON":
        text = (folder / "config.json").read_text()
        (folder / "config.json").write_text(text[: len(text) // 2])
    elif what == "weights only as a pickle":
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    else:
        raise AssertionError(what)


CASES = {  # what is broken -> (what the error must say besides the path, the expected outcome)
    "no tokenizer files": (
        "no tokenizer.json or tokenizer_config.json",
        "refused: names dir, fix: copy tokenizer",
    ),
    "no chat template": ("has no chat template", "refused: names dir, fix: instruct release or template"),
    "tokenizer of another model": (
        "vocab_size is 32000",
        "refused: names dir, fix: the model's own tokenizer",
    ),
    "encoder-only architecture": (
        "BertForMaskedLM",
        "refused: names config.json, not a causal LM for backend hf",
    ),
    "custom code, trust_remote_code off": (
        "model.trust_remote_code: true",
        "refused: names dir, fix: trust_remote_code after reading the code",
    ),
    "model_type unknown, no code": (
        "unknown to the installed transformers",
        "refused: names config.json, fix: a newer transformers",
    ),
    "config.json not JSON": ("not valid JSON", "refused: names config.json:line:col"),
    "weights only as a pickle": (
        "pytorch_model.bin",
        "refused: never unpickled, fix: convert to safetensors",
    ),
}


@pytest.mark.parametrize("what", sorted(CASES))
def test_bad_model_dir_is_refused_naming_path_and_fix(what, tiny_model_dir, tmp_path, ledger):
    folder = _copy(tiny_model_dir, tmp_path / "model")
    check_model_dir(folder)  # the unbroken copy passes
    _break(folder, what)
    text, expect = CASES[what]
    with ledger.case("bad_input", f"model dir: {what}", expect):
        with pytest.raises(ModelDirError) as err:
            check_model_dir(folder, "hf", trust_remote_code=False)
        message = str(err.value)
        assert str(folder) in message and text in message, message
        assert "Fix" in message or what == "config.json not JSON", message
        if what == "config.json not JSON":
            assert re.search(re.escape(str(folder / "config.json")) + r":\d+:\d+: not valid JSON", message)
    if what == "model_type unknown, no code":
        check_model_dir(folder, "sglang")  # SGLang has model classes of its own: its loader decides
    if what == "custom code, trust_remote_code off":  # the fix the message names, set as a user would
        user = load_config_file(_user_config(tmp_path, "model: {trust_remote_code: true}\n"))
        check_model_dir(folder, "hf", trust_remote_code=user.model.trust_remote_code)


def _user_config(folder: Path, text: str) -> Path:
    path = folder / "user.yaml"
    path.write_text(text + "data: {inputs: [{path: x.jsonl}]}\n")
    return path


def test_bad_model_dir_is_refused_by_the_dry_run(tiny_model_dir, tmp_path):
    folder = _copy(tiny_model_dir, tmp_path / "model")
    data = tmp_path / "chats.jsonl"
    data.write_text('{"instruction": "Hi", "output": "Hello"}\n')
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {{source: {folder}, aux_layer_ids: [0, 1, 2]}}\ndata: {{inputs: [{{path: {data}}}]}}\n"
    )
    cmd = [sys.executable, "-m", "snakemake", "-n", "-d", str(tmp_path), "--configfile", str(config)]
    ok = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    _break(folder, "tokenizer of another model")
    bad = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "ModelDirError" in out and "vocab_size is 32000" in out, out[-3000:]
    assert "Job stats" not in out and not (tmp_path / "results").exists()
