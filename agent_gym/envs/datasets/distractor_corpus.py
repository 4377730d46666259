"""The distractor corpus: the union of a split's own context paragraphs, as retrieval documents.

Documents are ``{"id", "title", "text"}`` dicts (the corpus JSONL layout the retrieval backends read),
sorted by title then id, with ids that depend only on content, never on order: a slug of the title
for readability plus a short sha1 so two titles that slug alike never collide.

Two deduplication keys:

- ``"title"`` (HotpotQA, 2WikiMultihopQA): one page per title, as in Wikipedia. When two contexts give
  a title different texts, the longer text is kept and the conflict is counted.
- ``"title_text"`` (MuSiQue): MuSiQue draws several different paragraphs from one page, under the same
  title, and marks some of them supporting. Deduplicating by title would drop evidence: on the 200-question
  dev sample it drops 94 of the 478 supporting paragraphs. So exact (title, text) duplicates merge and
  same-title paragraphs stay separate documents.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from agent_gym.error import InvalidValue

logger = logging.getLogger(__name__)

DedupeKey = Literal["title", "title_text"]
_SLUG_MAX_CHARS = 48


@dataclass(frozen=True)
class DistractorCorpus:
    """A deduplicated corpus and what deduplication did.

    Attributes:
        documents: ``{"id", "title", "text"}`` dicts, sorted by (title, id).
        paragraphs_seen: context paragraphs read, duplicates included.
        title_conflicts: same-title paragraphs whose texts differed (``"title"`` key only; the longer won).
    """

    documents: list[dict[str, str]]
    paragraphs_seen: int
    title_conflicts: int


def document_id(title: str, text: str | None = None) -> str:
    """A stable document id: ``<slug of title>-<8 hex of sha1>``.

    The hash covers the title alone, or the title and text when ``text`` is given (for corpora that
    keep several paragraphs under one title).
    """
    key = title if text is None else f"{title}\x00{text}"
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:8]
    slug = _slug(title)
    return f"{slug}-{digest}" if slug else digest


def build_distractor_corpus(
    paragraphs: Iterable[tuple[str, str]], dedupe_by: DedupeKey = "title"
) -> DistractorCorpus:
    """Deduplicate ``(title, text)`` paragraphs into a corpus (see the module docstring for the keys)."""
    if dedupe_by not in ("title", "title_text"):
        raise InvalidValue(f"dedupe_by must be 'title' or 'title_text', not {dedupe_by!r}")
    kept: dict[tuple[str, str] | str, tuple[str, str]] = {}
    seen = conflicts = 0
    for title, text in paragraphs:
        seen += 1
        key: tuple[str, str] | str = title if dedupe_by == "title" else (title, text)
        previous = kept.get(key)
        if previous is None:
            kept[key] = (title, text)
        elif previous[1] != text:
            conflicts += 1
            if len(text) > len(previous[1]):
                kept[key] = (title, text)
    documents = [
        {"id": document_id(title, None if dedupe_by == "title" else text), "title": title, "text": text}
        for title, text in kept.values()
    ]
    documents.sort(key=lambda document: (document["title"], document["id"]))
    if conflicts:
        logger.info("distractor corpus: %d same-title paragraphs differed; kept the longer text", conflicts)
    return DistractorCorpus(documents, seen, conflicts)


def _slug(title: str) -> str:
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")[:_SLUG_MAX_CHARS].rstrip("-")
