"""A batch split across search worker processes answers exactly as one process, and survives a dead worker."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal

import pytest

pytest.importorskip("numba")

from agent_gym.error import InvalidValue  # noqa: E402
from agent_gym.retrieval_index.build import build_index, open_index  # noqa: E402
from agent_gym.retrieval_index.corpus import Document  # noqa: E402
from agent_gym.retrieval_index.engines.impact_bm25 import ImpactBM25  # noqa: E402
from agent_gym.retrieval_index.search_processes import SearchProcesses  # noqa: E402

WORDS = ["river", "city", "born", "year", "film", "director", "music", "band", "album", "school", "war", "king"]


def _docs(count: int = 600) -> list[Document]:
    def text(row: int) -> str:
        return " ".join(WORDS[(row * 7 + i * 3) % len(WORDS)] for i in range(1 + row % 13)) + f" rare{row % 31}"

    return [Document(id=f"d{row}", title=f"T{row}", text=text(row)) for row in range(count)]


QUERIES = [f"{WORDS[i % len(WORDS)]} {WORDS[(5 * i) % len(WORDS)]} rare{i % 31}" for i in range(60)]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("impact-index")
    ImpactBM25.build(_docs(), directory, show_progress=False)
    return directory


def test_a_batch_split_across_processes_gets_the_hits_of_one_process(index_dir) -> None:
    with ImpactBM25.open(index_dir, threads=1) as one, ImpactBM25.open(index_dir, threads=1, processes=3) as three:
        assert three._workers.alive == 2
        assert all(worker.process.pid != os.getpid() for worker in three._workers._workers)
        expected = one.search(QUERIES, k=7)
        assert three.search(QUERIES, k=7) == expected
        assert three.search(QUERIES[:5], k=7) == expected[:5]  # too small to split: this process alone
        searched_here: list[str] = []

        def local(chunk):
            searched_here.extend(chunk)
            return one.search(list(chunk), k=7)

        assert three._workers.map(QUERIES, 7, local) == expected
        assert searched_here == QUERIES[:20]  # the other two thirds were the workers'


def test_a_killed_worker_costs_speed_not_answers(index_dir, caplog: pytest.LogCaptureFixture) -> None:
    with ImpactBM25.open(index_dir, threads=1) as one, ImpactBM25.open(index_dir, threads=1, processes=3) as three:
        expected = one.search(QUERIES, k=5)
        assert three.search(QUERIES, k=5) == expected
        victim = three._workers._workers[0].process
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        with caplog.at_level(logging.WARNING, logger="agent_gym.retrieval_index.search_processes"):
            assert three.search(QUERIES, k=5) == expected
        assert three._workers.alive == 1
        assert f"search worker {victim.pid} exited with status -9" in caplog.text
        assert three.search(QUERIES, k=5) == expected  # and every later batch


def test_a_hung_worker_is_stopped_after_the_answer_timeout(index_dir, caplog: pytest.LogCaptureFixture) -> None:
    with ImpactBM25.open(index_dir, threads=1) as one, ImpactBM25.open(index_dir, threads=1, processes=2) as two:
        expected = one.search(QUERIES, k=5)
        assert two.search(QUERIES, k=5) == expected
        hung = two._workers._workers[0].process
        os.kill(hung.pid, signal.SIGSTOP)  # alive, never answering: the search must not freeze with it
        two._workers.answer_timeout = 0.5
        with caplog.at_level(logging.WARNING, logger="agent_gym.retrieval_index.search_processes"):
            assert two.search(QUERIES, k=5) == expected
        assert two._workers.alive == 0 and hung.poll() is not None
        assert f"search worker {hung.pid}" in caplog.text and "no answer within 0.5 s" in caplog.text


def test_a_workers_error_is_raised_here_and_leaves_it_in_step(index_dir) -> None:
    with ImpactBM25.open(index_dir, threads=1) as one:
        workers = SearchProcesses(functools.partial(ImpactBM25.open, str(index_dir), threads=1), 2)
        try:
            with pytest.raises(InvalidValue, match="k must be a non-negative int"):
                workers.map(QUERIES, -1, lambda chunk: [[] for _ in chunk])
            assert workers.alive == 1
            expected = one.search(QUERIES, k=4)
            assert workers.map(QUERIES, 4, lambda chunk: one.search(list(chunk), k=4)) == expected
        finally:
            workers.close()


def test_a_worker_that_cannot_open_the_index_is_dropped_with_a_warning(tmp_path, caplog) -> None:
    workers = SearchProcesses(functools.partial(ImpactBM25.open, str(tmp_path / "missing")), 2)
    try:
        with caplog.at_level(logging.WARNING, logger="agent_gym.retrieval_index.search_processes"):
            hits = workers.map(QUERIES, 3, lambda chunk: [[] for _ in chunk])
        assert hits == [[] for _ in QUERIES]
        assert workers.alive == 0
        assert "could not open the index" in caplog.text and "no impact index" in caplog.text
    finally:
        workers.close()


def test_close_stops_the_workers(index_dir) -> None:
    retriever = ImpactBM25.open(index_dir, processes=2)
    processes = [worker.process for worker in retriever._workers._workers]
    retriever.close()
    assert all(process.poll() is not None for process in processes)
    assert retriever._workers.alive == 0


def test_open_index_takes_processes(tmp_path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in _docs(200)))
    build_index(corpus, tmp_path / "index", "impact", show_progress=False)
    with open_index(tmp_path / "index", processes=2) as split, open_index(tmp_path / "index") as alone:
        assert split._workers.alive == 1 and alone._workers is None
        assert split.search(QUERIES, k=3) == alone.search(QUERIES, k=3)


def test_processes_need_an_index_and_documents_on_disk(index_dir) -> None:
    with pytest.raises(InvalidValue, match="DocStore"):
        ImpactBM25.open(index_dir, _docs(), processes=2)
    with pytest.raises(InvalidValue, match="processes must be an int >= 1"):
        ImpactBM25.open(index_dir, processes=0)
    with pytest.raises(InvalidValue, match="picklable"):
        SearchProcesses(lambda: None, 2)


def _worker_share(opener, queries: list[str], monkeypatch: pytest.MonkeyPatch) -> list[list[bool]]:
    """The answers of one worker to the second half of ``queries`` (this process takes the first)."""
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__))  # the worker imports support.search_worker_probe
    workers = SearchProcesses(opener, 2)
    try:
        answers = workers.map(queries, 1, lambda chunk: [[None] for _ in chunk])
        assert workers.alive == 1
    finally:
        workers.close()
    return answers[len(queries) // 2 :]


MODULES = ["gymnasium", "agent_gym.env", "tqdm.auto", "agent_gym.retrieval_index.engines.impact_bm25"]


def test_a_worker_loads_only_what_search_needs(index_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    from support.search_worker_probe import AfterASearch

    # The package's __init__ (every environment, gymnasium, asyncio) stays unrun in a worker of the impact engine.
    opener = functools.partial(AfterASearch, str(index_dir))
    assert _worker_share(opener, MODULES * 2, monkeypatch) == [[False], [False], [False], [True]]


def test_a_worker_whose_opener_reads_the_package_gets_all_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from support.search_worker_probe import PackageVersion

    assert _worker_share(PackageVersion, MODULES[:2] * 2, monkeypatch) == [[True], [True]]
