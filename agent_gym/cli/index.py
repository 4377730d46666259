"""``agent-gym index build`` and ``agent-gym index serve``: search indexes over a corpus, served over HTTP.

The retrieval modules are imported when a command runs, so ``agent-gym index --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from agent_gym.cli.args import port_number

__all__ = ["add_index_build_arguments", "add_index_serve_arguments", "run_index_build", "run_index_serve"]


def _parse_param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    for convert in (int, float):
        try:
            return key, convert(value)
        except ValueError:
            continue
    return key, value


def add_index_build_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``agent-gym index build`` to ``parser``."""
    from agent_gym.retrieval_index.bm25 import DEFAULT_BM25_BACKEND
    from agent_gym.retrieval_index.build import BACKENDS

    parser.add_argument(
        "--corpus", required=True, help="JSONL corpus ({id,title,text}, BEIR or wiki-18; .gz/.xz ok)"
    )
    parser.add_argument(
        "--backend",
        default="bm25",
        choices=BACKENDS,
        help=f"retrieval engine (bm25 = {DEFAULT_BM25_BACKEND}, chosen by benchmarks/retrieval.py)",
    )
    parser.add_argument("--out", required=True, help="index directory to write")
    parser.add_argument(
        "--encoder",
        default=None,
        help="sentence-transformers model for dense/hybrid (default: all-MiniLM-L6-v2, offline)",
    )
    parser.add_argument(
        "--faiss-index", default=None, choices=("flat", "hnsw", "ivfpq"), help="FAISS index for dense/hybrid"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        type=_parse_param,
        metavar="KEY=VALUE",
        help="engine parameter, repeatable (e.g. k1=0.9 with --backend bm25s or pyserini, nlist=1024 with dense, "
        "sparse=bm25s with hybrid); tantivy, the bm25 default, takes none (it fixes k1=1.2, b=0.75)",
    )
    return parser


def run_index_build(namespace: argparse.Namespace) -> int:
    """Run ``agent-gym index build``; return the exit status."""
    params = dict(namespace.param)
    if namespace.faiss_index:
        params["faiss_index"] = namespace.faiss_index
    from agent_gym.retrieval_index.build import build_index
    from agent_gym.retrieval_index.manifest import IndexMismatchError

    try:
        manifest = build_index(
            namespace.corpus, namespace.out, namespace.backend, namespace.encoder, **params
        )
    except (OSError, ValueError, IndexMismatchError) as error:  # OSError: no corpus, --out a file, disk full
        print(f"agent-gym index build: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(f"built {manifest.backend} index of {manifest.doc_count} documents in {namespace.out}")
    return 0


def add_index_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``agent-gym index serve`` to ``parser``."""
    from agent_gym.retrieval_index.server import DEFAULT_K, DEFAULT_MAX_K, DEFAULT_MAX_QUERIES, DEFAULT_MAX_QUERY_CHARS

    parser.add_argument("index", help="index directory (from `agent-gym index build`), or 'module:function' "
                                      "naming a factory that returns a Retriever")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to listen on (default: loopback only; 0.0.0.0 exposes the index "
                             "to the network, unauthenticated)")
    parser.add_argument("--port", type=port_number, default=8000, help="TCP port (default: 8000)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes sharing the memory-mapped index (default: 1; threads scale "
                             "at most 1.3x, processes scale with cores)")
    parser.add_argument("--max-queries", type=int, default=DEFAULT_MAX_QUERIES,
                        help=f"most queries per request (default: {DEFAULT_MAX_QUERIES})")
    parser.add_argument("--max-query-chars", type=int, default=DEFAULT_MAX_QUERY_CHARS,
                        help=f"longest query in characters (default: {DEFAULT_MAX_QUERY_CHARS})")
    parser.add_argument("--default-k", type=int, default=DEFAULT_K,
                        help=f"hits per query when a request gives no k (default: {DEFAULT_K})")
    parser.add_argument("--max-k", type=int, default=DEFAULT_MAX_K,
                        help=f"largest k a request may ask for (default: {DEFAULT_MAX_K})")
    parser.add_argument("--cache", type=int, default=0, metavar="ENTRIES",
                        help="LRU cache entries per worker; GRPO groups repeat queries (default: 0 = off)")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--replicas", type=int, default=None, metavar="N",
                        help="run N servers of the index on ports PORT .. PORT+N-1 and restart any that exits; "
                             "clients list them all: RemoteRetriever('http://HOST:PORT,http://HOST:PORT+1,...') "
                             "balances the load and fails over (default: one server, not supervised)")


def run_index_serve(namespace: argparse.Namespace) -> int:
    """Run ``agent-gym index serve`` from parsed arguments; returns the exit status."""
    from agent_gym.retrieval_index.server import STARTUP_FAILURE, IndexLoadError, serve

    logging.basicConfig(level=namespace.log_level.upper(), format="%(levelname)s: %(message)s")
    if getattr(namespace, "replicas", None) is not None:
        return _run_replicas(namespace)
    try:
        serve(namespace.index, host=namespace.host, port=namespace.port, workers=namespace.workers,
              max_queries=namespace.max_queries, max_query_chars=namespace.max_query_chars,
              default_k=namespace.default_k, max_k=namespace.max_k, cache_entries=namespace.cache,
              log_level=namespace.log_level)
    except (ValueError, OSError) as exc:
        print(f"agent-gym index serve: error: {exc}")
        return 2
    except IndexLoadError as exc:
        print(f"agent-gym index serve: error: {exc}", file=sys.stderr)
        return STARTUP_FAILURE  # a `--replicas` supervisor stops on this status instead of restarting
    return 0


def _run_replicas(namespace: argparse.Namespace) -> int:
    from agent_gym.retrieval_index.replicas import ReplicaFailedError, ReplicaSupervisor, replica_urls, serve_command
    from agent_gym.retrieval_index.server import STARTUP_FAILURE, IndexLoadError, bind_socket

    replicas = namespace.replicas
    if replicas < 1 or not 0 < namespace.port <= 65536 - replicas:
        print(f"agent-gym index serve: error: --replicas must be >= 1 and ports {namespace.port}.."
              f"{namespace.port + replicas - 1} valid, got --replicas {replicas} --port {namespace.port}")
        return 2
    target = str(namespace.index)
    if not Path(target).is_dir() and not (":" in target and not Path(target).exists()):
        print(f"agent-gym index serve: error: no index directory at {target!r}; build one with "
              f"`agent-gym index build --corpus FILE --out {target}`")
        return 2
    options = ["--workers", str(namespace.workers), "--max-queries", str(namespace.max_queries),
               "--max-query-chars", str(namespace.max_query_chars), "--default-k", str(namespace.default_k),
               "--max-k", str(namespace.max_k), "--cache", str(namespace.cache), "--log-level", namespace.log_level]
    ports = [namespace.port + index for index in range(replicas)]
    for port in ports:  # before printing URLs that would name another program's port
        try:
            bind_socket(namespace.host, port).close()
        except OSError as exc:
            print(f"agent-gym index serve: error: {exc.strerror} (--replicas {replicas} needs ports "
                  f"{ports[0]}..{ports[-1]})", file=sys.stderr)
            return 2
    supervisor = ReplicaSupervisor(lambda port: serve_command(target, namespace.host, port, options), ports)
    print(f"search replicas: {','.join(replica_urls(namespace.host, namespace.port, replicas))}", flush=True)
    try:
        supervisor.run()
    except IndexLoadError as exc:
        print(f"agent-gym index serve: error: {exc}", file=sys.stderr)
        return STARTUP_FAILURE
    except ReplicaFailedError:
        return 2  # the replica printed its one-line error; the others are stopped
    return 0
