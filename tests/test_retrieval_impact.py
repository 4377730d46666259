"""The impact engine (MaxScore over precomputed BM25 impacts) returns exactly the exhaustive BM25 top k."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("numba")

from agent_gym.retrieval_index.base import RetrievalError  # noqa: E402
from agent_gym.retrieval_index.corpus import Document  # noqa: E402
from agent_gym.retrieval_index.engines.english_analyzer import EnglishAnalyzer  # noqa: E402
from agent_gym.retrieval_index.engines.impact_bm25 import (  # noqa: E402
    _ARRAYS,
    ImpactBM25,
    IndexFormatError,
    Vocabulary,
    decode_postings,
    lucene_norm_length,
)

WORDS = ["river", "city", "born", "year", "film", "director", "music", "band", "album", "school", "war",
         "king", "queen", "island", "lake", "mountain", "river", "river", "city", "city", "born"]


def _corpus(count: int, seed: int) -> list[Document]:
    rng = random.Random(seed)
    docs = []
    for row in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.05:
            words.append(f"rare{rng.randint(0, 20)}")
        docs.append(Document(id=f"d{row}", title=f"T{row}", text=" ".join(words)))
    return docs


class _Exhaustive:
    """BM25 of every document, Lucene's formula and one-byte lengths, ties to the lower row: the reference."""

    def __init__(self, docs: list[Document], k1: float = 1.2, b: float = 0.75) -> None:
        self.analyzer = EnglishAnalyzer(standard_tokens=True)
        self.ids = [doc.id for doc in docs]
        self.tokens = [Counter(self.analyzer(doc.contents)) for doc in docs]
        exact = [sum(tf.values()) for tf in self.tokens]
        self.lengths = lucene_norm_length(np.array(exact)).tolist()
        self.with_words = sum(1 for length in exact if length)
        self.avgdl = sum(exact) / self.with_words
        self.df = Counter(term for tf in self.tokens for term in tf)
        self.k1, self.b = k1, b

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        terms = self.analyzer(query)
        scored = []
        for row, tf in enumerate(self.tokens):
            score = 0.0
            for term in terms:
                if tf[term]:
                    idf = math.log(1 + (self.with_words - self.df[term] + 0.5) / (self.df[term] + 0.5))
                    norm = self.k1 * (1 - self.b + self.b * self.lengths[row] / self.avgdl)
                    score += idf * tf[term] / (tf[term] + norm)
            if score > 0:
                scored.append((-score, row))
        scored.sort()
        return [(self.ids[row], -negative) for negative, row in scored[:k]]


def _queries(seed: int, count: int = 40) -> list[str]:
    rng = random.Random(seed + 100)
    return [" ".join(rng.choice(WORDS + ["rare3", "rare7", "unknownword"]) for _ in range(rng.randint(1, 8)))
            for _ in range(count)]


def _quantized_exhaustive(retriever: ImpactBM25, query: str, k: int) -> list[tuple[int, float]]:
    """Every row's score summed from the decoded (dequantized) postings, ties to the lower row."""
    arrays = dict(zip(_ARRAYS, retriever._arrays, strict=True))
    scores = np.zeros(len(retriever._docs))
    for term in retriever._term_ids(query):
        rows, values = decode_postings(arrays, term, retriever._block)
        scores[rows] += values
    order = np.lexsort((np.arange(len(scores)), -scores))[:k]
    return [(int(row), float(scores[row])) for row in order if scores[row] > 0]


@pytest.mark.parametrize(("seed", "count", "block"), [(0, 3000, 65536), (1, 3000, 4096), (2, 20000, 4096),
                                                      (3, 20000, 65536), (4, 140_000, 65536)])
def test_compressed_search_returns_exactly_the_top_k_of_the_quantized_scores(seed: int, count: int, block: int) -> None:
    # The kernel decodes the segments as it gallops: its top k is the exhaustive top k of the same (quantized)
    # impacts. 20,000 rows in blocks of 4,096 and 140,000 in blocks of 65,536 span several segments a list.
    docs = _corpus(count, seed)
    queries = _queries(seed)
    with ImpactBM25.from_documents(docs, block=block) as retriever:
        results = retriever.search(queries, k=10)
        for query, hits in zip(queries, results, strict=True):
            expected = _quantized_exhaustive(retriever, query, 10)
            assert [hit.score for hit in hits] == pytest.approx([score for _, score in expected], rel=1e-5)
            # Same scores; the ids agree except where float rounding reorders exact ties.
            exact = {docs[row].id for row, score in expected if score > expected[-1][1] * (1 + 1e-5)}
            assert exact <= {hit.id for hit in hits}


def _skewed_corpus(count: int, seed: int) -> list[Document]:
    """A word in every document, one in a fifth, rare ones in a few hundred: the common lists turn non-essential
    once the rare rows set the k-th score, and most sub-windows of a dense window cannot reach it."""
    rng = random.Random(seed)
    docs = []
    for row in range(count):
        words = ["common"] * rng.randint(1, 3) + [rng.choice(WORDS) for _ in range(rng.randint(0, 20))]
        if rng.random() < 0.2:
            words.append("band")
        if rng.random() < 0.01:
            words.append(f"zeta{rng.randint(0, 9)}")
        rng.shuffle(words)
        docs.append(Document(id=f"d{row}", title=f"T{row}", text=" ".join(words)))
    return docs


@pytest.mark.parametrize("block", [65536, 4096])
def test_pruning_sub_windows_keeps_the_top_k_exact(block: int) -> None:
    # A dense window adds a non-essential list only into the sub-windows where it can still lift a row past the
    # k-th score; windows cut short by a block's end (blocks of 4,096) end in a partial sub-window.
    docs = _skewed_corpus(50_000, 7)
    queries = ["common band zeta5", "common zeta1 zeta2", "common band", "band common common zeta3 river",
               "zeta0 common", "common", "common river city born", "film director music band common",
               "king queen island common band", "lake mountain war school"]
    with ImpactBM25.from_documents(docs, block=block) as retriever:
        results = retriever.search(queries, k=10)
        for query, hits in zip(queries, results, strict=True):
            expected = _quantized_exhaustive(retriever, query, 10)
            assert len(hits) == 10
            assert [hit.score for hit in hits] == pytest.approx([score for _, score in expected], rel=1e-5)
            exact = {docs[row].id for row, score in expected if score > expected[-1][1] * (1 + 1e-5)}
            assert exact <= {hit.id for hit in hits}


def _two_rare_words_corpus(count: int, seed: int) -> list[Document]:
    """Two words in one document in two hundred each, a third in most: windows whose candidates come from two
    interleaved lists, with fewer rows holding both than the top k, so rows holding one look the third up."""
    rng = random.Random(seed)
    docs = []
    for row in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 12))]
        if rng.random() < 0.6:
            words += ["common"] * rng.randint(1, 4)
        for rare in ("alpha", "beta"):
            if rng.random() < 0.005:
                words.append(rare)
        rng.shuffle(words)
        docs.append(Document(id=f"d{row}", title=f"T{row}", text=" ".join(words)))
    return docs


def test_sparse_windows_score_the_rows_of_several_lists_in_row_order() -> None:
    # A sparse window's candidates arrive list by list; scored out of row order, a later lower row would find
    # the non-essential lists' cursors already past it and lose their impacts.
    docs = _two_rare_words_corpus(40_000, 11)
    queries = ["alpha beta common", "beta alpha common river", "alpha beta common common city"]
    with ImpactBM25.from_documents(docs) as retriever:
        for query, hits in zip(queries, retriever.search(queries, k=10), strict=True):
            expected = _quantized_exhaustive(retriever, query, 10)
            assert [hit.score for hit in hits] == pytest.approx([score for _, score in expected], rel=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_merging_a_run_keeps_the_rows_ascending(seed: int) -> None:
    from agent_gym.retrieval_index.engines._impact_kernel import _merge_run

    rng = np.random.default_rng(seed)
    runs = [np.sort(rng.integers(0, 500, rng.integers(0, 20))) for _ in range(rng.integers(1, 6))]
    rows = np.concatenate(runs).astype(np.int64)
    scratch = np.empty(len(rows), dtype=np.int64)
    start = 0
    for run in runs:
        _merge_run(rows, start, start + len(run), scratch)
        start += len(run)
        assert np.array_equal(rows[:start], np.sort(np.concatenate(runs)[:start]))


def _long_corpus(count: int, seed: int) -> list[Document]:
    """Documents of 1-400 words, common words repeated up to 30 times: more distinct impacts than a byte codes."""
    rng = random.Random(seed)
    docs = []
    for row in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 400))]
        words += [rng.choice(WORDS[:3])] * rng.randint(0, 30)
        docs.append(Document(id=f"d{row}", title=f"T{row}", text=" ".join(words)))
    return docs


@pytest.mark.parametrize(("seed", "count", "long"), [(0, 3000, False), (1, 3000, False), (2, 20000, False),
                                                     (5, 3000, True)])
def test_impact_search_is_exhaustive_bm25_within_the_codes_tolerance(seed: int, count: int, long: bool) -> None:
    # A term with at most 256 distinct impacts is coded exactly: the scores are BM25's. One with more is coded
    # on 256 levels: a score is within score_tolerance(query), and the exact top k is returned but for rows
    # within twice that of the k-th score.
    docs = (_long_corpus if long else _corpus)(count, seed)
    reference = _Exhaustive(docs)
    queries = _queries(seed)
    with ImpactBM25.from_documents(docs) as retriever:
        results = retriever.search(queries, k=10)
        tolerances = [retriever.score_tolerance(query) for query in queries]
    assert (max(tolerances) > 0) == long
    for query, hits, tolerance in zip(queries, results, tolerances, strict=True):
        everything = reference.search(query, len(docs))
        exact_score = dict(everything)
        expected = everything[:10]
        if not expected:  # only words outside the corpus
            assert hits == []
            continue
        assert tolerance < 0.01 * expected[0][1]  # a small fraction of a score
        for hit in hits:
            assert abs(hit.score - exact_score[hit.id]) <= tolerance + 1e-5 * exact_score[hit.id]
        clear = {doc_id for doc_id, score in expected if score > expected[-1][1] * (1 + 1e-5) + 2 * tolerance}
        assert clear <= {hit.id for hit in hits}


def test_impact_ties_rank_in_corpus_order() -> None:
    docs = [Document(id=f"d{row}", title="", text="same words here") for row in range(50)]
    with ImpactBM25.from_documents(docs) as retriever:
        hits = retriever.search_one("same words", k=5)
    assert [hit.id for hit in hits] == ["d0", "d1", "d2", "d3", "d4"]


def test_impact_repeated_query_word_counts_twice_as_in_lucene() -> None:
    docs = _corpus(500, 3)
    with ImpactBM25.from_documents(docs) as retriever:
        once = retriever.search_one("river", k=3)
        twice = retriever.search_one("river river", k=3)
    assert [hit.score * 2 for hit in once] == pytest.approx([hit.score for hit in twice], rel=1e-6)


def test_impact_answers_any_query_without_raising() -> None:
    docs = _corpus(200, 4)
    odd = ["", "   ", "the and of", "\ud800 river", "x" * 100_000, "AND OR NOT: (river", "rare1 " * 2000, "ß∂ƒ"]
    with ImpactBM25.from_documents(docs) as retriever:
        results = retriever.search(odd, k=5)
    assert len(results) == len(odd)
    assert results[0] == [] and results[2] == []
    assert all(len(hits) <= 5 for hits in results)


def test_impact_returns_fewer_hits_when_fewer_documents_match() -> None:
    docs = [Document("a", "", "alpha beta"), Document("b", "", "gamma"), Document("c", "", "alpha")]
    with ImpactBM25.from_documents(docs) as retriever:
        assert [hit.id for hit in retriever.search_one("alpha", k=10)] == ["c", "a"]
        assert retriever.search_one("alpha", k=0) == []


def test_impact_threads_give_the_same_results_as_one_thread() -> None:
    docs = _corpus(2000, 5)
    queries = [f"{WORDS[i % len(WORDS)]} {WORDS[(3 * i) % len(WORDS)]} rare{i % 20}" for i in range(100)]
    one = ImpactBM25.from_documents(docs)
    one._threads = 1
    two = ImpactBM25.from_documents(docs)
    two._threads = 2
    assert one.search(queries, k=7) == two.search(queries, k=7)


def test_impact_index_written_and_reopened_searches_the_same(tmp_path) -> None:
    docs = _corpus(800, 6)
    ImpactBM25.build(docs, tmp_path, show_progress=False)
    queries = ["river city", "rare4 born", "film director music"]
    with ImpactBM25.open(tmp_path) as opened, ImpactBM25.from_documents(docs) as in_memory:
        assert opened.search(queries, k=10) == in_memory.search(queries, k=10)


def test_impact_search_after_close_is_a_retrieval_error() -> None:
    retriever = ImpactBM25.from_documents(_corpus(10, 7))
    retriever.close()
    retriever.close()  # idempotent
    with pytest.raises(RetrievalError):
        retriever.search(["river"])


def test_lucene_norm_length_keeps_short_lengths_and_four_bits_of_long_ones() -> None:
    assert lucene_norm_length(np.array([0, 5, 23, 24, 31, 32, 45, 100])).tolist() == [0, 5, 23, 24, 31, 32, 44, 96]


def test_impact_refuses_an_empty_corpus() -> None:
    with pytest.raises(ValueError, match="empty corpus"):
        ImpactBM25.from_documents([])


def test_vocabulary_finds_every_word_it_was_built_from_and_no_other(tmp_path) -> None:
    words = [f"word{i}" for i in range(5000)] + ["naïve", "4,527,000", "u.s"]
    vocab, renumber = Vocabulary.build(words)
    vocab.save(tmp_path)
    reopened = Vocabulary.load(tmp_path, vocab.salt)
    assert reopened.lookup(words) == renumber.tolist()
    assert sorted(renumber.tolist()) == list(range(len(words)))
    assert reopened.lookup(["word5000", "", "naive"]) == [-1, -1, -1]


_FRESH_PROCESS_SEARCH = (
    "import sys\n"
    "from agent_gym.retrieval_index.corpus import Document\n"
    "from agent_gym.retrieval_index.engines.impact_bm25 import ImpactBM25\n"
    "docs = [Document(str(i), '', f'word{i} shared') for i in range(50)]\n"
    "hits = ImpactBM25.from_documents(docs).search_one('word3 shared', 3)\n"
    "assert hits[0].id == '3', hits\n"
    "print('numba' in sys.modules)\n"
)


def test_a_process_with_the_compiled_kernel_module_never_imports_numba() -> None:
    from agent_gym.retrieval_index.engines.impact_bm25 import _extension_path, _kernel

    _kernel()  # builds the module once per machine where a C compiler is present
    if not _extension_path().is_file():
        pytest.skip("no ahead-of-time kernel module on this machine (no C compiler): the JIT serves")
    completed = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_SEARCH], capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "False"


def test_without_the_compiled_module_the_jit_kernel_answers_the_same(tmp_path) -> None:
    environment = dict(os.environ, AGENT_GYM_NO_AOT="1", AGENT_GYM_CACHE=str(tmp_path))
    completed = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_SEARCH], capture_output=True, text=True,
                               timeout=300, env=environment)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "True"


def test_the_kernel_releases_the_gil_so_a_split_batch_runs_on_every_core() -> None:
    # With a 10 s switch interval the worker thread keeps the GIL from reading the counter until it reads it again,
    # unless the kernel releases it: only then does the main thread (sleep(0) in a loop) count during the search.
    import threading

    engine = ImpactBM25.from_documents(_corpus(5000, 11))
    flat, starts = [], [0]
    for query in [" ".join(random.Random(n).choices(WORDS, k=6)) for n in range(2000)]:
        flat.extend(engine._term_ids(query))
        starts.append(len(flat))
    args = (np.asarray(flat, dtype=np.int32), np.asarray(starts, dtype=np.int64), *engine._arrays, engine._block, 10,
            np.empty((2000, 10), dtype=np.int32), np.empty((2000, 10), dtype=np.float32), np.empty(2000, np.int32))
    engine._kernel(*args)  # compiled (or loaded) before the measure
    counter, seen, finished = [0], [], threading.Event()

    def search() -> None:
        before = counter[0]
        engine._kernel(*args)
        seen.append(counter[0] - before)
        finished.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        worker = threading.Thread(target=search)
        worker.start()
        while not finished.is_set():
            counter[0] += 1
            time.sleep(0)
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert seen[0] > 0, f"{type(engine._kernel).__name__} held the GIL for the whole batch"


def test_an_index_of_the_uncompressed_format_is_refused_with_the_rebuild_command(tmp_path) -> None:
    # Indexes written before compression (format 1: int32 rows, float32 impacts) must not be read as format 2.
    import json

    from agent_gym.retrieval_index.build import build_index, open_index
    from agent_gym.retrieval_index.corpus import write_corpus

    corpus = tmp_path / "corpus.jsonl"
    write_corpus(_corpus(50, 8), corpus)
    index = tmp_path / "idx"
    build_index(corpus, index, "impact", show_progress=False)
    params_file = index / "impact" / "params.json"
    params = json.loads(params_file.read_text())
    params["format"] = 1
    params_file.write_text(json.dumps(params))
    for name in _ARRAYS:
        (index / "impact" / f"{name}.npy").unlink()
    for name in ("offsets", "postings", "impacts", "term_max"):
        np.save(index / "impact" / f"{name}.npy", np.zeros(3))
    with pytest.raises(IndexFormatError, match=rf"format 1 .*Rebuild it: agent-gym index build --corpus {corpus} "
                                               rf"--backend impact --out {index}"):
        open_index(index)
    with pytest.raises(IndexFormatError, match="Rebuild it: agent-gym index build"):
        ImpactBM25.open(index)


def test_compressed_postings_take_three_bytes_a_posting(tmp_path) -> None:
    docs = _corpus(20000, 9)  # each title a word of its own: 20,000 one-posting lists
    ImpactBM25.build(docs, tmp_path, show_progress=False)
    folder = tmp_path / "impact"
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
    postings, terms = len(arrays["low"]), len(arrays["term_max"])
    assert (arrays["low"].dtype, arrays["quant"].dtype) == (np.uint16, np.uint8)
    size = sum((folder / f"{name}.npy").stat().st_size for name in _ARRAYS)
    uncompressed = 8 * postings + 12 * terms  # format 1: int32 rows, float32 impacts, offsets and maxima
    assert size < 0.7 * uncompressed
