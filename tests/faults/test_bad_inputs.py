"""The bad-input corpus (`tests/data/bad/`) through prepare, tokenize, config and target loading.

Every bad record must come out as a rejects entry with the expected reason (and `read == kept +
rejected + over_cap`), every bad file or config as an error naming the file, the line where there is
one, and the field. Each case is counted in the ledger (tests/faults/conftest.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eyas.config import ConfigError, load_config_file
from eyas.data.formats import REJECT_REASONS
from eyas.data.prepare import MAX_REJECT_RECORD_CHARS, prepare
from eyas.data.readers import InputFileError
from eyas.data.tokenize import tokenize_split
from eyas.model.target import load_tokenizer, read_config

BAD = Path(__file__).parents[1] / "data" / "bad"
EXPECTED: dict[str, str | None] = json.loads((BAD / "expected.json").read_text())
CONFIG_ERRORS: dict[str, str] = json.loads((BAD / "configs" / "expected_errors.json").read_text())
LINE_FILES = ("records.jsonl", "latin1.jsonl", "invalid_utf8.jsonl", "long.jsonl", "empty.jsonl")
HUGE_BYTES = 4 << 20  # one 4 MiB line: an unterminated string
HUGE_VALID_WORDS = 200_000  # one ~1 MB valid record: kept by prepare, too_long for tokenize
MAX_LENGTH = 256


def _huge_file(folder: Path) -> Path:
    path = folder / "huge.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"instruction": "never closed", "output": "' + "x" * HUGE_BYTES + "\n")
        record = {"id": "huge-valid", "instruction": "Repeat a word.", "output": "word " * HUGE_VALID_WORDS}
        fh.write(json.dumps(record) + "\n")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bad_prepare")
    inputs = [(str(BAD / name), "auto") for name in LINE_FILES] + [(str(_huge_file(out)), "auto")]
    stats = prepare(
        inputs,
        str(out / "train.jsonl"),
        str(out / "eval.jsonl"),
        str(out / "rejects.jsonl"),
        str(out / "stats.json"),
        eval_fraction=0.0,
        eval_max=None,
        seed=0,
        max_conversations=None,
    )
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text("utf-8").splitlines()]
    kept = [json.loads(line) for line in (out / "train.jsonl").read_text("utf-8").splitlines()]
    by_source = {
        Path(r["source"].rsplit(":", 1)[0]).name + ":" + r["source"].rsplit(":", 1)[1]: r for r in rejects
    }
    return {"out": out, "stats": stats, "rejects": by_source, "kept": kept}


@pytest.mark.parametrize("where", sorted(EXPECTED, key=lambda w: (w.split(":")[0], int(w.split(":")[1]))))
def test_each_bad_record_is_rejected_with_its_reason(prepared, ledger, where):
    reason = EXPECTED[where]
    if reason is None:  # a good record of the corpus: kept, not counted as a bad input
        assert where not in prepared["rejects"]
        return
    with ledger.case("bad_input", f"prepare {where}", f"reject {reason}"):
        row = prepared["rejects"].get(where)
        assert row is not None, f"{where} was not rejected"
        assert row["reason"] == reason, row
        assert row["reason"] in REJECT_REASONS and row["detail"]


def test_prepare_counts_add_up(prepared, ledger):
    stats = prepared["stats"]
    with ledger.case("bad_input", "prepare counts", "read == kept + rejected + over_cap"):
        assert stats["read"] == stats["kept"] + stats["rejected"] + stats["over_cap"]
        assert stats["read"] == len(EXPECTED) + 2  # + the two huge lines
        assert stats["rejected"] == sum(1 for r in EXPECTED.values() if r) + 1 == len(prepared["rejects"])
        assert sum(stats["by_reason"].values()) == stats["rejected"]
        assert stats["by_file"][str(BAD / "empty.jsonl")] == {
            "read": 0,
            "kept": 0,
            "rejected": 0,
            "over_cap": 0,
        }
        assert {c["id"] for c in prepared["kept"]} >= {"g1", "ok-openai", "long-1", "huge-valid"}
        (prepared["out"] / "rejects.jsonl").read_bytes().decode("utf-8")  # strict: the file is UTF-8


def test_huge_invalid_line_is_rejected_and_truncated(prepared, ledger):
    with ledger.case("bad_input", "prepare huge.jsonl:1 (4 MiB line)", "reject invalid_json, record cut"):
        row = prepared["rejects"]["huge.jsonl:1"]
        assert row["reason"] == "invalid_json"
        assert len(row["record"]) < MAX_REJECT_RECORD_CHARS + 64 and "truncated" in row["record"]
        assert (prepared["out"] / "rejects.jsonl").stat().st_size < 256 * 1024


def test_tokenize_rejects_long_and_special_token_samples(prepared, tokenizer_dir, tmp_path, ledger):
    stats = tokenize_split(
        str(prepared["out"] / "train.jsonl"),
        str(tokenizer_dir),
        [str(tmp_path / "shard-00000.zarr")],
        str(tmp_path / "rejects.jsonl"),
        str(tmp_path / "stats.json"),
        split="train",
        max_length=MAX_LENGTH,
        model_id="tiny",
    )
    rejects = {r["id"]: r for r in map(json.loads, (tmp_path / "rejects.jsonl").read_text().splitlines())}
    cases = {"long-1": "too_long", "huge-valid": "too_long"}
    special = [c["id"] for c in prepared["kept"] if "<|im_end|>" in json.dumps(c["messages"])]
    cases.update({i: "special_token_in_content" for i in special})
    assert len(special) == 1
    for sample_id, reason in cases.items():
        with ledger.case("bad_input", f"tokenize {sample_id}", f"reject {reason}"):
            assert rejects[sample_id]["reason"] == reason, rejects[sample_id]
            assert rejects[sample_id]["source"].endswith(":" + rejects[sample_id]["source"].rsplit(":", 1)[1])
    with ledger.case("bad_input", "tokenize counts", "read == kept + rejected"):
        assert stats["read"] == len(prepared["kept"]) == stats["kept"] + stats["rejected"]
        assert stats["rejected"] == len(rejects) == len(cases)
        assert stats["max_sample_tokens"] <= MAX_LENGTH


# --------------------------------------------------------------------------- whole-file errors
FILE_ERRORS = {  # file -> substrings the error must hold (besides the file's path)
    "utf16.jsonl": (":1:", "UTF-16"),
    "utf16_nobom.jsonl": (":1:", "UTF-16"),
    "utf16.json": (":1:", "UTF-16"),
    "truncated.json": (":11:14:", "invalid JSON"),
    "not_a_list.json": ("top level is dict",),
    "missing.jsonl": ("does not exist",),
    "records.csv": ("unknown extension",),
}


@pytest.mark.parametrize("name", sorted(FILE_ERRORS))
def test_unreadable_input_file_is_a_clear_error(name, tmp_path, ledger):
    path = BAD / name
    if name == "records.csv":
        path = tmp_path / name
        path.write_text("id,text\n1,hi\n")
    with ledger.case("bad_input", f"prepare {name}", "error naming file and line"):
        with pytest.raises(InputFileError) as err:
            prepare(
                [(str(path), "auto")],
                *(str(tmp_path / f) for f in ("train.jsonl", "eval.jsonl", "rejects.jsonl", "stats.json")),
                eval_fraction=0.0,
                eval_max=None,
                seed=0,
                max_conversations=None,
            )
        message = str(err.value)
        assert str(path) in message and all(s in message for s in FILE_ERRORS[name]), message
        assert not (tmp_path / "stats.json").exists()  # nothing half-written


def _parquet_bytes() -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instruction": f"Question {i}? " * 20, "output": f"Answer {i}. " * 20} for i in range(200)]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_struct_array(pa.array(rows)), buffer)
    return buffer.getvalue()


def _packed_file(name: str, folder: Path) -> Path:
    """A compressed or Parquet input broken as downloads and full disks break them."""
    import gzip

    import zstandard

    path = folder / name
    jsonl = (BAD / "records.jsonl").read_bytes()
    if name == "truncated.jsonl.gz":
        data = gzip.compress(jsonl)
        path.write_bytes(data[: len(data) // 2])
    elif name == "not_gzip.jsonl.gz":
        path.write_bytes(jsonl)  # named .gz, never compressed
    elif name == "truncated.jsonl.zst":
        data = zstandard.ZstdCompressor().compress(jsonl)
        path.write_bytes(data[: len(data) // 2])
    elif name == "truncated.parquet":
        data = _parquet_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif name == "corrupt.parquet":  # a page overwritten in the middle, the footer intact
        data = bytearray(_parquet_bytes())
        third = len(data) // 3
        data[third : third + 64] = b"\xff" * 64
        path.write_bytes(bytes(data))
    elif name == "dataset_without_parquet":
        (path / "data").mkdir(parents=True)
        (path / "data" / "README.md").write_text("no shards here\n")
    elif name == "empty_list.json":
        path.write_text("[]\n")
    return path


PACKED_ERRORS = {  # file -> (error class name, substrings the error must hold besides the path)
    "truncated.jsonl.gz": ("InputFileError", "truncated gzip stream"),
    "not_gzip.jsonl.gz": ("InputFileError", "Not a gzipped file"),
    "truncated.jsonl.zst": ("InputFileError", "truncated zstd stream"),
    "truncated.parquet": ("InputFileError", "truncated Parquet file"),
    "corrupt.parquet": ("InputFileError", "corrupt or truncated Parquet file"),
    "dataset_without_parquet": ("InputFileError", "holds no *.parquet files"),
    "empty_list.json": ("EmptyDataError", "read 0, rejected 0"),
}


@pytest.mark.parametrize("name", sorted(PACKED_ERRORS))
def test_broken_compressed_parquet_or_empty_input_is_a_clear_error(name, tmp_path, ledger):
    kind, words = PACKED_ERRORS[name]
    expect = "error naming files and reject counts" if kind == "EmptyDataError" else "error naming file"
    path = _packed_file(name, tmp_path)
    with ledger.case("bad_input", f"prepare {name}", expect):
        with pytest.raises(ValueError) as err:
            prepare(
                [(str(path), "auto")],
                *(str(tmp_path / f) for f in ("train.jsonl", "eval.jsonl", "rejects.jsonl", "stats.json")),
                eval_fraction=0.0,
                eval_max=None,
                seed=0,
                max_conversations=None,
            )
        assert type(err.value).__name__ == kind
        assert str(path) in str(err.value) and words in str(err.value), str(err.value)
        assert not (tmp_path / "stats.json").exists()  # nothing half-written


def test_malformed_prepared_split_names_file_line_and_field(tokenizer_dir, tmp_path, ledger):
    with ledger.case("bad_input", "tokenize prepared_bad.jsonl", "error naming file, line, field"):
        with pytest.raises(ValueError, match=r"prepared_bad\.jsonl:2: field 'messages\[0\]'"):
            tokenize_split(
                str(BAD / "prepared_bad.jsonl"),
                str(tokenizer_dir),
                [str(tmp_path / "shard-00000.zarr")],
                str(tmp_path / "rejects.jsonl"),
                str(tmp_path / "stats.json"),
                split="train",
                max_length=MAX_LENGTH,
                model_id="tiny",
            )
        assert not (tmp_path / "shard-00000.zarr").exists()


# --------------------------------------------------------------------------- model / tokenizer
def test_tokenizer_without_chat_template(tokenizer_dir, tmp_path, ledger):
    folder = tmp_path / "no_template"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):  # chat_template.jinja left out
        shutil.copy(tokenizer_dir / name, folder / name)
    with ledger.case("bad_input", "tokenizer without chat template", "error naming the dir"):
        with pytest.raises(ValueError, match="has no chat template") as err:
            load_tokenizer(folder)
        assert str(folder) in str(err.value)


@pytest.mark.parametrize("what", ["missing_dir", "dir_without_files"])
def test_model_path_that_does_not_exist(tmp_path, what, ledger):
    from eyas.extract.hf_backend import extract_shard

    model = tmp_path / "no_such_model"
    if what == "dir_without_files":
        model.mkdir()
    with ledger.case("bad_input", f"model path: {what}", "error naming the path, no hub lookup"):
        for call in (
            lambda: load_tokenizer(model),
            lambda: read_config(model),
            lambda: extract_shard(
                "t.zarr", str(tmp_path / "o.zarr"), str(model), layer_ids=[0], model_id="m"
            ),
        ):
            with pytest.raises((FileNotFoundError, ValueError)) as err:
                call()
            assert str(model) in str(err.value), err.value


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("name", sorted(CONFIG_ERRORS))
def test_bad_config_names_file_and_key(name, ledger):
    path = BAD / "configs" / name
    with ledger.case("bad_input", f"config {name}", "ConfigError naming file and key"):
        with pytest.raises(ConfigError) as err:
            load_config_file(path)
        message = str(err.value)
        assert str(path) in message and CONFIG_ERRORS[name] in message, message
