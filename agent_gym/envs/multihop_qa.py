"""The paper's multi-hop QA environments: ``AgentR1-HotpotQA-v0``, ``AgentR1-2WikiMultihopQA-v0``,
``AgentR1-Musique-v0`` (Agent-R1 Table 3: HotpotQA and 2Wiki in-domain, MuSiQue out-of-domain).

The agent answers the dataset's questions with a ``search`` tool over a corpus:

- ``corpus="distractor"`` (default): the union of the split's own context paragraphs, deduplicated by title;
  small and self-contained;
- a corpus file (JSONL of ``{"id", "title", "text"}``, BEIR or wiki-18 layouts), indexed in memory on first
  use, or an index directory built by ``agent-gym index build`` (memory-mapped, checked against its manifest);
- an ``http(s)://`` URL of an ``agent-gym index serve`` search server, shared by many workers.

Datasets, corpora and indexes are loaded once per process and shared by every env with the same settings.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent_gym.env import ToolEnv
from agent_gym.envs.datasets import load_dataset
from agent_gym.envs.datasets.download import canonical_name
from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.base import Retriever
from agent_gym.retrieval_index.corpus import Document
from agent_gym.retrieval_index.search_tool import SearchTool
from agent_gym.retrieval_index.service.client import DEFAULT_TOTAL_TIMEOUT_S
from agent_gym.rewards import get_reward_spec
from agent_gym.tasks import TaskSet
from agent_gym.validation import require_int

__all__ = ["make_qa_env", "make_hotpotqa_env", "make_2wikimultihopqa_env", "make_musique_env",
           "QA_INSTRUCTION"]

# Agent-R1's multi-hop QA prompt, in our words: reason, search as often as needed, answer briefly.
QA_INSTRUCTION = (
    "Answer the given question. Reason step by step before each action. You can search Wikipedia as many times "
    "as you need; each search returns the top passages. When you have enough evidence, give the final answer as "
    "briefly as possible (a name, a date, yes or no) within <answer></answer> tags."
)


@functools.lru_cache(maxsize=8)
def _dataset(name: str, split: str, data_path: str | None, cache_dir: str | None,
             limit: int | None, setting: str | None,
             aliases_path: str | None = None) -> tuple[TaskSet, tuple[Document, ...]]:
    options: dict[str, Any] = {"limit": limit} if limit is not None else {}
    if setting is not None:
        options["setting"] = setting
    if aliases_path is not None:
        options["aliases_path"] = aliases_path
    tasks, corpus = load_dataset(name, split=split, data_path=data_path, cache_dir=cache_dir, **options)
    documents = tuple(Document(str(doc["id"]), doc["title"], doc["text"]) for doc in corpus)
    return tasks, documents


@functools.lru_cache(maxsize=8)
def _search_tool(name: str, split: str, data_path: str | None, cache_dir: str | None, limit: int | None,
                 setting: str | None, corpus: str, retriever: str, encoder: str | None, top_k: int,
                 search_timeout: float, aliases_path: str | None = None) -> SearchTool:
    """One search tool per settings, so the N envs of a vector env share it and their searches batch."""
    return SearchTool(_retriever(name, split, data_path, cache_dir, limit, setting, corpus, retriever, encoder,
                                 search_timeout, aliases_path), top_k=top_k)


def _retriever(name: str, split: str, data_path: str | None, cache_dir: str | None, limit: int | None,
               setting: str | None, corpus: str, retriever: str, encoder: str | None,
               search_timeout: float, aliases_path: str | None = None) -> Retriever:
    extra = {"encoder": encoder} if encoder else {}
    if corpus.startswith(("http://", "https://")):
        from agent_gym.retrieval_index.service.client import RemoteRetriever

        return RemoteRetriever(corpus, total_timeout=search_timeout)
    from agent_gym.retrieval_index.build import make_retriever, open_index

    if corpus == "distractor":
        # the same cache entry as the tasks' (aliases change no document)
        _, documents = _dataset(name, split, data_path, cache_dir, limit, setting, aliases_path)
        return make_retriever(retriever, list(documents), **extra)
    path = Path(corpus).expanduser()
    if path.is_dir():
        return open_index(path, **extra)
    if path.is_file():
        return make_retriever(retriever, corpus_path=path, show_progress=True, **extra)
    raise FileNotFoundError(
        f"corpus {corpus!r} is neither 'distractor', an http(s) URL, an index directory nor a corpus file. "
        "Build an index with: agent-gym index build --corpus CORPUS.jsonl --backend bm25 --out DIR"
    )


def make_qa_env(
    dataset: str,
    *,
    split: str = "dev",
    data_path: str | None = None,
    cache_dir: str | None = None,
    limit: int | None = None,
    setting: str | None = None,
    corpus: str = "distractor",
    retriever: str = "bm25",
    encoder: str | None = None,
    top_k: int = 5,
    search_timeout: float = DEFAULT_TOTAL_TIMEOUT_S,
    aliases_path: str | None = None,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build a multi-hop QA env.

    Args:
        dataset: ``hotpotqa``, ``2wikimultihopqa`` or ``musique``.
        split: ``dev`` or ``train``.
        data_path: the official data file (plain, .gz or .xz); default: fetched into the cache on first use.
        cache_dir: where downloads go (default ``$AGENT_GYM_DATA_DIR``, ``$AGENT_GYM_CACHE`` or ``~/.cache/agent-gym``).
        limit: keep only the first ``limit`` questions.
        setting: HotpotQA only: ``distractor`` (default) or ``fullwiki`` (hotpot_dev_fullwiki_v1.json, found in
            ``data_path``'s folder or the cache; its ``distractor`` corpus is then the paragraphs an IR system
            retrieved from Wikipedia for each question; pass ``corpus=`` a Wikipedia index for the real thing).
        corpus: ``distractor``, a corpus JSONL path, an index directory, or a search-server URL (several,
            comma-separated: replicas, balanced and failed over by `RemoteRetriever`).
        retriever: ``bm25`` (the embedded default engine), ``tantivy``, ``bm25s``, ``pyserini``, ``dense``,
            ``hybrid``; ignored for index directories and URLs, which carry their own.
        encoder: the dense encoder (default MiniLM, offline).
        top_k: passages per search (5, as in the paper).
        search_timeout: with a search-server URL, the most seconds one search may take, retries included;
            past it the agent sees a failed search and the step goes on.
        aliases_path: 2WikiMultihopQA only: the official ``id_aliases.json``, whose answer aliases the official
            scorer accepts (default: the one beside the data file; without one a warning says so, once).
        env_kwargs: :class:`~agent_gym.env.ToolEnv` settings: ``reward`` (``paper``/``dense``; answers are
            scored by the dataset's official rule unless the spec sets ``answer_rule``), ``tool_format``,
            ``max_turns``...
    """
    top_k = require_int("top_k", top_k)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidValue(f"limit must be at least 1 (an integer) or None, got {limit!r:.80}")
    data = str(data_path) if data_path is not None else None
    cache = str(cache_dir) if cache_dir is not None else None
    aliases = str(aliases_path) if aliases_path is not None else None
    tasks, _ = _dataset(dataset, split, data, cache, limit, setting, aliases)
    search = _search_tool(dataset, split, data, cache, limit, setting, str(corpus), retriever, encoder, top_k,
                          float(search_timeout), aliases)
    env_kwargs.setdefault("instruction", QA_INSTRUCTION)
    env_kwargs.setdefault("max_turns", 6)
    spec = get_reward_spec(env_kwargs.get("reward", "paper"))
    if spec.answer_rule is None:  # score answers as this dataset's official evaluator does
        env_kwargs["reward"] = replace(spec, answer_rule=canonical_name(dataset))
    return ToolEnv(tasks, [search], **env_kwargs)


def make_hotpotqa_env(**kwargs: Any) -> ToolEnv:
    """``AgentR1-HotpotQA-v0``: see :func:`make_qa_env`."""
    return make_qa_env("hotpotqa", **kwargs)


def make_2wikimultihopqa_env(**kwargs: Any) -> ToolEnv:
    """``AgentR1-2WikiMultihopQA-v0``: see :func:`make_qa_env`."""
    return make_qa_env("2wikimultihopqa", **kwargs)


def make_musique_env(**kwargs: Any) -> ToolEnv:
    """``AgentR1-Musique-v0``: see :func:`make_qa_env`."""
    return make_qa_env("musique", **kwargs)


def _dataset_factory_signature() -> inspect.Signature:
    signature = inspect.signature(make_qa_env)
    return signature.replace(parameters=list(signature.parameters.values())[1:])  # the dataset is fixed


# Each dataset's factory takes make_qa_env's settings: say so, so that a misspelt setting is named at make.
for _factory in (make_hotpotqa_env, make_2wikimultihopqa_env, make_musique_env):
    _factory.__signature__ = _dataset_factory_signature()  # type: ignore[attr-defined]
