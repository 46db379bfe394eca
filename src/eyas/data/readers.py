"""Input files -> raw records, streamed: the file-format layer under `eyas.data.formats`.

| input                         | record source              | a bad record                      |
|-------------------------------|----------------------------|-----------------------------------|
| `.json` (a top-level list)    | `<file>:<index>`, 0-based  | (the file parses whole, or errors) |
| `.jsonl` / `.ndjson`          | `<file>:<line>`, 1-based   | `invalid_json` / `invalid_encoding` |
| `.jsonl.gz`, `.jsonl.zst`     | `<file>:<line>`, 1-based   | as `.jsonl`                       |
| `.parquet`                    | `<file>:<row>`, 0-based    | `wrong_type` (a binary value)     |
| a directory of `*.parquet`    | `<shard>:<row>`, 0-based   | as `.parquet`                     |

A `.json` file is read whole (it is one JSON value); everything else is streamed: a JSONL line or a
Parquet record batch at a time. A directory is read as Hugging Face `datasets` writes one
(`data/train-00000-of-00003.parquet`, ...): every `*.parquet` below it, in path order. A Parquet row is
the JSON record it stands for: struct columns are objects, list columns arrays, and a null value is an
absent key (a Parquet schema holds every key of every row, so a row without a key reads null there).

A file that cannot be read as records at all (not UTF-8 text, a `.json` that does not parse, a corrupt
or truncated compressed stream or Parquet file) is an `InputFileError` naming the file and, where there
is one, the position; records read before a corrupt stream's end are not used, since the stage fails.
"""

from __future__ import annotations

import datetime
import decimal
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.data.formats import RecordRejected

PARQUET_BATCH_ROWS = 1024  # rows decoded at a time: memory stays one batch, however large the file
COMPRESSED_CHUNK_BYTES = 1 << 20
EXTENSIONS = (".json", ".jsonl", ".ndjson", ".jsonl.gz", ".jsonl.zst", ".parquet")


class InputFileError(ValueError):
    """An input file that cannot be read as records at all (names the file and position)."""


@dataclass
class RawRecord:
    source: str  # "<file>:<line>" or "<file>:<index>"
    record: Any  # the parsed JSON value, or the raw line text when it did not parse
    error: RecordRejected | None = None  # set when the line could not be decoded or parsed


# Byte-order marks of the encodings a JSON file is most often saved in by mistake (UTF-32 first: its
# little-endian mark starts with UTF-16's).
_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def _check_not_wide(path: Path, head: bytes) -> None:
    """UTF-16/32 text splits into lines of NUL-interleaved bytes that each fail on their own; name the
    real problem once, for the whole file. JSON text never holds a raw NUL byte."""
    for bom, name in _WIDE_BOMS:
        if head.startswith(bom):
            raise InputFileError(f"{path}:1:1: file is {name} (byte-order mark); eyas reads UTF-8 only")
    nul = head.find(b"\x00")
    if nul >= 0:
        raise InputFileError(
            f"{path}:1:{nul + 1}: NUL byte: the file looks UTF-16/32 encoded (no "
            "byte-order mark); eyas reads UTF-8 only"
        )


def _loads(text: str) -> Any:
    """json.loads, with nesting too deep for Python's parser reported as a JSON error."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None


def _line_of_offset(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def _read_json_list(path: Path) -> Iterator[RawRecord]:
    data = path.read_bytes()
    _check_not_wide(path, data[:4096])
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line, col = _line_of_offset(data, err.start)
        raise InputFileError(f"{path}:{line}:{col}: not valid UTF-8 (byte {err.start})") from None
    try:
        records = _loads(text)
    except json.JSONDecodeError as err:
        raise InputFileError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    if not isinstance(records, list):
        raise InputFileError(f"{path}: top level is {type(records).__name__}, expected a list of records")
    for index, record in enumerate(records):
        yield RawRecord(f"{path}:{index}", record)


def _jsonl_records(path: Path, lines: Iterable[bytes]) -> Iterator[RawRecord]:
    """JSONL records of a file's byte lines (plain or decompressed)."""
    for number, raw in enumerate(lines, start=1):
        if number == 1:
            _check_not_wide(path, raw[:4096])
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte-order mark is not part of the first record
        if not raw.strip():
            continue
        source = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            text = raw.decode("utf-8", errors="replace")
            yield RawRecord(
                source, text, RecordRejected("invalid_encoding", f"byte {err.start}: {err.reason}")
            )
            continue
        try:
            yield RawRecord(source, _loads(line))
        except json.JSONDecodeError as err:
            yield RawRecord(source, line, RecordRejected("invalid_json", f"column {err.colno}: {err.msg}"))


def _read_jsonl(path: Path) -> Iterator[RawRecord]:
    with open(path, "rb") as fh:
        yield from _jsonl_records(path, fh)


def _split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Byte lines (with their b"\\n") of a stream given as chunks."""
    rest = b""
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line + b"\n"
    if rest:
        yield rest


def _gzip_chunks(path: Path) -> Iterator[bytes]:
    try:
        with gzip.open(path, "rb") as fh:
            while chunk := fh.read(COMPRESSED_CHUNK_BYTES):
                yield chunk
    except (EOFError, OSError, zlib.error) as err:  # EOFError: truncated; BadGzipFile is an OSError
        raise InputFileError(f"{path}: corrupt or truncated gzip stream: {err}") from None


def _zstd_chunks(path: Path) -> Iterator[bytes]:
    """Decompressed chunks of every zstd frame; a stream cut inside a frame is an error (zstandard's
    stream reader returns a short read without one, so frames are followed here)."""
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    started = False  # inside a frame: bytes of it read, its end not yet
    try:
        with open(path, "rb") as fh:
            while data := fh.read(COMPRESSED_CHUNK_BYTES):
                while data:
                    yield frame.decompress(data)
                    data = frame.unused_data if frame.eof else b""
                    if frame.eof:
                        frame = decompressor.decompressobj()
                        started = False
                    else:
                        started = True
    except zstandard.ZstdError as err:
        raise InputFileError(f"{path}: corrupt zstd stream: {err}") from None
    if started and not frame.eof:
        raise InputFileError(f"{path}: truncated zstd stream (the last frame has no end)")


def _jsonable(value: Any, column: str) -> Any:
    """A Parquet value as the JSON value it stands for: nulls are absent keys (see module docstring)."""
    if isinstance(value, dict):
        where = f"{column}." if column else ""
        return {k: _jsonable(v, where + k) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_jsonable(v, column) for v in value]
    if isinstance(value, datetime.date | datetime.time | datetime.timedelta | decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        raise RecordRejected("wrong_type", f"{column!r} is binary ({len(value)} bytes), expected text")
    return value


def _without_binary(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_binary(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_binary(v) for v in value]
    if isinstance(value, bytes):
        return f"({len(value)} bytes)"
    return value if isinstance(value, str | int | float | bool | None) else str(value)


def _parquet_records(path: Path) -> Iterator[RawRecord]:
    import pyarrow
    import pyarrow.parquet as pq

    row = 0
    try:
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for record in batch.to_pylist():
                source = f"{path}:{row}"
                row += 1
                try:
                    yield RawRecord(source, _jsonable(record, ""))
                except RecordRejected as err:  # the reject keeps the row, binary values as their size
                    yield RawRecord(source, _without_binary(record), err)
    except (pyarrow.ArrowException, OSError) as err:
        raise InputFileError(f"{path}: corrupt or truncated Parquet file (at row {row}): {err}") from None


def parquet_shards(folder: Path) -> list[Path]:
    """The Parquet files of a dataset directory, in path order (shard 00000 first)."""
    shards = sorted(p for p in folder.rglob("*.parquet") if p.is_file())
    if not shards:
        raise InputFileError(f"{folder}: directory holds no *.parquet files (a dataset directory is read)")
    return shards


def _read_parquet_dir(folder: Path) -> Iterator[RawRecord]:
    for shard in parquet_shards(folder):
        yield from _parquet_records(shard)


def read_records(path: str | os.PathLike) -> Iterator[RawRecord]:
    """Every record of one input file (or Parquet dataset directory), in file order."""
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: input file does not exist")
    if path.is_dir():
        parquet_shards(path)  # an empty directory is refused now, not at the first read
        return _read_parquet_dir(path)
    name = path.name.lower()
    if name.endswith(".json"):
        return _read_json_list(path)
    if name.endswith((".jsonl", ".ndjson")):
        return _read_jsonl(path)
    if name.endswith((".jsonl.gz", ".ndjson.gz")):
        return _jsonl_records(path, _split_lines(_gzip_chunks(path)))
    if name.endswith((".jsonl.zst", ".ndjson.zst")):
        return _jsonl_records(path, _split_lines(_zstd_chunks(path)))
    if name.endswith(".parquet"):
        return _parquet_records(path)
    raise InputFileError(
        f"{path}: unknown extension {''.join(path.suffixes[-2:])!r}; expected one of "
        + ", ".join(EXTENSIONS)
        + " or a directory of .parquet files"
    )
