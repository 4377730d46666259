"""Load test of the search fleet on loopback: one replica killed and restarted mid-run; the same against one.

`agent-gym index serve INDEX --replicas R` serves a BM25 index of a SynthHop world (its supervisor restarts a
replica that dies). 64 client threads, each with its own `RemoteRetriever` over the R URLs (as 64 env workers
would have), send `--requests` searches in all, one query per request (k=5). When a quarter of them are done,
one replica's server process is killed (SIGKILL); the supervisor starts it again. Every request's end time,
latency and outcome are recorded, then split into three phases: before the kill, during (until the killed
replica answers /health again), after. Errors are what the env would see: `RetrievalError` from `search`.

    python benchmarks/search_fleet.py                      # 2 replicas, then 1 replica, 10,000 requests each
    python benchmarks/search_fleet.py --replicas 3 --requests 20000

Bounded: each run stops after --requests requests or --max-seconds, whichever comes first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from agent_gym.retrieval_index.base import RetrievalError
from agent_gym.retrieval_index.service.client import RemoteRetriever, wait_until_ready


def build_corpus_index(num_pages: int, out_dir: Path) -> tuple[Path, list[str]]:
    """A BM25 index of a SynthHop world, and queries (its questions) to send."""
    from agent_gym.envs.synthetic_world import generate_world
    from agent_gym.retrieval_index.build import build_index

    world = generate_world(num_pages=num_pages, seed=0)
    corpus = out_dir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": page.id, "title": page.title, "text": page.text}) + "\n"
                              for page in world.pages), encoding="utf-8")
    index = out_dir / "index"
    build_index(corpus, index, backend="bm25", show_progress=False)
    queries = [task.question for task in world.questions(hops=(1, 2), n=500, seed=0)]
    return index, queries


def _free_ports(count: int) -> int:
    """A first port with ``count`` free ports from it."""
    import socket

    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        try:
            for offset in range(count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", first + offset))
            return first
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(index: Path, queries: list[str], replicas: int, args: argparse.Namespace) -> dict:
    port = _free_ports(replicas)
    urls = [f"http://127.0.0.1:{port + i}" for i in range(replicas)]
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "agent_gym.cli", "index", "serve", str(index), "--replicas", str(replicas),
         "--port", str(port), "--log-level", "warning"], stdout=subprocess.DEVNULL)
    records: list[tuple[float, float, bool]] = []  # (end time, latency s, ok)
    lock = threading.Lock()
    issued = 0
    events: dict[str, float] = {}
    try:
        pids = [wait_until_ready(url, timeout=120)["pid"] for url in urls]
        warmed = threading.Barrier(args.clients + 1)
        started, stop_at = 0.0, float("inf")  # set once every client is warm

        def client(worker: int) -> None:
            nonlocal issued
            remote = RemoteRetriever(urls, total_timeout=args.total_timeout)
            for url_index in range(len(urls)):  # connections open and /health read before the clock starts
                remote.search([queries[url_index]], 5)
            warmed.wait()
            local: list[tuple[float, float, bool]] = []
            while True:
                with lock:
                    if issued >= args.requests or time.monotonic() > stop_at:
                        break
                    number = issued
                    issued += 1
                query = queries[(number * 7 + worker) % len(queries)]
                begin = time.monotonic()
                try:
                    remote.search([query], 5)
                    ok = True
                except RetrievalError:
                    ok = False
                end = time.monotonic()
                local.append((end, end - begin, ok))
            remote.close()
            with lock:
                records.extend(local)

        def killer() -> None:
            while True:
                with lock:
                    if issued >= args.requests * args.kill_at or time.monotonic() > stop_at:
                        break
                time.sleep(0.005)
            events["kill"] = time.monotonic()
            os.kill(pids[0], signal.SIGKILL)
            while time.monotonic() < stop_at + 60:
                try:
                    health = httpx.get(f"{urls[0]}/health", timeout=1)
                    if health.status_code == 200 and health.json().get("pid") != pids[0]:
                        events["back"] = time.monotonic()
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)

        threads = [threading.Thread(target=client, args=(worker,)) for worker in range(args.clients)]
        kill_thread = threading.Thread(target=killer)
        for thread in threads:
            thread.start()
        warmed.wait()
        started = time.monotonic()
        stop_at = started + args.max_seconds
        kill_thread.start()
        for thread in threads:
            thread.join()
        finished = time.monotonic()
        kill_thread.join()
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=60)
    kill, back = events.get("kill", finished), events.get("back", finished)
    phases = {"before": (started, kill), "during": (kill, min(back, finished)), "after": (min(back, finished),
                                                                                          finished)}
    report = {"replicas": replicas, "requests": len(records), "wall_s": finished - started,
              "replica_back_after_s": back - kill if "back" in events else None}
    for name, (low, high) in phases.items():
        inside = [(latency, ok) for end, latency, ok in records if low <= end < high or (name == "after" and
                                                                                         end == high)]
        latencies = [1000 * latency for latency, ok in inside if ok]
        report[name] = {"requests": len(inside), "errors": sum(not ok for _, ok in inside),
                        "p50_ms": _percentile(latencies, 0.5), "p99_ms": _percentile(latencies, 0.99),
                        "max_ms": max(latencies, default=float("nan")),
                        "qps": len(inside) / (high - low) if high > low else float("nan"), "seconds": high - low}
    return report


def _print(report: dict) -> None:
    back = report["replica_back_after_s"]
    print(f"[{report['replicas']} replica(s)] {report['requests']} requests in {report['wall_s']:.1f} s; killed "
          f"replica answered again after {back:.1f} s" if back is not None else "; killed replica not back")
    print(f"  {'phase':7s} {'requests':>8s} {'errors':>6s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'q/s':>7s} "
          f"{'s':>5s}")
    for name in ("before", "during", "after"):
        row = report[name]
        print(f"  {name:7s} {row['requests']:8d} {row['errors']:6d} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} "
              f"{row['max_ms']:8.1f} {row['qps']:7.0f} {row['seconds']:5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=10_000, help="requests in all, over the clients")
    parser.add_argument("--kill-at", type=float, default=0.25, help="fraction of requests issued at the kill")
    parser.add_argument("--total-timeout", type=float, default=10.0, help="RemoteRetriever total_timeout")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="stop issuing requests after this")
    parser.add_argument("--num-pages", type=int, default=5000, help="SynthHop world size of the index")
    parser.add_argument("--no-single", action="store_true", help="skip the single-replica run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-gym-fleet-") as tmp:
        index, queries = build_corpus_index(args.num_pages, Path(tmp))
        print(f"index: BM25 over {args.num_pages} SynthHop pages; {args.clients} clients, {args.requests} requests "
              f"per run, one query each (k=5); replica 0 killed at {args.kill_at:.0%} of the requests")
        _print(run(index, queries, args.replicas, args))
        if not args.no_single:
            _print(run(index, queries, 1, args))


if __name__ == "__main__":
    main()
