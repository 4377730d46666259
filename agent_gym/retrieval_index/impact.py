"""BM25 over precomputed impacts, searched with MaxScore dynamic pruning compiled by numba.

Every (term, document) pair's BM25 weight is computed once at build time (Lucene's formula, k1 = 1.2,
b = 0.75 unless told otherwise), so a search only adds floats. Postings are stored per term in
document order, with the term's largest weight. A query is answered document at a time with
MaxScore (Turtle and Flood, 1995): once ``k`` documents are held, the terms whose summed maximum
weights cannot lift a document above the ``k``-th score stop driving the search and are only
looked up, by galloping search, for documents the others already make promising. The result is
exactly the exhaustive top ``k`` (ties to the lower row, as in Lucene); on questions whose rare
words name the answer, most of the long posting lists of common words are never read.

Why this engine is the default (``benchmarks/retrieval.py``, steady-state batches, same thread
count as Pyserini): see :data:`agent_gym.retrieval_index.bm25.DEFAULT_BM25_BACKEND`.

The kernel (``_impact_kernel.py``) is compiled once per machine, ahead of time, into a small C
extension module under ``$AGENT_GYM_CACHE/kernels`` (~15 s, in a child process, with numba and the
system's C compiler); every later process loads that module in milliseconds and never imports
numba or LLVM (~135 MB less per process, measured). Without a C compiler the kernel runs on numba's
JIT, cached beside the module (``NUMBA_CACHE_DIR``). Either way the cost is paid when an index opens
(:func:`warm_up`), never on a query.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import (
    MAX_QUERY_TERMS,
    Hit,
    RetrievalError,
    Retriever,
    clean_query,
    default_threads,
    documents_list,
    map_chunks,
)
from agent_gym.retrieval_index.bm25 import EnglishAnalyzer
from agent_gym.retrieval_index.corpus import DocStore, Document, make_hits

logger = logging.getLogger(__name__)

__all__ = ["ImpactBM25", "NumbaUnavailableError", "Vocabulary", "lucene_norm_length", "numba_available"]

INSTALL_HINT = "pip install numba"
_FORMAT = 1


class NumbaUnavailableError(RetrievalError, ImportError):
    """The impact engine needs numba, which is not installed."""


def numba_available() -> bool:
    """Whether numba is installed (checked without importing it: the import alone costs ~75 MB)."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


_KERNEL = None
_KERNEL_LOCK = threading.Lock()
_EXTENSION = "agent_gym_impact_kernel"


def kernel_cache_dir() -> Path:
    """Where the ahead-of-time compiled kernel is kept: ``$AGENT_GYM_CACHE/kernels`` (``~/.cache/agent-gym``)."""
    root = os.environ.get("AGENT_GYM_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "agent-gym") / "kernels"


def _extension_path() -> Path:
    """The compiled module's path, keyed by the kernel's source, numba, Python and machine."""
    import importlib.machinery
    import importlib.metadata
    import platform

    source = (Path(__file__).with_name("_impact_kernel.py")).read_bytes()
    try:
        numba_version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        numba_version = "none"
    key = hashlib.sha256(source + f"|{numba_version}|{sys.version}|{platform.machine()}".encode()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return kernel_cache_dir() / key / f"{_EXTENSION}{suffix}"


def _load_extension(path: Path) -> object:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(_EXTENSION, str(path))
    spec = importlib.util.spec_from_file_location(_EXTENSION, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.search_batch


def _compile_extension(path: Path) -> bool:
    """Build the module in a child process (which, not this one, loads LLVM); whether it now exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as staging:
        package_root = str(Path(__file__).resolve().parents[2])
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root,
                                                                                 os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-c", "import sys\nfrom agent_gym.retrieval_index._impact_kernel import "
                   "build_extension\nbuild_extension(sys.argv[1], sys.argv[2])", staging, _EXTENSION]
        completed = subprocess.run(command, capture_output=True, text=True, env=environment)
        built = Path(staging) / path.name
        if completed.returncode != 0 or not built.is_file():
            logger.warning("impact engine: could not compile its kernel ahead of time (%s); using numba's JIT, "
                           "which costs ~135 MB more per process", (completed.stderr or "no output").strip()[-300:])
            return False
        os.replace(built, path)  # atomic: a process racing this one loads a whole file or none
    return True


def _kernel() -> object:
    """The batch-search function: the ahead-of-time compiled module (built once per machine, ~15 s, in a child
    process), else numba's JIT (cached on disk too). Loaded once per process."""
    global _KERNEL
    with _KERNEL_LOCK:
        if _KERNEL is not None:
            return _KERNEL
        try:
            path = _extension_path()
            if path.is_file() or (numba_available() and os.environ.get("AGENT_GYM_NO_AOT") != "1"
                                  and _compile_extension(path)):
                _KERNEL = _load_extension(path)
                return _KERNEL
        except (OSError, ImportError) as error:
            logger.warning("impact engine: cannot use the compiled kernel module (%s); using numba's JIT", error)
        try:
            from agent_gym.retrieval_index import _impact_kernel
        except ImportError as error:
            raise NumbaUnavailableError(f"the impact BM25 engine needs numba: {INSTALL_HINT}") from error
        _KERNEL = _impact_kernel.search_batch
        return _KERNEL


# Lengths below this are stored exactly by Lucene's SmallFloat.intToByte4 (255 byte values minus the
# 231 its 4-bit floating-point part needs for lengths up to 2^31).
_EXACT_LENGTHS = 24


def lucene_norm_length(length: np.ndarray) -> np.ndarray:
    """Document lengths as Lucene's one-byte norms keep them (``SmallFloat.intToByte4``, decoded).

    Lengths under 24 are exact; above, ``length - 24`` keeps its 4 most significant bits. Using the
    same lossy lengths gives the same scores, hence the same ties, as Pyserini.
    """
    length = np.asarray(length, dtype=np.int64)
    excess = np.maximum(length - _EXACT_LENGTHS, 0)
    bits = np.zeros_like(excess)
    positive = excess > 0
    bits[positive] = np.floor(np.log2(excess[positive])).astype(np.int64) + 1
    shift = np.maximum(bits - 4, 0)
    kept = (excess >> shift) << shift
    return np.where(length < _EXACT_LENGTHS, length, _EXACT_LENGTHS + kept).astype(np.float64)


def _read_only(values: np.ndarray, dtype: type) -> np.ndarray:
    """A C-contiguous, read-only ndarray of ``dtype``: one type signature, so the kernel compiles once."""
    values = np.ascontiguousarray(values, dtype=dtype).view(np.ndarray)
    values.flags.writeable = False
    return values


def warm_up() -> None:
    """Compile (or load from cache) the search kernel now, on a two-document toy index."""
    offsets = _read_only(np.array([0, 2]), np.int64)
    postings = _read_only(np.array([0, 1]), np.int32)
    impacts = _read_only(np.array([1.0, 0.5]), np.float32)
    term_max = _read_only(np.array([1.0]), np.float32)
    rows = np.empty((1, 1), dtype=np.int32)
    scores = np.empty((1, 1), dtype=np.float32)
    counts = np.empty(1, dtype=np.int32)
    _kernel()(np.array([0], dtype=np.int32), np.array([0, 1], dtype=np.int64), offsets, postings, impacts,
              term_max, 1, rows, scores, counts)


class Vocabulary:
    """Stem -> term id without a Python dict of the whole vocabulary (~150 bytes a word; a million words here).

    Term ids are the ranks of the stems' 64-bit hashes (BLAKE2b, salted), kept sorted in a memory-mapped
    array: a lookup is a binary search, then a comparison with the stored stem, so a word outside the
    vocabulary never takes another's postings. Recent lookups are cached.
    """

    HASHES, WORDS, WORD_OFFSETS = "term_hashes.npy", "words.npy", "word_offsets.npy"

    def __init__(self, hashes: np.ndarray, words: np.ndarray, word_offsets: np.ndarray, salt: int,
                 max_cache: int = 200_000):
        self._hashes, self._words, self._word_offsets = hashes, words, word_offsets
        self.salt = salt
        self._prefix = f"{salt}:".encode()
        self._cache: dict[str, int] = {}
        self._max_cache = max_cache

    def __len__(self) -> int:
        return len(self._hashes)

    @staticmethod
    def _hash(prefix: bytes, word: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(prefix + word, digest_size=8).digest(), "little")

    @classmethod
    def build(cls, words: list[str]) -> tuple[Vocabulary, np.ndarray]:
        """The vocabulary of ``words`` and, for each, its term id (``renumber[i]`` is the id of ``words[i]``)."""
        encoded = [word.encode("utf-8", "surrogatepass") for word in words]
        for salt in range(100):  # a collision among a million 64-bit hashes is a 1-in-30-million event
            prefix = f"{salt}:".encode()
            hashes = np.fromiter((cls._hash(prefix, word) for word in encoded), dtype=np.uint64, count=len(words))
            order = np.argsort(hashes, kind="stable")
            hashes = hashes[order]
            if len(hashes) < 2 or bool(np.all(hashes[1:] != hashes[:-1])):
                break
        else:
            raise RetrievalError("could not hash the vocabulary without collisions")
        renumber = np.empty(len(words), dtype=np.int64)
        renumber[order] = np.arange(len(words))
        ordered = [encoded[i] for i in order]
        offsets = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum([len(word) for word in ordered], out=offsets[1:])
        joined = np.frombuffer(b"".join(ordered), dtype=np.uint8)
        return cls(hashes, joined, offsets, salt), renumber

    def save(self, directory: Path) -> None:
        np.save(directory / self.HASHES, self._hashes)
        np.save(directory / self.WORDS, self._words)
        np.save(directory / self.WORD_OFFSETS, self._word_offsets)

    @classmethod
    def load(cls, directory: Path, salt: int) -> Vocabulary:
        arrays = [np.load(directory / name, mmap_mode="r").view(np.ndarray)
                  for name in (cls.HASHES, cls.WORDS, cls.WORD_OFFSETS)]
        return cls(*arrays, salt)

    def lookup(self, words: Sequence[str]) -> list[int]:
        """The term id of each word, ``-1`` for words outside the vocabulary."""
        cache = self._cache
        ids = []
        for word in words:
            term = cache.get(word)
            if term is None:
                term = self._find(word)
                if len(cache) >= self._max_cache:
                    cache.clear()
                cache[word] = term
            ids.append(term)
        return ids

    def _find(self, word: str) -> int:
        encoded = word.encode("utf-8", "surrogatepass")
        wanted = self._hash(self._prefix, encoded)
        position = int(np.searchsorted(self._hashes, np.uint64(wanted)))
        if position >= len(self._hashes) or int(self._hashes[position]) != wanted:
            return -1
        start, end = int(self._word_offsets[position]), int(self._word_offsets[position + 1])
        return position if self._words[start:end].tobytes() == encoded else -1


class ImpactBM25(Retriever):
    """BM25 (Lucene's formula and English analysis) over precomputed impacts, MaxScore-pruned, exact.

    Files in ``out_dir/impact``: ``offsets.npy`` (term -> posting range), ``postings.npy`` (rows,
    int32), ``impacts.npy`` (weights, float32), ``term_max.npy``, the vocabulary (see
    :class:`Vocabulary`) and ``params.json``. Everything is memory-mapped when opened from disk.
    """

    name = "impact"
    SUBDIR = "impact"

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        vocab: Vocabulary,
        params: dict,
        docs: Sequence[Document],
        *,
        threads: int | None = None,
    ):
        self._kernel = _kernel()
        self._offsets, self._postings, self._impacts, self._term_max = (
            _read_only(arrays[name], dtype)
            for name, dtype in (("offsets", np.int64), ("postings", np.int32), ("impacts", np.float32),
                                ("term_max", np.float32))
        )
        self._vocab = vocab
        self.k1, self.b = float(params["k1"]), float(params["b"])
        self._analyzer = EnglishAnalyzer(params.get("stemmer", "porter"), standard_tokens=True)
        self._docs = docs
        self._threads = threads or default_threads()
        warm_up()

    # ----------------------------------------------------------------------------------- building

    @staticmethod
    def _index(
        docs: Iterable[Document], k1: float, b: float, stemmer: str, show_progress: bool
    ) -> tuple[dict[str, np.ndarray], Vocabulary, int]:
        """Arrays of the index, its vocabulary, and the document count."""
        analyzer = EnglishAnalyzer(stemmer, standard_tokens=True)
        first_seen: dict[str, int] = {}
        token_ids = array("i")
        lengths = array("i")
        for doc in tqdm(docs, desc="impact: analyzing", unit="doc", disable=not show_progress):
            tokens = analyzer(doc.contents)
            token_ids.extend([first_seen.setdefault(token, len(first_seen)) for token in tokens])
            lengths.append(len(tokens))
        n_docs = len(lengths)
        if n_docs == 0:
            raise InvalidValue("cannot build an index over an empty corpus: it has no documents")
        vocab, renumber = Vocabulary.build(list(first_seen))
        del first_seen
        length = np.frombuffer(lengths, dtype=np.int32)
        terms = renumber[np.frombuffer(token_ids, dtype=np.int32)].astype(np.int64)
        del token_ids
        rows = np.repeat(np.arange(n_docs, dtype=np.int64), length)
        # One sort groups the pairs by term, then row: the posting lists in document order.
        keys, tf = np.unique(terms * n_docs + rows, return_counts=True)
        del terms, rows
        term_of = (keys // n_docs).astype(np.int32)
        postings = (keys % n_docs).astype(np.int32)
        del keys
        df = np.bincount(term_of, minlength=len(vocab))
        offsets = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(df, out=offsets[1:])
        # Lucene's BM25Similarity (since Lucene 8): idf * tf / (tf + k1 * (1 - b + b * dl / avgdl)), where
        # dl is the length as its one-byte norm stores it, and documents without a word do not count.
        with_words = max(int(np.count_nonzero(length)), 1)
        idf = np.log1p((with_words - df + 0.5) / (df + 0.5))
        avgdl = max(float(length.sum()) / with_words, 1e-9)
        norm = k1 * (1.0 - b + b * lucene_norm_length(length) / avgdl)
        tf = tf.astype(np.float64)
        impacts = (idf[term_of] * tf / (tf + norm[postings])).astype(np.float32)
        del term_of, tf
        term_max = np.maximum.reduceat(impacts, offsets[:-1]) if len(impacts) else np.zeros(0, np.float32)
        arrays = {"offsets": offsets, "postings": postings, "impacts": impacts,
                  "term_max": term_max.astype(np.float32)}
        return arrays, vocab, n_docs

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        stemmer: str = "porter",
        show_progress: bool = False,
    ) -> ImpactBM25:
        """An in-memory index over ``docs``."""
        docs = documents_list(docs)
        arrays, vocab, _ = cls._index(docs, k1, b, stemmer, show_progress)
        return cls(arrays, vocab, {"k1": k1, "b": b, "stemmer": stemmer, "salt": vocab.salt}, docs)

    @classmethod
    def build(
        cls,
        docs: Iterable[Document],
        out_dir: str | os.PathLike[str],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        stemmer: str = "porter",
        store_docs: bool = True,
        show_progress: bool = True,
    ) -> None:
        """Write the index (``out_dir/impact``) and, unless ``store_docs=False``, a document store.

        ``docs`` is read once for the index (and once more for the store); the postings of the
        whole corpus are held in memory while sorting (about 40 bytes per token).
        """
        out_dir = Path(out_dir)
        arrays, vocab, n_docs = cls._index(docs, k1, b, stemmer, show_progress)
        index_dir = out_dir / cls.SUBDIR
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index_dir.mkdir(parents=True)
        for name, values in arrays.items():
            np.save(index_dir / f"{name}.npy", values)
        vocab.save(index_dir)
        params = {"format": _FORMAT, "k1": k1, "b": b, "stemmer": stemmer, "documents": n_docs, "salt": vocab.salt}
        (index_dir / "params.json").write_text(json.dumps(params))
        if store_docs:
            DocStore.write(docs, out_dir)

    @classmethod
    def open(cls, directory: str | os.PathLike[str], docs: Sequence[Document] | None = None) -> ImpactBM25:
        """Open an index written by :meth:`build`, its arrays memory-mapped."""
        index_dir = Path(directory) / cls.SUBDIR
        if not (index_dir / "params.json").is_file():
            raise FileNotFoundError(f"no impact index in {index_dir}")
        params = json.loads((index_dir / "params.json").read_text())
        arrays = {}
        for name in ("offsets", "postings", "impacts", "term_max"):
            arrays[name] = np.load(index_dir / f"{name}.npy", mmap_mode="r")  # numba reads the map, no copy
        vocab = Vocabulary.load(index_dir, int(params.get("salt", 0)))
        return cls(arrays, vocab, params, docs if docs is not None else DocStore(directory))

    # ------------------------------------------------------------------------------------ search

    def _term_ids(self, query: str) -> list[int]:
        ids = self._vocab.lookup(self._analyzer(clean_query(query)))
        return [term for term in ids if term >= 0][:MAX_QUERY_TERMS]

    def _search_chunk(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        flat: list[int] = []
        starts = [0]
        for query in queries:
            flat.extend(self._term_ids(query))
            starts.append(len(flat))
        rows = np.empty((len(queries), k), dtype=np.int32)
        scores = np.empty((len(queries), k), dtype=np.float32)
        counts = np.empty(len(queries), dtype=np.int32)
        self._kernel(np.asarray(flat, dtype=np.int32), np.asarray(starts, dtype=np.int64), self._offsets,
                     self._postings, self._impacts, self._term_max, k, rows, scores, counts)
        return [make_hits(self._docs, rows[i, : counts[i]].tolist(), scores[i, : counts[i]].tolist())
                for i in range(len(queries))]

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return map_chunks(lambda chunk: self._search_chunk(chunk, k), queries, self._threads)
