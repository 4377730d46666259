"""The Agent-R1 paper's multi-hop QA datasets as tasks plus their distractor corpora.

    tasks, corpus = load_dataset("hotpotqa", split="dev")                 # fetched on first use
    tasks, corpus = load_dataset("musique", data_path="musique_ans_v1.0_dev.jsonl.xz")
    tasks = load_searchr1_parquet("test.parquet", data_source="hotpotqa")  # no corpus in those rows

``tasks`` is a :class:`~agent_gym.tasks.TaskSet`; ``corpus`` is a list of ``{"id", "title", "text"}``
documents: the union of the split's context paragraphs (see :mod:`.distractor_corpus`). Each dataset
module also exposes ``task_from_record`` and ``context_paragraphs`` for callers with their own records.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from agent_gym.envs.datasets.distractor_corpus import DistractorCorpus, build_distractor_corpus, document_id
from agent_gym.envs.datasets.download import (
    DATASET_NAMES,
    DatasetChecksumError,
    DatasetNotAvailable,
    cache_dir,
    canonical_name,
    expected_path,
    fetch,
)
from agent_gym.envs.datasets.files import DatasetFormatError
from agent_gym.envs.datasets.hotpotqa import load_hotpotqa
from agent_gym.envs.datasets.musique import load_musique
from agent_gym.envs.datasets.searchr1_parquet import load_searchr1_parquet
from agent_gym.envs.datasets.twowiki import load_2wikimultihopqa
from agent_gym.error import InvalidValue
from agent_gym.tasks import TaskSet

_LOADERS = {"hotpotqa": load_hotpotqa, "2wikimultihopqa": load_2wikimultihopqa, "musique": load_musique}


def load_dataset(
    name: str,
    split: str = "dev",
    data_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> tuple[TaskSet, list[dict[str, str]]]:
    """Load a multi-hop QA split: ``(tasks, distractor corpus)``.

    Args:
        name: ``"hotpotqa"``, ``"2wikimultihopqa"`` or ``"musique"`` (aliases such as ``"2wiki"`` work).
        split: ``"dev"`` or ``"train"`` (``"validation"`` means dev).
        data_path: an official file (plain, .gz or .xz) or a folder holding it; nothing is downloaded then.
        cache_dir: cache root for downloads (default ``$AGENT_GYM_DATA_DIR``, ``$AGENT_GYM_CACHE`` or
            ``~/.cache/agent-gym``).
        options: passed to the dataset's loader, e.g. ``limit=``, ``source="hf"`` (HotpotQA, MuSiQue),
            ``aliases_path=`` (2WikiMultihopQA).

    Raises:
        ValueError: unknown name or split, or an option the dataset's loader does not take.
        DatasetNotAvailable: the file is missing and cannot be downloaded; the message says where to put it.
        DatasetFormatError: the file is not in the dataset's official layout.
    """
    loader = _LOADERS[canonical_name(name)]
    accepted = set(inspect.signature(loader).parameters)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise InvalidValue(
            f"{canonical_name(name)} takes no option {', '.join(unknown)}; it takes {sorted(accepted)}"
        )
    return loader(split, data_path, cache_dir, **options)


__all__ = [
    "DATASET_NAMES",
    "DatasetChecksumError",
    "DatasetFormatError",
    "DatasetNotAvailable",
    "DistractorCorpus",
    "build_distractor_corpus",
    "cache_dir",
    "document_id",
    "expected_path",
    "fetch",
    "load_2wikimultihopqa",
    "load_dataset",
    "load_hotpotqa",
    "load_musique",
    "load_searchr1_parquet",
]
