"""Modules that moved to the room they belong to (issue 28: the engines and the search service of
retrieval_index/, the evaluation agents out of trainers/) keep their old import paths for one release: the old
path warns and hands back the very module that moved, so old code, pickles of its classes and monkeypatches work."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

MOVED = {
    "agent_gym.retrieval_index.impact": "agent_gym.retrieval_index.engines.impact_bm25",
    "agent_gym.retrieval_index._impact_kernel": "agent_gym.retrieval_index.engines._impact_kernel",
    "agent_gym.retrieval_index.pyserini_backend": "agent_gym.retrieval_index.engines.pyserini_bm25",
    "agent_gym.retrieval_index.dense": "agent_gym.retrieval_index.engines.dense_faiss",
    "agent_gym.retrieval_index.hybrid": "agent_gym.retrieval_index.engines.hybrid_rrf",
    "agent_gym.retrieval_index.server": "agent_gym.retrieval_index.service.server",
    "agent_gym.retrieval_index.client": "agent_gym.retrieval_index.service.client",
    "agent_gym.retrieval_index.replicas": "agent_gym.retrieval_index.service.replicas",
    "agent_gym.retrieval_index.http_body_limit": "agent_gym.retrieval_index.service.http_body_limit",
    "agent_gym.retrieval_index.http_deadline": "agent_gym.retrieval_index.service.http_deadline",
    "agent_gym.retrieval_index.search_cache": "agent_gym.retrieval_index.service.search_cache",
    "agent_gym.trainers.model_policy": "agent_gym.agents.model_policy",
    "agent_gym.trainers.model_naive_rag": "agent_gym.agents.model_naive_rag",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_warns_and_is_the_moved_module(old: str, new: str) -> None:
    pytest.importorskip("fastapi") if ".service." in new else None
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is module  # `from old import name` and monkeypatching reach the moved module


def test_the_split_bm25_module_still_offers_every_name_it_had() -> None:
    sys.modules.pop("agent_gym.retrieval_index.bm25", None)
    with pytest.warns(DeprecationWarning, match="tantivy_bm25s"):
        from agent_gym.retrieval_index import bm25
    from agent_gym.retrieval_index.engines import DEFAULT_BM25_BACKEND
    from agent_gym.retrieval_index.engines.english_analyzer import EnglishAnalyzer
    from agent_gym.retrieval_index.engines.tantivy_bm25s import TantivyBM25

    assert bm25.TantivyBM25 is TantivyBM25 and bm25.EnglishAnalyzer is EnglishAnalyzer
    assert bm25.DEFAULT_BM25_BACKEND == DEFAULT_BM25_BACKEND and callable(bm25.clean_query)


def test_the_package_itself_imports_no_deprecated_path() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for new in MOVED.values():
            if ".service." in new and importlib.util.find_spec("fastapi") is None:
                continue
            importlib.import_module(new)
