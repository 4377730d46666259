"""2WikiMultihopQA (Ho et al., 2020): official ``dev.json`` / ``train.json``.

Official layout: HotpotQA's (``_id``, ``question``, ``answer``, ``type``, ``supporting_facts``, ``context``)
plus ``evidences`` = ``[[subject, relation, object], ...]``, ``evidences_id``, ``entity_ids`` and
``answer_id``. The evidence triples become the gold hops. Answer aliases come from the official
``id_aliases.json`` (keyed by ``answer_id``, as in 2wikimultihop_evaluate_v1.1.py) when it lies
beside the data file or is passed explicitly.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from agent_gym.envs.datasets.distractor_corpus import document_id
from agent_gym.envs.datasets.download import canonical_split
from agent_gym.envs.datasets.files import read_json_records
from agent_gym.envs.datasets.loading import Record, build_split, read_split_records, unique_strings
from agent_gym.tasks import Hop, Task, TaskSet

NAME = "2wikimultihopqa"
LAYOUT = ('a JSON array of 2WikiMultihopQA records {"_id", "question", "answer", "type", "supporting_facts": '
          '[[title, sentence_id], ...], "context": [[title, [sentence, ...]], ...], "evidences", "answer_id"}')
ALIASES_FILENAME = "id_aliases.json"
_TRAILING_PARENTHESIS = re.compile(r"\s*\([^()]*\)\s*$")
_warned_without_aliases: set[str] = set()  # data files already warned about, so the warning shows once


def warn_without_aliases(origin: str) -> None:
    """Say, once per data file, that answers will be scored without the official aliases."""
    if origin in _warned_without_aliases:
        return
    _warned_without_aliases.add(origin)
    warnings.warn(
        f"2WikiMultihopQA: no {ALIASES_FILENAME} beside {origin} and no aliases_path=: answers are scored against "
        "the main answer only, while the official scorer also accepts each answer's aliases (measured: 57 EM and "
        f"109 F1 differences in 1,500 answer pairs). Put the official {ALIASES_FILENAME} beside the data file or "
        "pass aliases_path=.",
        UserWarning,
        stacklevel=3,
    )


def read_id_aliases(path: str | Path) -> dict[str, tuple[str, ...]]:
    """Read the official ``id_aliases.json`` (JSON Lines of ``Q_id``, ``aliases``, ``demonyms``)."""
    table: dict[str, tuple[str, ...]] = {}
    for row in read_json_records(path):
        table[str(row["Q_id"])] = unique_strings([*row.get("aliases", []), *row.get("demonyms", [])])
    return table


def task_from_record(
    record: Record, split: str = "dev", id_aliases: Mapping[str, Sequence[str]] | None = None
) -> Task:
    """One official 2WikiMultihopQA record as a :class:`Task`."""
    supporting_facts = [[str(title), int(sentence_id)] for title, sentence_id in record["supporting_facts"]]
    supporting_titles = tuple(dict.fromkeys(title for title, _ in supporting_facts))
    answer_id = record.get("answer_id")
    aliases = (id_aliases or {}).get(str(answer_id), ()) if answer_id else ()
    evidences = [[str(part) for part in triple] for triple in record.get("evidences", [])]
    return Task(
        id=str(record["_id"]),
        question=str(record["question"]),
        answers=unique_strings([record["answer"], *aliases]),
        supporting_titles=supporting_titles,
        decomposition=_hops(evidences, supporting_titles),
        kind=str(record.get("type", "")),
        metadata={
            "dataset": NAME,
            "split": split,
            "type": record.get("type"),
            "supporting_facts": supporting_facts,
            "supporting_doc_ids": [document_id(title) for title in supporting_titles],
            "evidences": evidences,
            "evidences_id": record.get("evidences_id", []),
            "entity_ids": record.get("entity_ids"),
            "answer_id": answer_id,
        },
    )


def _hops(evidences: list[list[str]], supporting_titles: tuple[str, ...]) -> tuple[Hop, ...]:
    """One hop per evidence triple: query = the subject entity, answer = the object."""
    titles = evidence_titles([subject for subject, _, _ in evidences], supporting_titles)
    return tuple(
        Hop(
            question=f"{subject.strip()} >> {relation}",
            answer=obj.strip(),
            query=subject.strip(),
            title=title,
        )
        for (subject, relation, obj), title in zip(evidences, titles, strict=True)
    )


def evidence_titles(subjects: Sequence[str], titles: Sequence[str]) -> list[str]:
    """The supporting title each evidence subject is about, or ``""`` where none can be told.

    Subjects are Wikidata entity names, titles are page names: "Charles Saunders" is the page
    "Charles Saunders (director)", "Gerard I of Guelders" the page "Gerard I, Count of Guelders".
    Match exactly, then case-insensitively with a trailing parenthesis or a ", ..." qualifier removed.
    A subject still unmatched gets the one supporting title no subject matched, if there is exactly one
    such title and one such subject name (the names differ only by alias, e.g. "Tim Russert").
    """
    matched = [_title_for(subject, titles) for subject in subjects]
    leftover_titles = [title for title in titles if title not in matched]
    leftover_subjects = {subject for subject, title in zip(subjects, matched, strict=True) if not title}
    if len(leftover_titles) == 1 and len(leftover_subjects) == 1:
        matched = [title or leftover_titles[0] for title in matched]
    return matched


def _title_for(subject: str, titles: Sequence[str]) -> str:
    if subject in titles:
        return subject
    folded = subject.strip().casefold()
    for title in titles:
        page = title.casefold()
        if folded in (page, _TRAILING_PARENTHESIS.sub("", page), page.split(",", 1)[0].strip()):
            return title
    return ""


def context_paragraphs(record: Record) -> Iterator[tuple[str, str]]:
    """``(title, text)`` of each context paragraph.

    Unlike HotpotQA's, 2Wiki's sentences carry no leading space, so they are joined with one.
    """
    for title, sentences in record["context"]:
        yield str(title), " ".join(sentence.strip() for sentence in sentences if sentence.strip())


def load_2wikimultihopqa(
    split: str = "dev",
    data_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    *,
    aliases_path: str | Path | None = None,
    limit: int | None = None,
) -> tuple[TaskSet, list[dict[str, str]]]:
    """2WikiMultihopQA tasks and their distractor corpus (deduplicated by title).

    Args:
        split: ``"dev"`` (dev.json) or ``"train"`` (train.json).
        data_path: the JSON file (plain, .gz or .xz) or a folder holding it; nothing is downloaded then.
        cache_dir: cache root for the download (default :func:`download.cache_dir`).
        aliases_path: the official ``id_aliases.json``; by default the one beside the data file, if any.
        limit: keep only the first ``limit`` questions (and their paragraphs).
    """
    split = canonical_split(split)
    records, path = read_split_records(NAME, split, data_path, cache_dir, layout=LAYOUT)
    if aliases_path is None and path is not None:
        beside = path.parent / ALIASES_FILENAME
        aliases_path = beside if beside.is_file() else None
    if aliases_path is None:
        warn_without_aliases(str(path))
    id_aliases = read_id_aliases(aliases_path) if aliases_path is not None else {}
    return build_split(
        records,
        name=NAME,
        split=split,
        task_from_record=lambda record: task_from_record(record, split, id_aliases),
        context_paragraphs=context_paragraphs,
        dedupe_by="title",
        limit=limit,
        origin=str(path),
        layout=LAYOUT,
    )
