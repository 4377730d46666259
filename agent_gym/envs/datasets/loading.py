"""The two steps every multi-hop QA loader shares: find and read a split's records, then turn them
into a :class:`TaskSet` and its distractor corpus."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from tqdm.auto import tqdm

from agent_gym.envs.datasets.distractor_corpus import DedupeKey, build_distractor_corpus
from agent_gym.envs.datasets.download import (
    DatasetNotAvailable,
    canonical_name,
    canonical_split,
    fetch,
    fetch_hub_rows,
    find_data_file,
    remote_file,
)
from agent_gym.envs.datasets.files import DatasetFormatError, read_json_records
from agent_gym.error import InvalidValue
from agent_gym.tasks import Task, TaskSet

Record = dict[str, Any]
Source = Literal["official", "hf"]
# Converting a few thousand records is instant; show a bar only where it takes seconds (train splits).
_PROGRESS_MIN_RECORDS = 20_000


def resolve_data_file(
    name: str, split: str = "dev", data_path: str | Path | None = None, cache_dir: str | Path | None = None,
    setting: str | None = None,
) -> Path:
    """The file to read: ``data_path`` (a file, or a folder holding the official file name) if given,
    else the cached official file, downloaded on first use. With ``data_path`` nothing is downloaded.
    ``setting`` picks a setting's file (HotpotQA's ``fullwiki``) in the folder or the cache.

    Raises:
        DatasetNotAvailable: the given path does not exist, or the file is not cached and cannot be fetched.
    """
    if data_path is None:
        return fetch(name, split, cache_dir, setting=setting)
    path = Path(data_path).expanduser()
    if path.is_dir():
        filename = remote_file(name, split, setting).filename
        found = find_data_file(path, filename)
        if found is None:
            raise DatasetNotAvailable(f"{path} is a folder without {filename} (or {filename}.gz / .xz)")
        return found
    if not path.is_file():
        raise DatasetNotAvailable(f"{canonical_name(name)} data file not found: {path}")
    return path


def read_split_records(
    name: str,
    split: str = "dev",
    data_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    source: Source = "official",
    record_from_hub_row: Callable[[Record], Record] | None = None,
    setting: str | None = None,
    layout: str = "",
) -> tuple[list[Record], Path | None]:
    """Read a split's raw records, and the file they came from (None for Hub rows).

    ``source="hf"`` loads the split through the ``datasets`` library and maps each row to the official
    layout with ``record_from_hub_row``; ``data_path`` always wins over ``source``.
    """
    if source not in ("official", "hf"):
        raise InvalidValue(f"source must be 'official' or 'hf', not {source!r}")
    if source == "hf" and data_path is None:
        convert = record_from_hub_row or dict
        return [convert(row) for row in fetch_hub_rows(name, split, setting)], None
    path = resolve_data_file(name, split, data_path, cache_dir, setting)
    return read_json_records(path, layout), path


def build_split(
    records: Sequence[Record],
    *,
    name: str,
    split: str,
    task_from_record: Callable[[Record], Task],
    context_paragraphs: Callable[[Record], Iterable[tuple[str, str]]],
    dedupe_by: DedupeKey,
    limit: int | None = None,
    origin: str = "",
    layout: str = "",
) -> tuple[TaskSet, list[dict[str, str]]]:
    """Turn records into (tasks, distractor corpus); the corpus holds only the kept records' contexts.

    Raises:
        DatasetFormatError: a record lacks a field or has the wrong shape; the message names the record, the
            file (``origin``) and the expected ``layout``, and stays short whatever the record holds.
    """
    if limit is not None:
        if limit < 0:
            raise InvalidValue(f"limit must be >= 0, not {limit}")
        records = records[:limit]
    name, split = canonical_name(name), canonical_split(split)
    tasks: list[Task] = []
    paragraphs: list[tuple[str, str]] = []
    progress = tqdm(records, desc=f"{name} {split}", unit="q", disable=len(records) < _PROGRESS_MIN_RECORDS)
    for index, record in enumerate(progress):
        try:
            tasks.append(task_from_record(record))
            paragraphs.extend(context_paragraphs(record))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            record_id = record.get("_id", record.get("id", "?")) if isinstance(record, dict) else "?"
            where = f" in {origin}" if origin else ""
            expected = f"; expected {layout}" if layout else ""
            raise DatasetFormatError(
                f"{name} record {index} (id {shorten(repr(record_id), 60)}){where} does not have the official "
                f"layout ({type(error).__name__}: {shorten(str(error), 160)}){expected}"
            ) from error
    try:
        task_set = TaskSet(tasks, name=f"{name}-{split}")
    except ValueError as error:
        raise DatasetFormatError(f"{name} {split}{' in ' + origin if origin else ''}: {error}") from error
    return task_set, build_distractor_corpus(paragraphs, dedupe_by).documents


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, marking the cut (record fields can be megabytes)."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def unique_strings(values: Iterable[Any]) -> tuple[str, ...]:
    """Non-empty, stripped strings in first-seen order (for answers, aliases and titles)."""
    seen: dict[str, None] = {}
    for value in values:
        text = str(value).strip()
        if text:
            seen.setdefault(text, None)
    return tuple(seen)
