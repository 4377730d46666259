"""verl / Search-R1-style parquet rows as tasks.

Each row: ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model`` =
``{"style", "ground_truth"}`` and ``extra_info`` (``index``, ``split``). Search-R1's own files also carry
``id``, ``question`` and ``golden_answers`` columns. ``ground_truth`` comes in three shapes:
``{"target": [...]}`` (Search-R1), a string joining answers with ``<|answer_split|>``, or a plain
list/string. The rows hold no context paragraphs, so there is no distractor corpus: pair them with a
JSONL corpus or a search server.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agent_gym.envs.datasets.files import DatasetFormatError, open_binary
from agent_gym.envs.datasets.loading import unique_strings
from agent_gym.error import InvalidValue
from agent_gym.rewards import answer_rule_for_source
from agent_gym.tasks import Task, TaskSet

ANSWER_SEPARATOR = "<|answer_split|>"
# Search-R1's prompt template ends with "Question: {question}\n"; the question is what follows.
_QUESTION_MARKER = "Question:"


def load_searchr1_parquet(path: str | Path, data_source: str | Sequence[str] | None = None) -> TaskSet:
    """Tasks from a verl/Search-R1 parquet file (plain, .gz or .xz).

    Args:
        path: the parquet file.
        data_source: keep only rows of this source (or these sources), matched case-insensitively,
            e.g. ``"hotpotqa"`` or ``["nq", "tq"]``.

    Raises:
        DatasetNotAvailable: the file does not exist.
        DatasetFormatError: not parquet, a required column is missing, or ``data_source`` matches nothing.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    with open_binary(path) as handle:
        try:
            rows = pq.read_table(io.BytesIO(handle.read())).to_pylist()
        except (pa.ArrowInvalid, OSError) as error:
            raise DatasetFormatError(f"{path}: not a readable parquet file ({error})") from error
    if data_source is not None:
        rows = _select_sources(rows, data_source, path)
    tasks = []
    seen_ids: set[str] = set()
    for row_index, row in enumerate(rows):
        try:
            task = task_from_row(row, row_index)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise DatasetFormatError(
                f"{path}: row {row_index} is not a Search-R1-style row: {type(error).__name__}: {error}"
            ) from error
        if task.id in seen_ids:  # merged files may repeat per-source ids such as "test_0"
            task = dataclasses.replace(task, id=f"{task.id}@{row_index}")
        seen_ids.add(task.id)
        tasks.append(task)
    return TaskSet(tasks, name=f"searchr1:{path.name}")


def task_from_row(row: dict[str, Any], row_index: int = 0) -> Task:
    """One parquet row as a :class:`Task` (``kind`` is its ``data_source``; ``metadata["answer_rule"]`` its
    scorer's rule, which a ToolEnv uses unless its reward spec sets one)."""
    source = str(row.get("data_source") or "")
    extra_info = dict(row.get("extra_info") or {})
    messages = [dict(message) for message in row.get("prompt") or []]
    answers = _answers(row)
    if not answers:
        raise InvalidValue("no gold answer in reward_model.ground_truth or golden_answers")
    return Task(
        id=_row_id(row, source, extra_info, row_index),
        question=str(row.get("question") or _question_from_prompt(messages)).strip(),
        answers=answers,
        kind=source,
        metadata={
            "dataset": source,
            "answer_rule": answer_rule_for_source(source),  # the env scores the row as its source's scorer does
            "split": extra_info.get("split"),
            "ability": row.get("ability"),
            "reward_style": (row.get("reward_model") or {}).get("style"),
            "extra_info": extra_info,
            "prompt": messages,
        },
    )


def _select_sources(
    rows: list[dict[str, Any]], wanted: str | Sequence[str], path: Path
) -> list[dict[str, Any]]:
    names = {wanted.lower()} if isinstance(wanted, str) else {name.lower() for name in wanted}
    selected = [row for row in rows if str(row.get("data_source", "")).lower() in names]
    if not selected:
        available = sorted({str(row.get("data_source")) for row in rows})
        raise DatasetFormatError(f"{path}: no rows with data_source in {sorted(names)}; it has {available}")
    return selected


def _answers(row: dict[str, Any]) -> tuple[str, ...]:
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if isinstance(truth, dict):
        truth = truth.get("target")
    if truth is None:
        truth = row.get("golden_answers")
    return unique_strings(_flatten(truth))


def _flatten(value: Any) -> Iterable[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return value.split(ANSWER_SEPARATOR)
    if hasattr(value, "tolist"):  # numpy arrays, as pandas writes list columns
        value = value.tolist()
    return [part for item in value for part in _flatten(item)]


def _question_from_prompt(messages: list[dict[str, Any]]) -> str:
    user_turns = [str(message.get("content", "")) for message in messages if message.get("role") == "user"]
    if not user_turns:
        raise InvalidValue("prompt has no user message and the row has no question column")
    content = user_turns[-1]
    return content.rsplit(_QUESTION_MARKER, 1)[1] if _QUESTION_MARKER in content else content


def _row_id(row: dict[str, Any], source: str, extra_info: dict[str, Any], row_index: int) -> str:
    raw = row.get("id")
    if raw is None:
        raw = extra_info.get("index", row_index)
    raw = str(raw)
    return raw if not source or raw.startswith(f"{source}_") else f"{source}_{raw}"
