"""Embedded BM25 engines that install with pip: tantivy (Rust) and bm25s (numpy sparse matrices).

Both score with BM25 k1 = 1.2, b = 0.75, the Lucene defaults: tantivy fixes these values, so bm25s
and Pyserini are set to match and all three rank alike (measured top-10 overlap with Pyserini in
``benchmarks/retrieval.py``). Text analysis follows Lucene's English analyzer: lowercase, its 33
stopwords, Porter stemming (bm25s: PyStemmer ``"porter"``: 0.977 top-10 overlap with Pyserini vs
0.942 with Porter2, measured in shared/notes/retrieval.md; tantivy only offers Porter2).

Queries are free text written by a model: any ``str`` is accepted. Query syntax is never
interpreted (``"a" AND b:c`` is the words a, and, b, c), invalid UTF-16 surrogates are replaced,
and queries are cut at :data:`MAX_QUERY_CHARS`.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import (
    MAX_QUERY_TERMS,
    Hit,
    Retriever,
    clean_query,
    default_threads,
    documents_list,
    map_batch,
)
from agent_gym.retrieval_index.corpus import CorpusFile, DocStore, Document, make_hits
from agent_gym.retrieval_index.engines.english_analyzer import LUCENE_STOPWORDS, EnglishAnalyzer

__all__ = ["BM25sRetriever", "TantivyBM25"]


def _reiterable(docs: Iterable[Document]) -> Iterable[Document]:
    """``docs`` itself if it can be iterated twice (a list, a CorpusFile), else a list of it."""
    return docs if isinstance(docs, Sequence | CorpusFile) else list(docs)


def _top_k(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (row, score) pairs, best first, ties going to the lower row as in Lucene."""
    if len(rows) > k:
        kth_best = np.partition(scores, len(scores) - k)[len(scores) - k]
        above = np.flatnonzero(scores > kth_best)
        tied = np.flatnonzero(scores == kth_best)
        tied = tied[np.argsort(rows[tied], kind="stable")[: k - len(above)]]
        keep = np.concatenate([above, tied])
        rows, scores = rows[keep], scores[keep]
    order = np.lexsort((rows, -scores))
    return rows[order], scores[order]


# --------------------------------------------------------------------------------------------- tantivy


class TantivyBM25(Retriever):
    """BM25 over a tantivy index (k1 = 1.2, b = 0.75, fixed by tantivy).

    The index holds only the analyzed text and a fast ``row`` field; documents come from a
    :class:`DocStore` (on disk) or the list the index was built from (in memory).
    """

    name = "tantivy"
    ANALYZER = "agent_gym_english"
    SUBDIR = "tantivy"

    def __init__(self, index: object, docs: Sequence[Document], threads: int | None = None):
        import tantivy

        self._tantivy = tantivy
        self._index = index
        self._schema_obj = index.schema
        self._docs = docs
        self._threads = threads or default_threads()
        self._analyzer = self._register_analyzer(index)
        index.reload()
        self._searcher = index.searcher()

    @classmethod
    def _register_analyzer(cls, index: object) -> object:
        # Custom analyzers live in the Index object, not on disk: register again after every open.
        import tantivy

        analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.remove_long(255))
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(sorted(LUCENE_STOPWORDS)))
            .filter(tantivy.Filter.stemmer("english"))
            .build()
        )
        index.register_tokenizer(cls.ANALYZER, analyzer)
        return analyzer

    @classmethod
    def _schema(cls) -> object:
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("body", stored=False, tokenizer_name=cls.ANALYZER)
        builder.add_unsigned_field("row", stored=False, indexed=False, fast=True)
        return builder.build()

    @classmethod
    def _fill(cls, index: object, docs: Iterable[Document], show_progress: bool) -> int:
        """Index ``docs`` (row = position) into ``index``; return how many there were."""
        import tantivy

        cls._register_analyzer(index)
        # One indexing thread keeps documents in row order inside a segment, so tied scores rank
        # in corpus order as Lucene's do (two threads interleave rows across segments).
        writer = index.writer(heap_size=256_000_000, num_threads=1)
        count = 0
        for doc in tqdm(docs, desc="tantivy: indexing", unit="doc", disable=not show_progress):
            record = tantivy.Document()
            record.add_text("body", doc.contents)
            record.add_unsigned("row", count)  # Document(row=i) panics the writer; add_unsigned does not
            writer.add_document(record)
            count += 1
        writer.commit()
        writer.wait_merging_threads()
        return count

    @classmethod
    def from_documents(cls, docs: Iterable[Document], *, show_progress: bool = False) -> TantivyBM25:
        """An in-memory index over ``docs`` (10^5 pages build in seconds)."""
        import tantivy

        docs = documents_list(docs)
        index = tantivy.Index(cls._schema())
        cls._fill(index, docs, show_progress)
        return cls(index, docs)

    @classmethod
    def build(
        cls,
        docs: Iterable[Document],
        out_dir: str | os.PathLike[str],
        *,
        store_docs: bool = True,
        show_progress: bool = True,
    ) -> None:
        """Write an index (``out_dir/tantivy``) and, unless ``store_docs=False``, a document store.

        ``docs`` is streamed (a :class:`CorpusFile` indexes corpora larger than memory).
        """
        import tantivy

        docs = _reiterable(docs)
        out_dir = Path(out_dir)
        index_dir = out_dir / cls.SUBDIR
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index_dir.mkdir(parents=True)
        count = cls._fill(tantivy.Index(cls._schema(), path=str(index_dir), reuse=False), docs, show_progress)
        if count == 0:
            shutil.rmtree(index_dir)
            raise InvalidValue("cannot build an index over an empty corpus: it has no documents")
        if store_docs:
            DocStore.write(docs, out_dir)

    @classmethod
    def open(cls, directory: str | os.PathLike[str], docs: Sequence[Document] | None = None) -> TantivyBM25:
        """Open an index written by :meth:`build` (tantivy memory-maps its segment files)."""
        import tantivy

        directory = Path(directory)
        index_dir = directory / cls.SUBDIR
        if not index_dir.is_dir() or not tantivy.Index.exists(str(index_dir)):
            raise FileNotFoundError(f"no tantivy index in {index_dir}")
        return cls(tantivy.Index.open(str(index_dir)), docs if docs is not None else DocStore(directory))

    def _search_one(self, query: str, k: int) -> list[Hit]:
        # Analyze the words ourselves and OR their terms: no query syntax is interpreted, and a
        # query of stopwords only matches nothing (the query parser would turn it into match-all).
        terms = self._analyzer.analyze(clean_query(query))
        if not terms:
            return []
        parsed = self._tantivy.Query.boolean_query(
            [
                (self._tantivy.Occur.Should, self._tantivy.Query.term_query(self._schema_obj, "body", term))
                for term in terms[:MAX_QUERY_TERMS]
            ]
        )
        result = self._searcher.search(parsed, limit=k, count=False)
        if not result.hits:
            return []
        scores = np.fromiter((score for score, _ in result.hits), dtype=np.float32, count=len(result.hits))
        rows = np.asarray(self._searcher.fast_field_values("row", [address for _, address in result.hits]))
        return make_hits(self._docs, *_top_k(rows, scores, k))  # ties in row order, as in Lucene

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return map_batch(lambda query: self._search_one(query, k), queries, self._threads)


# ----------------------------------------------------------------------------------------------- bm25s


class BM25sRetriever(Retriever):
    """BM25 with bm25s's precomputed sparse score matrix, searched by our own numpy kernel.

    bm25s stores, for each vocabulary term, the BM25 weight of every document containing it
    (a CSC matrix; ``save``/``load(mmap=True)`` memory-map it). Scoring a query sums a few columns.
    bm25s's own fast path is numba, which compiles for ~6 s in every new process (measured here,
    not cached across processes); its numpy path scores all documents per query (150-330 q/s on
    200k docs). Our kernel touches only the posting lists of the query's terms: no JIT, and a
    fresh process answers its first query at full speed.
    """

    name = "bm25s"
    SUBDIR = "bm25s"

    def __init__(
        self, model: object, docs: Sequence[Document], *, stemmer: str = "porter", threads: int | None = None
    ):
        self._model = model
        self._docs = docs
        self._analyzer = EnglishAnalyzer(stemmer)
        self._vocab: dict[str, int] = model.vocab_dict
        scores = model.scores
        # Plain ndarray views of the (memory-mapped) arrays: slicing a np.memmap is much slower.
        self._data = np.asarray(scores["data"]).view(np.ndarray)
        self._indices = np.asarray(scores["indices"]).view(np.ndarray)
        self._indptr = np.asarray(scores["indptr"], dtype=np.int64)
        self._n_terms = len(self._indptr) - 1
        self._n_docs = int(scores["num_docs"])
        self._buffers = threading.local()
        self._threads = threads or default_threads()

    @property
    def k1(self) -> float:
        return float(self._model.k1)

    @property
    def b(self) -> float:
        return float(self._model.b)

    @classmethod
    def _index(
        cls, docs: list[Document], k1: float, b: float, method: str, stemmer: str, show_progress: bool
    ) -> object:
        import bm25s

        analyzer = EnglishAnalyzer(stemmer)
        vocab: dict[str, int] = {}
        token_ids: list[list[int]] = []
        for doc in tqdm(docs, desc="bm25s: tokenizing", unit="doc", disable=not show_progress):
            ids = []
            for token in analyzer(doc.contents):
                token_id = vocab.get(token)
                if token_id is None:
                    token_id = vocab[token] = len(vocab)
                ids.append(token_id)
            token_ids.append(ids)
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index((token_ids, vocab), show_progress=show_progress)
        return model

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        method: str = "lucene",
        stemmer: str = "porter",
        show_progress: bool = False,
    ) -> BM25sRetriever:
        """An in-memory index over ``docs``."""
        docs = documents_list(docs)
        return cls(cls._index(docs, k1, b, method, stemmer, show_progress), docs, stemmer=stemmer)

    @classmethod
    def build(
        cls,
        docs: Iterable[Document],
        out_dir: str | os.PathLike[str],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        method: str = "lucene",
        stemmer: str = "porter",
        store_docs: bool = True,
        show_progress: bool = True,
    ) -> None:
        """Write the score matrix (``out_dir/bm25s``) and, unless ``store_docs=False``, a document store."""
        docs = documents_list(docs)
        out_dir = Path(out_dir)
        model = cls._index(docs, k1, b, method, stemmer, show_progress)
        index_dir = out_dir / cls.SUBDIR
        if index_dir.exists():
            shutil.rmtree(index_dir)
        model.save(str(index_dir))
        (index_dir / "stemmer.txt").write_text(stemmer)
        if store_docs:
            DocStore.write(docs, out_dir)

    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], docs: Sequence[Document] | None = None
    ) -> BM25sRetriever:
        """Open a saved index with its score matrix memory-mapped."""
        import bm25s

        directory = Path(directory)
        index_dir = directory / cls.SUBDIR
        if not (index_dir / "params.index.json").is_file():
            raise FileNotFoundError(f"no bm25s index in {index_dir}")
        model = bm25s.BM25.load(str(index_dir), mmap=True, show_progress=False)
        stemmer_file = index_dir / "stemmer.txt"
        stemmer = stemmer_file.read_text().strip() if stemmer_file.is_file() else "porter"
        return cls(model, docs if docs is not None else DocStore(directory), stemmer=stemmer)

    def _buffers_for_thread(self) -> tuple[np.ndarray, np.ndarray]:
        buffers = getattr(self._buffers, "arrays", None)
        if buffers is None:
            buffers = self._buffers.arrays = (
                np.zeros(self._n_docs, dtype=np.float32),  # accumulated scores, zero between queries
                np.zeros(self._n_docs, dtype=np.int64),  # position of a row's last posting, to dedupe
            )
        return buffers

    def _search_one(self, query: str, k: int) -> list[Hit]:
        term_ids = [self._vocab.get(token, -1) for token in self._analyzer(clean_query(query))]
        term_ids = [term for term in term_ids if 0 <= term < self._n_terms][:MAX_QUERY_TERMS]
        postings = [(self._indptr[term], self._indptr[term + 1]) for term in term_ids]
        postings = [(start, end) for start, end in postings if end > start]
        if not postings:
            return []
        rows, scores = self._score(postings)
        return make_hits(self._docs, *_top_k(rows, scores, k))

    def _score(self, postings: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Rows matching any posting list, each once, with its BM25 score (cost: total postings)."""
        if len(postings) == 1:
            start, end = postings[0]
            return self._indices[start:end], self._data[start:end]
        # Accumulate the columns into a dense per-thread buffer. A document appears at most once
        # per column, so `buffer[rows] += weights` is exact; a repeated query term counts again,
        # as in Lucene's boolean query.
        buffer, last_position = self._buffers_for_thread()
        touched = []
        for start, end in postings:
            rows = self._indices[start:end]
            buffer[rows] += self._data[start:end]
            touched.append(rows)
        rows = np.concatenate(touched)
        # Keep one occurrence per row without sorting: fancy assignment with repeated indices
        # stores one of their positions, so exactly one occurrence per row matches itself.
        positions = np.arange(len(rows))
        last_position[rows] = positions
        rows = rows[last_position[rows] == positions]
        scores = buffer[rows]
        buffer[rows] = 0.0
        return rows, scores

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return map_batch(lambda query: self._search_one(query, k), queries, self._threads)
