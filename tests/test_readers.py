"""Input file formats (eyas.data.readers): compressed JSONL and Parquet give prepare the same records,
rejects and counts as the plain files; corrupt and truncated files are errors naming them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from eyas.data import readers
from eyas.data.prepare import EmptyDataError, prepare
from eyas.data.readers import InputFileError, read_records

RAW = Path(__file__).parent / "data" / "raw"
JSONL_FILES = ("sharegpt.jsonl", "openai.jsonl", "bad.jsonl")


def run_prepare(out: Path, inputs) -> tuple[dict, list[dict], list[dict]]:
    out.mkdir(parents=True, exist_ok=True)
    stats = prepare(
        [(str(p), f) for p, f in inputs],
        *(str(out / f) for f in ("train.jsonl", "eval.jsonl", "rejects.jsonl", "stats.json")),
        eval_fraction=0.0,
        eval_max=None,
        seed=0,
        max_conversations=None,
    )
    kept = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    return stats, kept, rejects


def _position(source: str) -> str:
    return source.rsplit(":", 1)[1]


def _same_outcome(plain, other) -> None:
    """The same counts, the same conversations and rejects at the same positions (only paths differ)."""
    (stats, kept, rejects), (stats2, kept2, rejects2) = plain, other
    for key in ("read", "kept", "rejected", "over_cap", "by_reason", "splits"):
        assert stats2[key] == stats[key], key
    assert [(c["id"], c["messages"], c["tools"], _position(c["source"])) for c in kept2] == [
        (c["id"], c["messages"], c["tools"], _position(c["source"])) for c in kept
    ]
    assert [(r["reason"], _position(r["source"])) for r in rejects2] == [
        (r["reason"], _position(r["source"])) for r in rejects
    ]


def _zstd_bytes(data: bytes, frames: int = 1) -> bytes:
    """`data` compressed as `frames` zstd frames one after another (as `cat a.zst b.zst` makes)."""
    step = -(-len(data) // frames)
    compressor = zstandard.ZstdCompressor()
    return b"".join(compressor.compress(data[i : i + step]) for i in range(0, len(data), step))


@pytest.mark.parametrize("name", JSONL_FILES)
@pytest.mark.parametrize("codec", ["gz", "zst"])
def test_compressed_jsonl_same_as_plain(name, codec, tmp_path):
    data = (RAW / name).read_bytes()
    packed = tmp_path / f"{name}.{codec}"
    packed.write_bytes(gzip.compress(data) if codec == "gz" else _zstd_bytes(data, frames=2))
    plain = run_prepare(tmp_path / "plain", [(RAW / name, "auto")])
    assert plain[0]["kept"] > 0
    _same_outcome(plain, run_prepare(tmp_path / "packed", [(packed, "auto")]))


def _json_records(path: Path) -> list[dict]:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# OpenAI records with one type per field, as a Parquet column needs (the raw file mixes string and
# list contents): tool calls, tool turns and tools only in some rows and turns.
OPENAI_ROWS = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
    {
        "id": "oa-2",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
                ],
            },
            {"role": "tool", "content": '{"temp_c": 3}'},
            {"role": "assistant", "content": "3 °C."},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather"}}],
    },
    {"messages": [{"role": "user", "content": "Bye"}]},  # rejected: no assistant turn
]


def _table(records: list[dict]) -> pa.Table:
    """Rows as `datasets` writes them: one schema holding every key of every row (from_pylist would
    take the first row's keys only)."""
    return pa.Table.from_struct_array(pa.array(records))


@pytest.mark.parametrize(("name", "fmt"), [("sharegpt.jsonl", "sharegpt"), ("openai", "auto")])
def test_parquet_same_as_jsonl(name, fmt, tmp_path):
    """Rows written by pyarrow from the JSONL records; keys absent from some rows read back as nulls,
    which the reader takes as absent again."""
    if name == "openai":
        name = tmp_path / "openai.jsonl"
        name.write_text("".join(json.dumps(r) + "\n" for r in OPENAI_ROWS))
    jsonl = RAW / name
    path = tmp_path / "records.parquet"
    pq.write_table(_table(_json_records(jsonl)), path, row_group_size=1)
    plain = run_prepare(tmp_path / "plain", [(jsonl, fmt)])
    assert plain[0]["kept"] >= 2
    parquet = run_prepare(tmp_path / "parquet", [(path, fmt)])
    # JSONL sources are 1-based lines, Parquet sources 0-based rows: compare after the shift.
    for row in parquet[1] + parquet[2]:
        row["source"] = f"{path}:{int(_position(row['source'])) + 1}"
    _same_outcome(plain, parquet)


def test_alpaca_parquet_dataset_dir_in_shards(tmp_path, monkeypatch):
    """A directory as `datasets` writes it, shards named `train-0000N-of-00003.parquet`, read a few rows
    at a time; sources name the shard and its row."""
    monkeypatch.setattr(readers, "PARQUET_BATCH_ROWS", 1)  # several batches per shard: streamed
    records = [
        dict(r, id=f"r{i}", instruction=f"{r['instruction']} ({i})")
        for i, r in enumerate(_json_records(RAW / "alpaca.json") * 3)
    ]
    (tmp_path / "ds" / "data").mkdir(parents=True)
    shards = [records[i::3] for i in range(3)]
    for n, rows in enumerate(shards):
        pq.write_table(_table(rows), tmp_path / "ds" / "data" / f"train-{n:05d}-of-00003.parquet")
    stats, kept, _ = run_prepare(tmp_path / "out", [(tmp_path / "ds", "alpaca")])
    assert stats["read"] == len(records) == stats["kept"] + stats["rejected"]
    assert [c["id"] for c in kept] == [r["id"] for rows in shards for r in rows]
    assert kept[1]["source"] == f"{tmp_path / 'ds' / 'data' / 'train-00000-of-00003.parquet'}:1"
    assert list(stats["by_file"]) == [str(tmp_path / "ds")]


def test_parquet_binary_value_is_a_row_reject(tmp_path):
    path = tmp_path / "binary.parquet"
    rows = [
        {"instruction": "Say hi.", "output": "Hi!", "blob": None},
        {"instruction": "Say bye.", "output": "Bye!", "blob": b"\x00\x01"},
    ]
    pq.write_table(_table(rows), path)
    stats, kept, rejects = run_prepare(tmp_path / "out", [(path, "auto")])
    assert (stats["kept"], stats["rejected"]) == (1, 1)
    assert rejects[0]["source"] == f"{path}:1" and rejects[0]["reason"] == "wrong_type"
    assert "'blob' is binary" in rejects[0]["detail"] and rejects[0]["record"]["blob"] == "(2 bytes)"


def test_directory_without_parquet_is_an_error(tmp_path):
    (tmp_path / "ds").mkdir()
    with pytest.raises(InputFileError, match=r"ds: directory holds no \*\.parquet files"):
        read_records(tmp_path / "ds")


@pytest.mark.parametrize("content", ["[]\n", '[{"instruction": "hi", "output": ""}]\n'])
def test_no_conversation_kept_is_an_error_naming_files_and_counts(content, tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(content)
    path.with_name("also.json").write_text("[]\n")
    with pytest.raises(EmptyDataError) as err:
        run_prepare(tmp_path / "out", [(path, "auto"), (path.with_name("also.json"), "auto")])
    message = str(err.value)
    rejected = 0 if content == "[]\n" else 1
    assert f"{path}: read {rejected}, rejected {rejected}" in message, message
    assert "also.json" in message
    assert ("empty_turn 1" if rejected else "rejects by reason: none") in message, message
    assert not (tmp_path / "out" / "stats.json").exists()


def test_config_accepts_a_parquet_dataset_dir_as_an_input_file(tmp_path):
    from eyas.config import ConfigError, check_local_paths

    (tmp_path / "ds" / "data").mkdir(parents=True)
    with pytest.raises(ConfigError, match="data.inputs.0..path: .* is a directory, not a file"):
        check_local_paths([("data.inputs[0].path", str(tmp_path / "ds"))])
    pq.write_table(_table(OPENAI_ROWS[:1]), tmp_path / "ds" / "data" / "train-00000-of-00001.parquet")
    check_local_paths([("data.inputs[0].path", str(tmp_path / "ds"))])


def test_dataset_dir_written_by_hf_datasets(tmp_path):
    """Shards that Hugging Face `datasets` wrote (tests/data/hf_parquet/make.py): 7 rows over 3 shards,
    `system` null in odd rows, the last row without an assistant turn."""
    folder = Path(__file__).parent / "data" / "hf_parquet"
    stats, kept, rejects = run_prepare(tmp_path, [(folder, "auto")])
    assert (stats["read"], stats["kept"], stats["rejected"]) == (7, 6, 1)
    assert [m["role"] for m in kept[0]["messages"]] == ["system", "user", "assistant"]
    assert [m["role"] for m in kept[1]["messages"]] == ["user", "assistant"]  # null system: absent
    assert kept[3]["source"] == f"{folder / 'data' / 'train-00001-of-00003.parquet'}:0"
    assert rejects[0]["source"] == f"{folder / 'data' / 'train-00002-of-00003.parquet'}:1"
    assert rejects[0]["reason"] == "no_assistant_turn"
