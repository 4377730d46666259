"""Deprecated path: its engines moved to :mod:`agent_gym.retrieval_index.engines.tantivy_bm25s`, the analysis to
:mod:`~agent_gym.retrieval_index.engines.english_analyzer`, ``DEFAULT_BM25_BACKEND`` to
:mod:`agent_gym.retrieval_index.engines`; the old path works, with a DeprecationWarning, for one release."""

import warnings

from agent_gym.retrieval_index.base import MAX_QUERY_CHARS, clean_query
from agent_gym.retrieval_index.engines import DEFAULT_BM25_BACKEND
from agent_gym.retrieval_index.engines.english_analyzer import LUCENE_STOPWORDS, EnglishAnalyzer
from agent_gym.retrieval_index.engines.tantivy_bm25s import BM25sRetriever, TantivyBM25

__all__ = ["DEFAULT_BM25_BACKEND", "LUCENE_STOPWORDS", "MAX_QUERY_CHARS", "BM25sRetriever", "EnglishAnalyzer",
           "TantivyBM25", "clean_query"]

warnings.warn("agent_gym.retrieval_index.bm25 moved: TantivyBM25 and BM25sRetriever to "
              "agent_gym.retrieval_index.engines.tantivy_bm25s, EnglishAnalyzer to .engines.english_analyzer, "
              "DEFAULT_BM25_BACKEND to .engines (the old path goes in the next release)",
              DeprecationWarning, stacklevel=2)
