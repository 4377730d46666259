"""Read dataset files: JSON arrays or JSON Lines, plain or compressed with gzip or xz.

Compression is recognised by the file's magic bytes, not its name, so a renamed file still loads.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
from pathlib import Path
from typing import IO, Any

from agent_gym.envs.datasets.download import DatasetNotAvailable
from agent_gym.error import AgentGymError
from agent_gym.jsonl import iter_jsonl

_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"


class DatasetFormatError(AgentGymError, ValueError):
    """A dataset file is readable but its content is not the layout the loader expects."""


def open_binary(path: str | Path) -> IO[bytes]:
    """Open ``path`` for reading bytes, decompressing gzip or xz transparently.

    Raises:
        DatasetNotAvailable: the file does not exist (the message names the path).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotAvailable(f"dataset file not found: {path}")
    with path.open("rb") as handle:
        magic = handle.read(len(_XZ_MAGIC))
    if magic.startswith(_GZIP_MAGIC):
        return gzip.open(path, "rb")
    if magic.startswith(_XZ_MAGIC):
        return lzma.open(path, "rb")
    return path.open("rb")


def read_json_records(path: str | Path, layout: str = "") -> list[dict[str, Any]]:
    """Read a file of records: a JSON array of objects, or JSON Lines (one object per line).

    ``layout`` describes the records the caller expects; error messages end with it.

    Raises:
        DatasetNotAvailable: the file does not exist.
        DatasetFormatError: the content is not valid JSON / JSONL of objects; says where, in a short message.
    """
    path = Path(path)
    expected = f"; expected {layout}" if layout else ""
    with open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8") as text:
        try:
            content = text.read()
        except (UnicodeDecodeError, EOFError, lzma.LZMAError, OSError) as error:
            raise DatasetFormatError(f"{path}: cannot read as UTF-8 text ({error}){expected}") from error
    stripped = content.lstrip()
    if not stripped:
        raise DatasetFormatError(f"{path}: file is empty{expected}")
    if stripped[0] == "[":
        try:
            records = json.loads(content)
        except json.JSONDecodeError as error:
            raise DatasetFormatError(f"{path}: invalid JSON ({error}){expected}") from error
    else:
        records = _parse_json_lines(path, content, expected)
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise DatasetFormatError(f"{path}: record {index} is {type(record).__name__}, not an object{expected}")
    if len(records) == 1 and records[0] and all(isinstance(value, dict) for value in records[0].values()):
        raise DatasetFormatError(
            f"{path}: one JSON object of objects, a table of columns (pandas' DataFrame.to_json default), not "
            f"records: write it with to_json(orient='records') or to_json(orient='records', lines=True){expected}"
        )
    return records


def _parse_json_lines(path: Path, content: str, expected: str) -> list[Any]:
    try:
        return [record for _, record in iter_jsonl(content.splitlines(), path, DatasetFormatError)]
    except DatasetFormatError as error:
        try:  # maybe one JSON object spread over lines (an indented dump)
            return [json.loads(content)]
        except json.JSONDecodeError:
            raise DatasetFormatError(f"{error}{expected}") from None
