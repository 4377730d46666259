"""Retrievers for the search-worker tests: each answers with a fact about the worker process it runs in."""

from __future__ import annotations

import sys
from collections.abc import Sequence


class LoadedModules:
    """Answers each query (a module name) with whether that module is loaded in this process."""

    def search(self, queries: Sequence[str], k: int) -> list[list[bool]]:
        return [[query in sys.modules] for query in queries]


class AfterASearch(LoadedModules):
    """Opens the impact engine over ``directory`` and searches it once before it answers."""

    def __init__(self, directory: str) -> None:
        from agent_gym.retrieval_index.engines.impact_bm25 import ImpactBM25

        with ImpactBM25.open(directory, threads=1) as engine:
            engine.search(["river city", "born"], k=2)


class PackageVersion(LoadedModules):
    """Reads a name of the ``agent_gym`` package itself, as a user's opener might."""

    def __init__(self) -> None:
        import agent_gym

        self.version = agent_gym.__version__
