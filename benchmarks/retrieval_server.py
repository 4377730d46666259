"""Search requests per second end to end: `agent-gym index serve` against a Search-R1-style Pyserini server.

The peer is set up the way Search-R1's retrieval server is (and the FlashRAG and rLLM servers that
follow it): one FastAPI process, a synchronous ``POST /retrieve`` endpoint that FastAPI runs in its
thread pool, one shared Pyserini ``LuceneSearcher`` searching each query of a request with
``search(query, k)``, documents fetched by docid. Ours is ``agent_gym.retrieval_index.service.server``
(one worker, the default BM25 engine), answering the same ``/retrieve`` request shape. Both serve
the same corpus (the synthetic world, ``--pages`` pages) with Lucene's BM25 k1 = 1.2, b = 0.75.

Load: ``--clients`` concurrent clients (threads over ``--client-procs`` processes, each with a
keep-alive connection) send one question per request (``topk`` 5, the envs' default) for
``--seconds`` after ``--warmup-seconds``; requests per second, p50/p99 latency. Repeated
``--repeats`` times, servers started afresh each time; the ratio is ours over the peer's.

    python benchmarks/retrieval_server.py                 # 100,000 pages, 64 clients, 3 repeats
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "retrieval_server.json"


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ the peer


def peer_app(index_dir: str) -> object:
    """The Search-R1-style server: FastAPI, one process, a sync endpoint, one shared LuceneSearcher."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    from agent_gym.retrieval_index.corpus import DocStore
    from agent_gym.retrieval_index.engines.pyserini_bm25 import configure_jvm

    configure_jvm()
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(Path(index_dir) / "lucene"))
    searcher.set_bm25(1.2, 0.75)
    docs = DocStore(index_dir)

    class QueryRequest(BaseModel):
        queries: list[str]
        topk: int | None = None
        return_scores: bool = False

    app = FastAPI()

    def retrieve(request: QueryRequest) -> dict:
        results = []
        for query in request.queries:
            hits = searcher.search(query, k=request.topk or 3)
            found = []
            for hit in hits:
                doc = docs[int(hit.docid)]
                document = {"id": doc.id, "contents": f'"{doc.title}"\n{doc.text}'}
                found.append({"document": document, "score": hit.score} if request.return_scores else document)
            results.append(found)
        return {"result": results}

    # This module postpones annotations and the model is local: FastAPI needs the class itself.
    retrieve.__annotations__ = {"request": QueryRequest, "return": dict}
    app.post("/retrieve")(retrieve)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def run_peer(index_dir: str, port: int) -> None:
    import uvicorn

    uvicorn.run(peer_app(index_dir), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def run_ours(index_dir: str, port: int) -> None:
    from agent_gym.retrieval_index.service.server import serve

    serve(index_dir, host="127.0.0.1", port=port, workers=1, log_level="warning")


# ---------------------------------------------------------------------------------------- the clients


def _client_process(port: int, threads: int, queries: list[str], warmup: float, seconds: float,
                    offset: int, out: multiprocessing.Queue) -> None:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start_at = time.monotonic() + warmup
    stop_at = start_at + seconds

    def client(number: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        index = number * 7 + offset
        while True:
            now = time.monotonic()
            if now >= stop_at:
                break
            body = json.dumps({"queries": [queries[index % len(queries)]], "topk": 5, "return_scores": True})
            index += 1
            try:
                connection.request("POST", "/retrieve", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            end = time.monotonic()
            if now >= start_at and end <= stop_at:
                if ok:
                    mine.append(end - now)
                else:
                    with lock:
                        errors[0] += 1
        connection.close()
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=client, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put((latencies, errors[0]))


def load(port: int, clients: int, procs: int, queries: list[str], warmup: float, seconds: float) -> dict:
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = context.Queue()
    per_proc = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    processes = [context.Process(target=_client_process, args=(port, n, queries, warmup, seconds, 1000 * i, out))
                 for i, n in enumerate(per_proc)]
    for process in processes:
        process.start()
    latencies: list[float] = []
    errors = 0
    for _ in processes:
        got, failed = out.get()
        latencies.extend(got)
        errors += failed
    for process in processes:
        process.join()
    latencies.sort()

    def percentile(share: float) -> float:
        return latencies[min(len(latencies) - 1, int(share * len(latencies)))] * 1000 if latencies else float("nan")

    return {"rps": len(latencies) / seconds, "requests": len(latencies), "errors": errors,
            "p50_ms": percentile(0.50), "p99_ms": percentile(0.99)}


# ------------------------------------------------------------------------------------------- driver


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_ready(port: int, process: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server on port {port} exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server on port {port} not ready after {timeout} s")


def prepare(cache: Path, pages: int) -> tuple[Path, list[str]]:
    """An index directory holding both engines (ours and Lucene) over one document store, and questions."""
    from agent_gym.envs.synthetic_world import generate_world
    from agent_gym.retrieval_index.build import build_index
    from agent_gym.retrieval_index.corpus import CorpusFile, write_corpus
    from agent_gym.retrieval_index.engines.pyserini_bm25 import PyseriniBM25

    workdir = cache / f"server-{pages}"
    index_dir = workdir / "index"
    queries_file = workdir / "queries.json"
    if not (workdir / "ready").is_file():
        workdir.mkdir(parents=True, exist_ok=True)
        _log(f"generating {pages:,} pages and building both indexes ...")
        world = generate_world(num_pages=pages, seed=0)
        write_corpus(world.documents(), workdir / "corpus.jsonl")
        queries_file.write_text(json.dumps([task.question for task in world.questions(n=2000, seed=0)]))
        del world
        build_index(workdir / "corpus.jsonl", index_dir, backend="bm25", show_progress=False)
        PyseriniBM25.build(CorpusFile(workdir / "corpus.jsonl"), index_dir, store_docs=False, show_progress=False,
                           threads=1)
        (workdir / "ready").write_text("ok")
    return index_dir, json.loads(queries_file.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--client-procs", type=int, default=2, help="processes the clients' threads run in")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup-seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=str(ROOT / "runs" / "retrieval-bench"))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--serve", choices=("ours", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--index", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        (run_ours if args.serve == "ours" else run_peer)(args.index, args.port)
        return 0
    index_dir, queries = prepare(Path(args.cache_dir), args.pages)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                       OMP_NUM_THREADS="1")
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {"peer": [], "ours": []}
    for repeat in range(args.repeats):
        for side in ("peer", "ours"):
            port = _free_port()
            server = subprocess.Popen([sys.executable, __file__, "--serve", side, "--index", str(index_dir), "--port",
                                       str(port)], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _wait_ready(port, server)
                result = load(port, args.clients, args.client_procs, queries, args.warmup_seconds, args.seconds)
            finally:
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
            runs[side].append(result)
            _log(f"repeat {repeat + 1}/{args.repeats} {side}: {result['rps']:,.0f} requests/s, p50 "
                 f"{result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, {result['errors']} errors")
    load_end = os.getloadavg()
    ratios = [ours["rps"] / peer["rps"] for ours, peer in zip(runs["ours"], runs["peer"], strict=True)]
    record = {
        "benchmark": "search server end to end", "docs": args.pages, "clients": args.clients,
        "repeats": args.repeats, "seconds": args.seconds, "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "ours_rps": [round(r["rps"], 1) for r in runs["ours"]], "peer_rps": [round(r["rps"], 1) for r in runs["peer"]],
        "ours_p50_ms": statistics.median(r["p50_ms"] for r in runs["ours"]),
        "ours_p99_ms": statistics.median(r["p99_ms"] for r in runs["ours"]),
        "peer_p50_ms": statistics.median(r["p50_ms"] for r in runs["peer"]),
        "peer_p99_ms": statistics.median(r["p99_ms"] for r in runs["peer"]),
        "errors": sum(r["errors"] for side in runs.values() for r in side),
        "load_start": [round(x, 2) for x in load_start], "load_end": [round(x, 2) for x in load_end],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"\n/retrieve end to end, {args.pages:,} pages, {args.clients} clients, one question per request, top-5; "
          f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end\n")
    print("| server | requests/s (median) | p50 ms | p99 ms |\n|---|---:|---:|---:|")
    peer_rps = statistics.median(r["rps"] for r in runs["peer"])
    print(f"| Search-R1-style (FastAPI + Pyserini, 1 process) | {peer_rps:,.0f} "
          f"| {record['peer_p50_ms']:.1f} | {record['peer_p99_ms']:.1f} |")
    print(f"| agent-gym index serve (1 worker) | {statistics.median(r['rps'] for r in runs['ours']):,.0f} "
          f"| {record['ours_p50_ms']:.1f} | {record['ours_p99_ms']:.1f} |")
    print(f"\nratio: {record['ratio_median']:.2f}x [{record['ratio_min']:.2f}, {record['ratio_max']:.2f}] "
          f"over {args.repeats} repeats; errors: {record['errors']}")
    if not args.no_write:
        Path(args.results).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
