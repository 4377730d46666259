"""MuSiQue-Ans (Trivedi et al., 2022): official ``musique_ans_v1.0_{dev,train}.jsonl`` or Hub rows.

Official layout (one JSON object per line): ``id`` (prefixed by its reasoning graph, e.g. ``3hop1__...``),
``question``, ``answer``, ``answer_aliases``, ``answerable``, ``paragraphs`` = 20 of
``{idx, title, paragraph_text, is_supporting}``, and ``question_decomposition`` = the single-hop
questions ``{id, question, answer, paragraph_support_idx}`` whose ``#k`` marks refer to hop k's answer.
The ``musique_full_v1.0_*`` files share the layout and load the same way, but hold each question twice under one
id: answerable, and ``"answerable": false`` with a supporting paragraph taken out. The official scorer leaves
the unanswerable records out of the answer metrics, so the loader leaves them out of the tasks (their
paragraphs stay in the corpus).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_gym.envs.datasets.distractor_corpus import build_distractor_corpus, document_id
from agent_gym.envs.datasets.download import canonical_split
from agent_gym.envs.datasets.loading import Record, Source, build_split, read_split_records, unique_strings
from agent_gym.tasks import Hop, Task, TaskSet

NAME = "musique"
LAYOUT = ('JSON Lines of MuSiQue records {"id", "question", "answer", "answer_aliases", "answerable", "paragraphs": '
          '[{"idx", "title", "paragraph_text", "is_supporting"}, ...], "question_decomposition": [...]}')
_HOP_REFERENCE = re.compile(r"#(\d+)")


def task_from_record(record: Record, split: str = "dev") -> Task:
    """One official MuSiQue record as a :class:`Task`."""
    paragraphs = {int(paragraph["idx"]): paragraph for paragraph in record["paragraphs"]}
    steps: list[dict[str, Any]] = list(record.get("question_decomposition") or [])
    hops = _hops(steps, paragraphs)
    # Hop order first (it is the reasoning order), then any other supporting paragraph by position.
    supporting = [paragraphs[i] for i in (_support_index(step) for step in steps) if i in paragraphs]
    supporting += [paragraph for paragraph in record["paragraphs"] if paragraph.get("is_supporting")]
    supporting = list({int(paragraph["idx"]): paragraph for paragraph in supporting}.values())
    record_id = str(record["id"])
    return Task(
        id=record_id,
        question=str(record["question"]),
        answers=unique_strings([record["answer"], *(record.get("answer_aliases") or [])]),
        supporting_titles=tuple(dict.fromkeys(str(paragraph["title"]) for paragraph in supporting)),
        decomposition=hops,
        kind=f"{len(hops)}hop" if hops else "",
        metadata={
            "dataset": NAME,
            "split": split,
            "answerable": bool(record.get("answerable", True)),
            "hops": len(hops),
            "structure": record_id.split("__", 1)[0] if "__" in record_id else "",
            "supporting_paragraphs": [
                {"idx": int(paragraph["idx"]), "title": str(paragraph["title"])} for paragraph in supporting
            ],
            "supporting_doc_ids": [
                document_id(str(paragraph["title"]), str(paragraph["paragraph_text"]))
                for paragraph in supporting
            ],
            "question_decomposition": steps,
        },
    )


def _support_index(step: dict[str, Any]) -> int | None:
    index = step.get("paragraph_support_idx")
    return None if index is None else int(index)


def _hops(steps: list[dict[str, Any]], paragraphs: dict[int, Record]) -> tuple[Hop, ...]:
    """Gold hops; each query is the hop question with ``#k`` replaced by hop k's gold answer."""
    answers: list[str] = []
    hops = []
    for step in steps:
        question = str(step["question"])

        def earlier_answer(match: re.Match[str], known: list[str] = answers) -> str:
            k = int(match.group(1))
            return known[k - 1] if 1 <= k <= len(known) else match.group(0)

        index = _support_index(step)
        title = str(paragraphs[index]["title"]) if index in paragraphs else ""
        answer = str(step.get("answer", ""))
        hops.append(Hop(question, answer, _HOP_REFERENCE.sub(earlier_answer, question), title))
        answers.append(answer)
    return tuple(hops)


def _answerable(record: Record) -> bool:
    # MuSiQue-Ans records have "answerable": true; only MuSiQue-Full's second copies say false
    return not isinstance(record, dict) or record.get("answerable", True) is not False


def context_paragraphs(record: Record) -> Iterator[tuple[str, str]]:
    """``(title, paragraph_text)`` of each of the record's paragraphs."""
    for paragraph in record["paragraphs"]:
        yield str(paragraph["title"]), str(paragraph["paragraph_text"])


def load_musique(
    split: str = "dev",
    data_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
    *,
    source: Source = "official",
    limit: int | None = None,
) -> tuple[TaskSet, list[dict[str, str]]]:
    """MuSiQue tasks and their distractor corpus (deduplicated by exact title and text: see
    :mod:`distractor_corpus` for why not by title).

    Args:
        split: ``"dev"`` or ``"train"`` (musique_ans_v1.0_<split>.jsonl).
        data_path: the JSONL file (plain, .gz or .xz) or a folder holding it; nothing is downloaded then.
        cache_dir: cache root for the download (default :func:`download.cache_dir`).
        source: ``"official"`` file, or ``"hf"`` for ``dgslibisey/MuSiQue`` via the ``datasets`` library.
        limit: keep only the first ``limit`` questions (and their paragraphs).
    """
    split = canonical_split(split)
    records, path = read_split_records(NAME, split, data_path, cache_dir, source, layout=LAYOUT)
    answerable = [record for record in records if _answerable(record)]
    if len(answerable) < len(records):  # MuSiQue-Full: no task for the unanswerable copies, as the scorer does
        tasks, _ = build_split(answerable, name=NAME, split=split, limit=limit, dedupe_by="title_text",
                               task_from_record=lambda record: task_from_record(record, split),
                               context_paragraphs=context_paragraphs, origin=str(path or "the Hugging Face Hub"),
                               layout=LAYOUT)
        kept = {task.id for task in tasks}
        paragraphs = [paragraph for record in records if str(record.get("id")) in kept
                      for paragraph in context_paragraphs(record)]
        return tasks, build_distractor_corpus(paragraphs, "title_text").documents
    return build_split(
        records,
        name=NAME,
        split=split,
        task_from_record=lambda record: task_from_record(record, split),
        context_paragraphs=context_paragraphs,
        dedupe_by="title_text",
        limit=limit,
        origin=str(path or "the Hugging Face Hub"),
        layout=LAYOUT,
    )
