"""HotpotQA (Yang et al., 2018), distractor setting: official JSON files or Hub rows.

Official layout: ``_id``, ``question``, ``answer``, ``type`` (bridge / comparison), ``level``,
``supporting_facts`` = ``[[title, sentence_id], ...]``, ``context`` = ``[[title, [sentence, ...]], ...]``.
HotpotQA has no gold decomposition, so tasks carry none; ``supporting_titles`` is what a search needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_gym.envs.datasets.distractor_corpus import document_id
from agent_gym.envs.datasets.download import canonical_setting, canonical_split
from agent_gym.envs.datasets.files import DatasetFormatError
from agent_gym.envs.datasets.loading import Record, Source, build_split, read_split_records, unique_strings
from agent_gym.tasks import Task, TaskSet

NAME = "hotpotqa"
LAYOUT = ('a JSON array of HotpotQA records {"_id", "question", "answer", "supporting_facts": [[title, sentence_id], '
          '...], "context": [[title, [sentence, ...]], ...], "type", "level"}')


def refuse_distractor_file(path: Path) -> None:
    """Raise :class:`DatasetFormatError` if ``path``, given for the fullwiki setting, is named as a distractor file.

    The two dev files share their layout and questions, so only the name tells them apart; reading
    hotpot_dev_distractor_v1.json as fullwiki would label the easy setting's scores as the hard one's.
    """
    if "distractor" in path.name:
        raise DatasetFormatError(
            f"{path} is the distractor setting's file, not the fullwiki one: setting='fullwiki' reads "
            "hotpot_dev_fullwiki_v1.json (pass it, or a folder holding it, as data_path), or drop setting= to "
            "play this file's distractor setting"
        )


def task_from_record(record: Record, split: str = "dev", setting: str = "distractor") -> Task:
    """One official HotpotQA record as a :class:`Task` (context paragraphs go to the corpus, not here)."""
    supporting_facts = [[str(title), int(sentence_id)] for title, sentence_id in record["supporting_facts"]]
    supporting_titles = tuple(dict.fromkeys(title for title, _ in supporting_facts))
    return Task(
        id=str(record["_id"]),
        question=str(record["question"]),
        answers=unique_strings([record["answer"]]),
        supporting_titles=supporting_titles,
        kind=str(record.get("type", "")),
        metadata={
            "dataset": NAME,
            "split": split,
            "setting": setting,
            "type": record.get("type"),
            "level": record.get("level"),
            "supporting_facts": supporting_facts,
            "supporting_doc_ids": [document_id(title) for title in supporting_titles],
        },
    )


def context_paragraphs(record: Record) -> Iterator[tuple[str, str]]:
    """``(title, text)`` of each context paragraph.

    HotpotQA's sentences are character spans of the original paragraph and keep their leading
    spaces, so plain concatenation restores the paragraph exactly (inserting spaces would double them).
    """
    for title, sentences in record["context"]:
        yield str(title), "".join(sentences)


def record_from_hub_row(row: dict[str, Any]) -> Record:
    """Map a ``hotpotqa/hotpot_qa`` Hub row (columnar ``supporting_facts``, ``context``) to the
    official layout."""
    facts, context = row["supporting_facts"], row["context"]
    return {
        "_id": row["id"],
        "question": row["question"],
        "answer": row["answer"],
        "type": row.get("type"),
        "level": row.get("level"),
        "supporting_facts": [list(pair) for pair in zip(facts["title"], facts["sent_id"], strict=True)],
        "context": [
            [title, list(sentences)]
            for title, sentences in zip(context["title"], context["sentences"], strict=True)
        ],
    }


def load_hotpotqa(
    split: str = "dev",
    data_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    *,
    setting: str = "distractor",
    source: Source = "official",
    limit: int | None = None,
) -> tuple[TaskSet, list[dict[str, str]]]:
    """HotpotQA tasks and their distractor corpus (deduplicated by title).

    Args:
        split: ``"dev"`` (hotpot_dev_distractor_v1.json) or ``"train"`` (hotpot_train_v1.1.json).
        data_path: the JSON file (plain, .gz or .xz) or a folder holding it; nothing is downloaded then.
        cache_dir: cache root for the download (default :func:`download.cache_dir`).
        setting: ``"distractor"``, or ``"fullwiki"``: hotpot_dev_fullwiki_v1.json, the same questions with
            the paragraphs an IR system retrieved from all of Wikipedia as context (looked for in ``data_path``'s
            folder or the cache, downloaded if missing); training uses the one training file in both settings.
        source: ``"official"`` file, or ``"hf"`` for ``hotpotqa/hotpot_qa`` via the ``datasets`` library.
        limit: keep only the first ``limit`` questions (and their paragraphs).
    """
    split = canonical_split(split)
    setting = canonical_setting(NAME, setting) or "distractor"
    records, path = read_split_records(NAME, split, data_path, cache_dir, source, record_from_hub_row,
                                       setting=setting, layout=LAYOUT)
    if setting == "fullwiki" and split == "dev" and path is not None:
        refuse_distractor_file(path)
    return build_split(
        records,
        name=NAME,
        split=split,
        task_from_record=lambda record: task_from_record(record, split, setting),
        context_paragraphs=context_paragraphs,
        dedupe_by="title",
        limit=limit,
        origin=str(path or "the Hugging Face Hub"),
        layout=LAYOUT,
    )
