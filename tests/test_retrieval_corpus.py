"""Corpus files: the three JSONL shapes, compression, clear errors, checksums and the document store."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from agent_gym.error import IndexOutOfRange, InvalidValue
from agent_gym.retrieval_index.corpus import (
    DocStore,
    Document,
    corpus_checksum,
    iter_corpus,
    load_corpus,
    make_hit_lists,
    make_hits,
    write_corpus,
)

DOCS = [
    Document("d1", "Ed Wood", "Edward Davis Wood Jr. was an American filmmaker."),
    Document("d2", "Scott Derrickson", "Scott Derrickson is an American director."),
    Document("d3", "", "A passage without a title, and unicode: Zoë, 東京."),
]


def _write_lines(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_load_corpus_reads_our_shape(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", [{"id": d.id, "title": d.title, "text": d.text} for d in DOCS])
    assert load_corpus(path) == DOCS


def test_load_corpus_reads_beir_shape(tmp_path: Path) -> None:
    records = [{"_id": "12", "title": "Ed Wood", "text": "A filmmaker.", "metadata": {}}]
    assert load_corpus(_write_lines(tmp_path / "beir.jsonl", records)) == [
        Document("12", "Ed Wood", "A filmmaker.")
    ]


def test_load_corpus_splits_wiki18_contents_into_title_and_text(tmp_path: Path) -> None:
    records = [{"id": "1", "contents": '"Aaron"\nAaron is a prophet.\nSecond line.'}]
    assert load_corpus(_write_lines(tmp_path / "wiki18.jsonl", records)) == [
        Document("1", "Aaron", "Aaron is a prophet.\nSecond line.")
    ]


def test_integer_ids_become_strings(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", [{"id": 7, "title": "T", "text": "x"}])
    assert load_corpus(path)[0].id == "7"


@pytest.mark.parametrize("suffix, opener", [(".jsonl.gz", gzip.open), (".jsonl.xz", lzma.open)])
def test_compressed_corpus_reads_like_plain(tmp_path: Path, suffix: str, opener) -> None:
    path = tmp_path / f"c{suffix}"
    with opener(path, "wt", encoding="utf-8") as handle:
        for doc in DOCS:
            handle.write(json.dumps({"id": doc.id, "title": doc.title, "text": doc.text}) + "\n")
    assert list(iter_corpus(path)) == DOCS


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('\n{"id": "a", "title": "A", "text": "x"}\n\n   \n')
    assert len(load_corpus(path)) == 1


def test_missing_corpus_names_the_path_and_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl") as caught:
        load_corpus(missing)
    assert "JSONL corpus" in str(caught.value)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "x"}\n{"id": "b", oops\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not valid JSON"):
        load_corpus(path)


def test_record_without_text_lists_the_accepted_shapes(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", [{"id": "a", "body": "x"}])
    with pytest.raises(ValueError, match=r":1: .*neither 'text' nor 'contents'.*BEIR"):
        load_corpus(path)


def test_record_without_id_is_rejected_with_its_keys(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", [{"title": "A", "text": "x"}])
    with pytest.raises(ValueError, match=r":1: document has no 'id'.*\['text', 'title'\]"):
        load_corpus(path)


def test_non_object_line_is_rejected(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "c.jsonl", [[1, 2]])
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        load_corpus(path)


@pytest.mark.parametrize("name", ["out.jsonl", "out.jsonl.gz", "out.jsonl.xz"])
def test_write_corpus_round_trips(tmp_path: Path, name: str) -> None:
    assert write_corpus(DOCS, tmp_path / name) == len(DOCS)
    assert load_corpus(tmp_path / name) == DOCS


def test_checksum_is_sha256_of_the_bytes_and_tracks_content(tmp_path: Path) -> None:
    first = tmp_path / "a.jsonl"
    write_corpus(DOCS, first)
    second = tmp_path / "b.jsonl"
    write_corpus(DOCS[:2], second)
    assert corpus_checksum(first).startswith("sha256:")
    assert corpus_checksum(first) != corpus_checksum(second)
    write_corpus(DOCS[:2], first)
    assert corpus_checksum(first) == corpus_checksum(second)


def test_docstore_returns_each_document_by_row(tmp_path: Path) -> None:
    DocStore.write(DOCS, tmp_path)
    store = DocStore(tmp_path)
    assert len(store) == len(DOCS)
    assert [store[i] for i in range(len(DOCS))] == DOCS
    assert store[-1] == DOCS[-1]
    assert store[0:2] == DOCS[:2]
    store.close()
    store.close()  # idempotent


def test_docstore_packs_its_offsets_in_four_bytes_and_still_reads_eight_byte_ones(tmp_path: Path) -> None:
    import numpy as np

    DocStore.write(DOCS, tmp_path)
    assert np.load(tmp_path / DocStore.OFFSETS).dtype == np.uint32
    expected = list(DocStore(tmp_path))
    # A store written before the packing (uint64 offsets) reads the same.
    np.save(tmp_path / DocStore.OFFSETS, np.load(tmp_path / DocStore.OFFSETS).astype(np.uint64))
    assert list(DocStore(tmp_path)) == expected == list(DOCS)


def test_docstore_row_out_of_range_raises_index_error(tmp_path: Path) -> None:
    DocStore.write(DOCS, tmp_path)
    with pytest.raises(IndexError, match="out of range"):
        DocStore(tmp_path)[len(DOCS)]


def test_docstore_missing_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no document store"):
        DocStore(tmp_path)


def test_make_hits_keeps_order_and_scores() -> None:
    hits = make_hits(DOCS, [2, 0], [3.5, 1.0])
    assert [(hit.id, hit.score) for hit in hits] == [("d3", 3.5), ("d1", 1.0)]
    assert hits[1].title == "Ed Wood"


@pytest.mark.parametrize("stored", [False, True])
def test_make_hit_lists_splits_a_batch_by_its_counts(tmp_path: Path, stored: bool) -> None:
    # A batch's rows and scores come as (queries, k) arrays with a count each (the impact kernel's output).
    if stored:
        DocStore.write(DOCS, tmp_path)
    docs = DocStore(tmp_path) if stored else DOCS
    rows = np.array([[2, 0, 1], [1, 7, 7], [7, 7, 7]], dtype=np.int32)  # 7: past the counts, never read
    scores = np.array([[3.5, 2.0, 1.0], [0.5, 9.0, 9.0], [9.0, 9.0, 9.0]], dtype=np.float32)
    lists = make_hit_lists(docs, rows, scores, np.array([3, 1, 0], dtype=np.int32))
    assert [[(hit.id, hit.score) for hit in hits] for hits in lists] == [
        [("d3", 3.5), ("d1", 2.0), ("d2", 1.0)], [("d2", 0.5)], []]
    assert lists[0][0] == make_hits(docs, [2], [3.5])[0]


def test_a_stored_batch_with_a_row_out_of_range_is_a_clear_error(tmp_path: Path) -> None:
    DocStore.write(DOCS, tmp_path)
    store = DocStore(tmp_path)
    with pytest.raises(IndexOutOfRange, match="row 3 out of range"):
        store.hit_lists(np.array([[0, 3]]), np.array([[1.0, 1.0]]), np.array([2]))
    with pytest.raises(IndexOutOfRange, match="row -1 out of range"):
        store.hits([-1], [1.0])
    store.close()
    with pytest.raises(InvalidValue, match="closed"):
        store.hits([0], [1.0])
