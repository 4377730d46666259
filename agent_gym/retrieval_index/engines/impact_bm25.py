"""BM25 over precomputed impacts, searched with MaxScore dynamic pruning compiled by numba.

Every (term, document) pair's BM25 weight is computed once at build time (Lucene's formula, k1 = 1.2,
b = 0.75 unless told otherwise), so a search only adds floats. Postings are stored per term in
document order, with the term's largest weight. A query is answered document at a time with
MaxScore (Turtle and Flood, 1995): once ``k`` documents are held, the terms whose summed maximum
weights cannot lift a document above the ``k``-th score stop driving the search and are only
looked up, by galloping search, for documents the others already make promising. The result is
exactly the exhaustive top ``k`` (ties to the lower row, as in Lucene); on questions whose rare
words name the answer, most of the long posting lists of common words are never read.

The postings are compressed (format 2, about 3 bytes a posting where format 1 took 8): rows are cut
into blocks of 65,536; a term's list is a run of segments, one per block it occurs in, each the block's
first row and 16-bit offsets from it; each impact is a one-byte code into its term's codebook. A term
with at most 256 distinct impacts (most: BM25's impact depends on the term frequency and Lucene's
one-byte length only) is coded exactly; one with more gets 256 levels evenly spaced over its
``[min, max]``, so its weight is within ``(max - min) / 510`` of exact BM25
(:meth:`ImpactBM25.score_tolerance` bounds a query's error). The kernel returns exactly the top ``k`` of
the coded scores, decoding as it gallops: a cursor skips whole blocks by their first rows, then gallops
the offsets. Indexes of format 1 are refused with the command that rebuilds them.

Why this engine is the default (``benchmarks/retrieval.py``, steady-state batches, same thread
count as Pyserini): see :data:`agent_gym.retrieval_index.engines.DEFAULT_BM25_BACKEND`.

The kernel (``_impact_kernel.py``) is compiled once per machine, ahead of time, into a small C
extension module under ``$AGENT_GYM_CACHE/kernels`` (~15 s, in a child process, with numba and the
system's C compiler); every later process loads that module in milliseconds and never imports
numba or LLVM (~135 MB less per process, measured). Without a C compiler the kernel runs on numba's
JIT, cached beside the module (``NUMBA_CACHE_DIR``). Either way the cost is paid when an index opens
(:func:`warm_up`), never on a query.
"""

from __future__ import annotations

import functools
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

from agent_gym.cache_root import cache_root
from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import (
    MAX_QUERY_TERMS,
    PARALLEL_MIN_BATCH,
    Hit,
    RetrievalError,
    Retriever,
    clean_query,
    default_threads,
    documents_list,
    map_chunks,
)
from agent_gym.retrieval_index.corpus import DocStore, Document, make_hit_lists
from agent_gym.retrieval_index.engines.english_analyzer import EnglishAnalyzer
from agent_gym.retrieval_index.search_processes import SearchProcesses

logger = logging.getLogger(__name__)

__all__ = ["ImpactBM25", "IndexFormatError", "NumbaUnavailableError", "Vocabulary", "lucene_norm_length",
           "numba_available"]

INSTALL_HINT = "pip install numba"
_FORMAT = 2  # 1: int32 rows and float32 impacts; 2: segments of 16-bit row offsets, 8-bit impacts
BLOCK = 1 << 16  # rows per block: a segment's rows are its block's first row plus 16-bit offsets
_LEVELS = 255  # the largest one-byte code: a term's codebook has at most 256 values
_ARRAYS = {"term_segs": np.uint32, "seg_pos": np.int64, "seg_block": np.uint16, "low": np.uint16, "quant": np.uint8,
           "term_code": np.uint32, "codebook": np.float32, "term_max": np.float32}
_NAMES = tuple(_ARRAYS)
_PIPELINE = 32  # queries per kernel call in a batch (ImpactBM25._search_pipelined)


class NumbaUnavailableError(RetrievalError, ImportError):
    """The impact engine needs numba, which is not installed."""


class IndexFormatError(RetrievalError):
    """An impact index written in a format this version does not read (an earlier agent-gym's); rebuild it."""


def numba_available() -> bool:
    """Whether numba is installed (checked without importing it: the import alone costs ~75 MB)."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


_KERNEL = None
_KERNEL_LOCK = threading.Lock()
_EXTENSION = "agent_gym_impact_kernel"


def kernel_cache_dir() -> Path:
    """Where the ahead-of-time compiled kernel is kept: ``$AGENT_GYM_CACHE/kernels`` (``~/.cache/agent-gym``)."""
    return cache_root() / "kernels"


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
        package_root = str(Path(__file__).resolve().parents[3])
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root,
                                                                                 os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-c", "import sys\nfrom agent_gym.retrieval_index.engines._impact_kernel import "
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
            from agent_gym.retrieval_index.engines import _impact_kernel
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


def compress_postings(
    offsets: np.ndarray, postings: np.ndarray, impacts: np.ndarray, block: int = BLOCK
) -> dict[str, np.ndarray]:
    """The kernel's arrays (format 2) for posting lists given as ``offsets`` (term -> range), rows and impacts.

    Rows are split into blocks of ``block`` (a power of two from 4,096 to 65,536): one segment per term and
    block it occurs in, holding its block's number (16 bits) and 16-bit offsets from the block's first row.
    Per-term entries are 32-bit (``term_segs``, ``term_code``); posting positions (``seg_pos``) 64-bit.
    Impacts become one-byte codes into the term's codebook (``term_code[t]`` its start): the term's distinct
    impacts where it has at most 256, which is exact (BM25's impact depends on the term frequency and the
    one-byte length only, so most terms have few), else 256 levels evenly spaced over its ``[min, max]``, each
    impact rounded to the nearest. ``term_max`` is each term's largest codebook value.
    """
    if block & (block - 1) or not 4096 <= block <= 1 << 16:
        raise InvalidValue(f"block must be a power of two from 4096 to 65536, got {block}")
    offsets = np.asarray(offsets, dtype=np.int64)
    postings = np.asarray(postings, dtype=np.int64)
    impacts = np.asarray(impacts, dtype=np.float32)
    n_terms, total = len(offsets) - 1, len(postings)
    term_of = np.repeat(np.arange(n_terms, dtype=np.int64), np.diff(offsets))
    blocks = postings // block
    starts = np.ones(total, dtype=bool)
    starts[1:] = (term_of[1:] != term_of[:-1]) | (blocks[1:] != blocks[:-1])
    seg_first = np.flatnonzero(starts)
    seg_pos = np.append(seg_first, total).astype(np.int64)
    if total and int(blocks.max()) > np.iinfo(np.uint16).max:
        raise InvalidValue(f"{int(postings.max()) + 1} rows need more than 65,536 blocks of {block}: use larger blocks")
    seg_block = blocks[seg_first].astype(np.uint16)
    if len(seg_first) >= 2**32:
        raise InvalidValue(f"{len(seg_first)} posting segments: more than the index format's 2^32")
    term_segs = np.searchsorted(term_of[seg_first], np.arange(n_terms + 1), side="left").astype(np.uint32)
    low = (postings - blocks * block).astype(np.uint16)
    del blocks, starts, seg_first
    # Each term's distinct impacts, in order: rank among them is the code of an exactly coded term.
    order = np.lexsort((impacts, term_of))
    sorted_terms, sorted_values = term_of[order], impacts[order]
    new_value = np.ones(total, dtype=bool)
    new_value[1:] = (sorted_terms[1:] != sorted_terms[:-1]) | (sorted_values[1:] != sorted_values[:-1])
    distinct_id = np.cumsum(new_value) - 1
    distinct_term, distinct_value = sorted_terms[new_value], sorted_values[new_value]
    distinct_start = np.zeros(n_terms + 1, dtype=np.int64)
    np.cumsum(np.bincount(distinct_term, minlength=n_terms), out=distinct_start[1:])
    distinct_count = np.diff(distinct_start)
    exact = distinct_count <= _LEVELS + 1
    sizes = np.where(exact, distinct_count, _LEVELS + 1)
    term_code = np.zeros(n_terms + 1, dtype=np.int64)
    np.cumsum(sizes, out=term_code[1:])
    if term_code[-1] >= 2**32:
        raise InvalidValue(f"{int(term_code[-1])} codebook entries: more than the index format's 2^32")
    codebook = np.zeros(int(term_code[-1]), dtype=np.float32)
    kept = exact[distinct_term]
    codebook[term_code[distinct_term[kept]] + (np.flatnonzero(kept) - distinct_start[distinct_term[kept]])] = (
        distinct_value[kept])
    codes = distinct_id - distinct_start[sorted_terms]
    del distinct_id, new_value, distinct_value
    if not exact.all():
        # Terms with more distinct impacts than a byte holds: 256 levels evenly spaced over [min, max].
        term_min = np.where(exact, 0.0, sorted_values[np.minimum(offsets[:-1], max(total - 1, 0))].astype(np.float64))
        term_top = np.where(exact, 0.0, sorted_values[np.maximum(offsets[1:] - 1, 0)].astype(np.float64))
        step = (term_top - term_min) / _LEVELS
        wide = np.flatnonzero(~exact)
        levels = term_min[wide, None] + step[wide, None] * np.arange(_LEVELS + 1)
        codebook[(term_code[wide, None] + np.arange(_LEVELS + 1)).ravel()] = levels.ravel()
        rounded = ~exact[sorted_terms]
        scale = step[sorted_terms[rounded]]
        codes[rounded] = np.clip(np.rint(np.divide(
            sorted_values[rounded] - term_min[sorted_terms[rounded]], scale, out=np.zeros(len(scale)),
            where=scale > 0)), 0, _LEVELS)
        del rounded, scale
    quant = np.empty(total, dtype=np.uint8)
    quant[order] = codes
    del order, codes, sorted_terms, sorted_values, term_of
    term_max = np.maximum.reduceat(codebook, term_code[:-1]) if len(codebook) else np.zeros(n_terms)
    return {"term_segs": term_segs, "seg_pos": seg_pos, "seg_block": seg_block, "low": low, "quant": quant,
            "term_code": term_code.astype(np.uint32), "codebook": codebook, "term_max": term_max.astype(np.float32)}


def decode_postings(arrays: dict[str, np.ndarray], term: int, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """A term's rows and impacts, decoded from the compressed arrays: the reference the kernel's decoding is
    tested against."""
    rows, values = [], []
    code_base = int(arrays["term_code"][term])
    for segment in range(int(arrays["term_segs"][term]), int(arrays["term_segs"][term + 1])):
        span = slice(int(arrays["seg_pos"][segment]), int(arrays["seg_pos"][segment + 1]))
        rows.append(int(arrays["seg_block"][segment]) * block + arrays["low"][span].astype(np.int64))
        values.append(arrays["codebook"][code_base + arrays["quant"][span].astype(np.int64)].astype(np.float64))
    return np.concatenate(rows), np.concatenate(values)


def warm_up() -> None:
    """Compile (or load from cache) the search kernel now, on a two-document toy index."""
    arrays = {name: _read_only(values, _ARRAYS[name]) for name, values in
              compress_postings(np.array([0, 2]), np.array([0, 1]), np.array([1.0, 0.5])).items()}
    rows = np.empty((1, 1), dtype=np.int32)
    scores = np.empty((1, 1), dtype=np.float32)
    counts = np.empty(1, dtype=np.int32)
    _kernel()(np.array([0], dtype=np.int32), np.array([0, 1], dtype=np.int64), *(arrays[name] for name in _ARRAYS),
              BLOCK, 1, rows, scores, counts)


def _rebuild_command(directory: Path) -> str:
    """The ``agent-gym index build`` command that rebuilds the index in ``directory`` (from its manifest)."""
    from agent_gym.retrieval_index.manifest import Manifest, build_command

    try:
        manifest = Manifest.read(directory)
    except (OSError, ValueError, RetrievalError):
        return build_command("CORPUS.jsonl", "impact", directory)
    return build_command(manifest.corpus_path, manifest.backend, directory)


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
    """BM25 (Lucene's formula and English analysis) over precomputed impacts, MaxScore-pruned, compressed.

    Files in ``out_dir/impact``: the compressed postings (:func:`compress_postings`: ``term_segs.npy``,
    ``seg_pos.npy``, ``seg_block.npy``, ``low.npy``, ``quant.npy``, ``term_code.npy``, ``codebook.npy``,
    ``term_max.npy``), the vocabulary (see :class:`Vocabulary`) and ``params.json``. Everything is
    memory-mapped when opened from disk.

    ``threads``: queries of a batch are split across this many threads (the kernel releases the GIL);
    default: the CPUs this process may run on. ``processes`` (an index opened with :meth:`open` only): a
    batch is split across this process and ``processes - 1`` workers that open the same memory-mapped index
    (:class:`~agent_gym.retrieval_index.search_processes.SearchProcesses`), each with one thread. Threads are the
    better default: each runs its share in kernel calls of 32 queries, so its GIL-held Python (word lookup, reading
    the hits' text) overlaps the other's kernel; on 2 CPUs they measured 1.06-1.11x the processes' q/s at about
    half their memory (benchmarks/README.md, AMD EPYC).
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
        self._arrays = tuple(_read_only(arrays[name], dtype) for name, dtype in _ARRAYS.items())
        self._block = int(params.get("block", BLOCK))
        self._vocab = vocab
        self.k1, self.b = float(params["k1"]), float(params["b"])
        self._analyzer = EnglishAnalyzer(params.get("stemmer", "porter"), standard_tokens=True)
        self._docs = docs
        self._threads = threads or default_threads()
        self._workers: SearchProcesses | None = None  # set by open(processes > 1)
        warm_up()

    def score_tolerance(self, query: str) -> float:
        """A bound on how far a score of ``query`` is from exact BM25: half a level's step for each query word
        coded on evenly spaced levels (``(max - min) / 510``), nothing for the exactly coded ones."""
        term_code, codebook = self._arrays[_NAMES.index("term_code")], self._arrays[_NAMES.index("codebook")]
        bound = 0.0
        for term in self._term_ids(query):
            start, stop = int(term_code[term]), int(term_code[term + 1])
            if stop - start == _LEVELS + 1:  # perhaps levels (a term with exactly 256 impacts is exact anyway)
                bound += (float(codebook[start:stop].max()) - float(codebook[start:stop].min())) / (2 * _LEVELS)
        return bound

    # ----------------------------------------------------------------------------------- building

    @staticmethod
    def _index(
        docs: Iterable[Document], k1: float, b: float, stemmer: str, show_progress: bool, block: int = BLOCK
    ) -> tuple[dict[str, np.ndarray], Vocabulary, int]:
        """Arrays of the index, its vocabulary, and the document count."""
        from tqdm.auto import tqdm  # here, not at the top: a search worker never builds (tqdm.auto is 4 MB)

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
        del term_of, tf, norm
        return compress_postings(offsets, postings, impacts, block), vocab, n_docs

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        stemmer: str = "porter",
        show_progress: bool = False,
        block: int = BLOCK,
        threads: int | None = None,
    ) -> ImpactBM25:
        """An in-memory index over ``docs`` (``block``: rows per block, see :func:`compress_postings`)."""
        docs = documents_list(docs)
        arrays, vocab, _ = cls._index(docs, k1, b, stemmer, show_progress, block)
        return cls(arrays, vocab, {"k1": k1, "b": b, "stemmer": stemmer, "salt": vocab.salt, "block": block}, docs,
                   threads=threads)

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
        block: int = BLOCK,
    ) -> None:
        """Write the index (``out_dir/impact``) and, unless ``store_docs=False``, a document store.

        ``docs`` is read once for the index (and once more for the store); the postings of the
        whole corpus are held in memory while sorting (about 40 bytes per token).
        """
        out_dir = Path(out_dir)
        arrays, vocab, n_docs = cls._index(docs, k1, b, stemmer, show_progress, block)
        index_dir = out_dir / cls.SUBDIR
        if index_dir.exists():
            shutil.rmtree(index_dir)
        index_dir.mkdir(parents=True)
        for name, values in arrays.items():
            np.save(index_dir / f"{name}.npy", values)
        vocab.save(index_dir)
        params = {"format": _FORMAT, "k1": k1, "b": b, "stemmer": stemmer, "documents": n_docs, "salt": vocab.salt,
                  "block": block}
        (index_dir / "params.json").write_text(json.dumps(params))
        if store_docs:
            DocStore.write(docs, out_dir)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        docs: Sequence[Document] | None = None,
        *,
        threads: int | None = None,
        processes: int = 1,
    ) -> ImpactBM25:
        """Open an index written by :meth:`build`, its arrays memory-mapped.

        ``processes > 1`` starts ``processes - 1`` search workers (see the class); ``docs`` must then be
        ``None`` or a :class:`DocStore`, which the workers open too.

        Raises:
            IndexFormatError: the index was written by an earlier version in another format; the message
                gives the ``agent-gym index build`` command that rebuilds it.
        """
        index_dir = Path(directory) / cls.SUBDIR
        if not (index_dir / "params.json").is_file():
            raise FileNotFoundError(f"no impact index in {index_dir}")
        params = json.loads((index_dir / "params.json").read_text())
        if params.get("format") != _FORMAT:
            raise IndexFormatError(
                f"the impact index in {index_dir} is in format {params.get('format')} (an earlier agent-gym's, "
                f"8 bytes a posting); this version reads format {_FORMAT} (compressed postings). Rebuild it: "
                f"{_rebuild_command(Path(directory))}")
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise InvalidValue(f"processes must be an int >= 1, got {processes!r}")
        if processes > 1 and docs is not None and not isinstance(docs, DocStore):
            raise InvalidValue("processes > 1 needs the documents in a DocStore (or docs=None, the index's own): "
                               f"each search worker opens them from disk, and a {type(docs).__name__} has no path")
        arrays = {name: np.load(index_dir / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}  # no copy
        vocab = Vocabulary.load(index_dir, int(params.get("salt", 0)))
        docs = docs if docs is not None else DocStore(directory)
        retriever = cls(arrays, vocab, params, docs, threads=threads)
        if processes > 1:  # after this process has the compiled kernel: the workers load it, never compile it
            opener = functools.partial(_open_in_worker, str(directory), str(docs.directory))
            retriever._workers = SearchProcesses(opener, processes)
        return retriever

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
        self._kernel(np.asarray(flat, dtype=np.int32), np.asarray(starts, dtype=np.int64), *self._arrays,
                     self._block, k, rows, scores, counts)
        return make_hit_lists(self._docs, rows, scores, counts)

    def _search_pipelined(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """:meth:`_search_chunk` over runs of :data:`_PIPELINE` queries: a thread's word lookups and hit reads (which
        hold the GIL) then alternate with its kernel calls (which do not), so two threads overlap them instead of
        queueing for the GIL at the same moments, at a chunk's start and end."""
        return [hits for start in range(0, len(queries), _PIPELINE)
                for hits in self._search_chunk(queries[start : start + _PIPELINE], k)]

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        def local(chunk: Sequence[str]) -> list[list[Hit]]:
            return map_chunks(lambda part: self._search_pipelined(part, k), chunk, self._threads)

        if self._workers is not None and self._workers.alive and len(queries) >= PARALLEL_MIN_BATCH:
            return self._workers.map(queries, k, local)
        return local(queries)

    def _release(self) -> None:
        if self._workers is not None:
            self._workers.close()


def _open_in_worker(directory: str, store: str) -> ImpactBM25:
    """A search worker's retriever: the same index and store, one thread."""
    return ImpactBM25.open(directory, DocStore(store), threads=1)
