"""``AgentR1-SynthHop-v0``: multi-hop questions about a generated fictional world, answered by searching it.

Nothing in the world is true of the real one, so a model cannot answer from memory: it must search. The
world, its search index and its question sets are built once per process and shared by every env made with
the same settings (the vector env's N envs share one retriever).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from agent_gym.env import ToolEnv
from agent_gym.envs.synthetic_world import World, generate_world
from agent_gym.error import InvalidValue
from agent_gym.retrieval_index.corpus import Document
from agent_gym.retrieval_index.search_tool import SearchTool
from agent_gym.tasks import TaskSet
from agent_gym.validation import require_int

__all__ = ["FRESH_WORLD_SEEDS", "make_synthhop_env", "synthetic_world", "SYNTHHOP_INSTRUCTION"]

SYNTHHOP_INSTRUCTION = (
    "Answer the question about a fictional world. You know nothing about this world: search its encyclopedia "
    "for every fact you need, one entity at a time, and read the results. When you know the final answer, give "
    "it as briefly as possible (a name, a year, a number) within <answer></answer> tags."
)


# World seeds from here up are reserved for fresh worlds (``fresh_world=i`` is seed FRESH_WORLD_SEEDS + i), so a
# fresh world never repeats a world a run trains or evaluates on (those use small seeds, 0, 1, 424_242...).
FRESH_WORLD_SEEDS = 1_000_000


@functools.lru_cache(maxsize=4)
def synthetic_world(num_pages: int, world_seed: int) -> World:
    """The world of these settings, generated once per process."""
    return generate_world(num_pages=num_pages, seed=world_seed)


@functools.lru_cache(maxsize=4)
def _search_tool(num_pages: int, world_seed: int, retriever: str, top_k: int) -> SearchTool:
    from agent_gym.retrieval_index.build import make_retriever

    world = synthetic_world(num_pages, world_seed)
    documents = [Document(page.id, page.title, page.text) for page in world.pages]
    return SearchTool(make_retriever(retriever, documents), top_k=top_k, documents=documents,
                      description="Search the encyclopedia of this world; returns the best-matching pages.")


@functools.lru_cache(maxsize=16)
def _questions(num_pages: int, world_seed: int, hops: tuple[int, ...], kinds: tuple[str, ...], split: str,
               num_questions: int, question_seed: int) -> TaskSet:
    world = synthetic_world(num_pages, world_seed)
    tasks = world.questions(hops=hops, n=num_questions, seed=question_seed, kinds=kinds, split=split)
    return TaskSet(tasks, name=f"synthhop(pages={num_pages}, seed={world_seed}, hops={hops}, split={split})")


def _hop_tuple(hops: Any) -> tuple[int, ...]:
    """``hops`` as a non-empty tuple of ints in 1..4, or a ValueError naming that range."""
    values = [hops] if not isinstance(hops, Sequence) or isinstance(hops, str) else list(hops)
    if not values or any(isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= 4 for h in values):
        raise InvalidValue(f"hops must be an int from 1 to 4 or a list of them, got {hops!r:.80}")
    return tuple(values)


def make_synthhop_env(
    *,
    hops: int | Sequence[int] = 2,
    num_pages: int = 5_000,
    world_seed: int = 0,
    fresh_world: int | None = None,
    split: str = "train",
    num_questions: int = 500,
    question_seed: int = 0,
    kinds: Sequence[str] = ("bridge", "comparison"),
    retriever: str = "bm25",
    top_k: int = 5,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build a SynthHop env.

    Args:
        hops: hops per question (1-4), or several to mix.
        num_pages: size of the generated world (10^5 pages build in seconds).
        world_seed: seeds the world; the same seed gives the same world on every machine.
        fresh_world: the index of a never-seen world, in place of ``world_seed``: its names appear in no world a
            run uses. The warm-start drills ask for a new one every step, so what they teach is to copy, not
            to remember.
        split: ``train`` or ``test`` questions (disjoint), or ``all``.
        num_questions: how many questions the env draws from.
        question_seed: seeds the question draw.
        kinds: ``bridge`` and/or ``comparison`` questions.
        retriever: search backend (``bm25`` = the embedded default engine, ``tantivy``, ``bm25s``, ``dense``...).
        top_k: hits per search (5, as in the paper).
        env_kwargs: :class:`~agent_gym.env.ToolEnv` settings (``tool_format``, ``reward``, ``max_turns``...).
    """
    hop_tuple = _hop_tuple(hops)
    kind_tuple = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    num_questions = require_int("num_questions", num_questions)
    top_k = require_int("top_k", top_k)
    if fresh_world is not None:
        world_seed = FRESH_WORLD_SEEDS + require_int("fresh_world", fresh_world, minimum=0)
    tasks = _questions(num_pages, world_seed, hop_tuple, kind_tuple, split, num_questions, question_seed)
    tool = _search_tool(num_pages, world_seed, retriever, top_k)
    env_kwargs.setdefault("instruction", SYNTHHOP_INSTRUCTION)
    env_kwargs.setdefault("max_turns", max(hop_tuple) + 3)
    return ToolEnv(tasks, [tool], **env_kwargs)
