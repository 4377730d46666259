"""The HotpotQA dev sample in ../shared/data and the distractor corpus its questions come with."""

from __future__ import annotations

import json
import lzma
from typing import Any

from agent_gym.retrieval_index.corpus import Document

from .data import HOTPOT_SAMPLE

__all__ = ["HOTPOT_SAMPLE", "distractor_corpus", "load_hotpot_sample"]


def load_hotpot_sample() -> list[dict[str, Any]]:
    """The sample's records; raises FileNotFoundError when the shared data folder is absent."""
    with lzma.open(HOTPOT_SAMPLE, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def distractor_corpus(records: list[dict[str, Any]]) -> list[Document]:
    """The records' context paragraphs as documents, one per title (first one wins), ids ``hp0``, ``hp1``, ..."""
    docs: dict[str, Document] = {}
    for record in records:
        for title, sentences in record["context"]:
            docs.setdefault(title, Document(f"hp{len(docs)}", title, "".join(sentences)))
    return list(docs.values())
