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
from agent_gym.cli.config_flags import add_dataclass_arguments

__all__ = ["add_index_build_arguments", "add_index_serve_arguments", "run_index_build", "run_index_serve"]


def _parse_param(text: str) -> tuple[str, Any]:
    """argparse type of ``--param``: ``build.parse_engine_param``, its refusal as argparse's usage error."""
    from agent_gym.error import InvalidValue
    from agent_gym.retrieval_index.build import parse_engine_param

    try:
        return parse_engine_param(text)
    except InvalidValue as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_index_build_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``agent-gym index build`` to ``parser``."""
    from agent_gym.retrieval_index.build import IndexBuildConfig

    add_dataclass_arguments(parser, IndexBuildConfig, explicit_only=False, types={"param": _parse_param})
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
    from agent_gym.retrieval_index.service.server import ServeConfig

    add_dataclass_arguments(parser, ServeConfig, explicit_only=False, types={"port": port_number})


def run_index_serve(namespace: argparse.Namespace) -> int:
    """Run ``agent-gym index serve`` from parsed arguments; returns the exit status."""
    from agent_gym.retrieval_index.service.server import STARTUP_FAILURE, IndexLoadError, serve

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
    from agent_gym.retrieval_index.service.replicas import (
        ReplicaFailedError,
        ReplicaSupervisor,
        replica_urls,
        serve_command,
    )
    from agent_gym.retrieval_index.service.server import STARTUP_FAILURE, IndexLoadError, bind_socket

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
