"""Registering tool environments with Gymnasium (docs/DESIGN.md §1, STYLE: registration is data).

Every id becomes an ordinary :class:`gymnasium.envs.registration.EnvSpec`, so ``gym.make``, ``gym.make_vec``
and ``gym.make("agent_gym:ID")`` all work. Gymnasium deep-copies ``spec.kwargs`` on every ``make``, so the
live objects of a user's env (its tools, which may hold an index, and its tasks) are kept once in a table
here, keyed by id; the spec holds only plain settings.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from agent_gym.env import ToolEnv
from agent_gym.error import InvalidType, InvalidValue
from agent_gym.rewards import RewardSpec
from agent_gym.tasks import Task
from agent_gym.tools import Tool

__all__ = [
    "register_tool_env",
    "register_suite_env",
    "registered_envs",
    "ToolEnvCreator",
    "SuiteEnvCreator",
    "VectorEnvCreator",
]

#: one-line description of each id registered through this module, for `agent-gym envs`
ENV_DESCRIPTIONS: dict[str, str] = {}


@dataclass(frozen=True)
class _Components:
    tasks: Sequence[Task] | Callable[[], Sequence[Task]]
    tools: Sequence[Tool] | Callable[[], Sequence[Tool]]


_COMPONENTS: dict[str, _Components] = {}


class ToolEnvCreator:
    """Entry point of an env registered with :func:`register_tool_env` (cheap to copy: it holds only the id)."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self, **kwargs: Any) -> ToolEnv:
        check_settings(self.env_id, kwargs, tool_env_settings())
        components = _COMPONENTS[self.env_id]
        return ToolEnv(components.tasks, components.tools, **kwargs)

    def __repr__(self) -> str:
        return f"ToolEnvCreator({self.env_id!r})"


class SuiteEnvCreator:
    """Entry point of a suite env: refuses a keyword its factory does not take, naming those it takes.

    Without it a misspelt keyword (``hop=2``) reaches ``ToolEnv.__init__`` and Python's ``TypeError`` names
    neither the env nor the keyword meant. Holds only the import string, so it is cheap to copy and pickle.
    """

    def __init__(self, env_id: str, entry_point: str) -> None:
        self.env_id, self.entry_point = env_id, entry_point

    def __call__(self, **kwargs: Any) -> ToolEnv:
        factory = _load(self.entry_point)
        check_settings(self.env_id, kwargs, factory_settings(factory))
        return factory(**kwargs)

    def __repr__(self) -> str:
        return f"SuiteEnvCreator({self.env_id!r}, {self.entry_point!r})"


def tool_env_settings() -> list[str]:
    """The keyword settings of :class:`ToolEnv`."""
    return [name for name in inspect.signature(ToolEnv).parameters if name not in ("tasks", "tools")]


def factory_settings(factory: Callable[..., Any]) -> list[str]:
    """The keywords an env factory takes: its own, plus ToolEnv's when it passes ``**kwargs`` on to ToolEnv."""
    names, forwards = [], False
    for parameter in inspect.signature(factory).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            forwards = True
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            names.append(parameter.name)
    return names + [name for name in tool_env_settings() if name not in names] if forwards else names


def check_settings(env_id: str, kwargs: dict[str, Any], known: Sequence[str]) -> None:
    """Raise :class:`InvalidType` for a keyword not in ``known``, naming the closest valid one and all of them."""
    unknown = [name for name in kwargs if name not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InvalidType(f"{env_id} takes no setting {', '.join(map(repr, unknown))}{hint}; its settings: "
                      f"{', '.join(sorted(known))}")


class VectorEnvCreator:
    """Vector entry point: builds the native batched :class:`~agent_gym.vector.ToolVectorEnv` of N envs."""

    def __init__(self, env_creator: str | Callable[..., ToolEnv]) -> None:
        self.env_creator = env_creator

    def __call__(self, num_envs: int, **kwargs: Any):
        from agent_gym.vector import ToolVectorEnv

        creator = _load(self.env_creator) if isinstance(self.env_creator, str) else self.env_creator
        kwargs.pop("max_episode_steps", None)  # turns are limited by the env itself (max_turns)
        return ToolVectorEnv([_Bound(creator, kwargs) for _ in range(num_envs)])

    def __repr__(self) -> str:
        return f"VectorEnvCreator({self.env_creator!r})"


class _Bound:
    """A picklable ``creator(**kwargs)`` thunk."""

    def __init__(self, creator: Callable[..., ToolEnv], kwargs: dict[str, Any]) -> None:
        self.creator, self.kwargs = creator, kwargs

    def __call__(self) -> ToolEnv:
        return self.creator(**self.kwargs)


def _load(entry_point: str) -> Callable[..., Any]:
    module_name, _, attribute = entry_point.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def register_tool_env(
    env_id: str,
    *,
    tools: Sequence[Tool] | Callable[[], Sequence[Tool]],
    tasks: Sequence[Task] | Callable[[], Sequence[Task]],
    reward: str | RewardSpec = "paper",
    max_turns: int = 8,
    tool_format: str = "hermes",
    description: str = "",
    override: bool = False,
    **env_kwargs: Any,
) -> gym.envs.registration.EnvSpec:
    """Register a tool environment under ``env_id`` and return its spec.

    ``tools`` and ``tasks`` may be given directly or as zero-argument factories (built on first ``make``); given
    directly, they are checked here, so a wrong one fails at registration rather than at the first ``make``.
    Remaining keyword arguments are :class:`~agent_gym.env.ToolEnv` settings; ``gym.make(env_id, **overrides)``
    can change them per instance. Re-registering one's own id replaces it; replacing one of agent-gym's suite ids
    (``AgentR1-SynthHop-v0``) needs ``override=True``.
    """
    check_settings(env_id, env_kwargs, tool_env_settings())
    if not callable(tools):
        tools = _checked_tools(env_id, tools)
    if not callable(tasks):
        tasks = _checked_tasks(env_id, tasks)
    creator = ToolEnvCreator(env_id)
    settings = {"reward": reward, "max_turns": max_turns, "tool_format": tool_format, **env_kwargs}
    _refuse_replacing_a_suite_id(env_id, creator, override)
    _COMPONENTS[env_id] = _Components(tasks=tasks, tools=tools)
    return register_suite_env(env_id, creator, description=description, kwargs=settings, override=True)


def _checked_tools(env_id: str, tools: Any) -> Sequence[Tool]:
    """``tools`` as a sequence (a generator is read once, here): each a :class:`Tool`, under a name of its own
    (what ``ToolEnv`` would refuse at ``make``)."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Iterable):
        raise InvalidType(f"{env_id}: tools must be a sequence of Tool (or a function returning one), got "
                          f"{type(tools).__name__}")
    tools = tools if isinstance(tools, Sequence) else list(tools)
    names: set[str] = set()
    for index, item in enumerate(tools):
        if not isinstance(item, Tool):
            raise InvalidType(f"{env_id}: tools[{index}] is a {type(item).__name__}, not a Tool; decorate it with "
                              "@agent_gym.tool or subclass agent_gym.Tool")
        if item.name in names:
            raise InvalidValue(f"{env_id}: two tools are named {item.name!r}")
        names.add(item.name)
    return tools


def _checked_tasks(env_id: str, tasks: Any) -> Sequence[Task]:
    """``tasks`` as a sequence (a generator is read once, here): at least one :class:`Task`, ids unique (each Task
    already refuses one that no answer can match)."""
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Iterable):
        raise InvalidType(f"{env_id}: tasks must be a sequence of Task (or a function returning one), got "
                          f"{type(tasks).__name__}")
    tasks = tasks if isinstance(tasks, Sequence) else list(tasks)
    ids: set[str] = set()
    count = 0
    for index, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise InvalidType(f"{env_id}: tasks[{index}] is a {type(task).__name__}, not a Task; build tasks with "
                              "agent_gym.Task(id=..., question=..., answers=(...))")
        if task.id in ids:
            raise InvalidValue(f"{env_id}: two tasks have the id {task.id!r}")
        ids.add(task.id)
        count += 1
    if count == 0:
        raise InvalidValue(f"{env_id}: needs at least one task")
    return tasks


def _is_suite_id(env_id: str) -> bool:
    """Whether ``env_id`` is registered by agent-gym's own suite (an entry point inside the package)."""
    spec = gym.registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    return isinstance(entry, SuiteEnvCreator) and entry.entry_point.startswith("agent_gym.")


def _refuse_replacing_a_suite_id(env_id: str, entry_point: Any, override: bool) -> None:
    """A suite id is replaced only on purpose, or by the suite itself re-registering the same entry point."""
    if override or not _is_suite_id(env_id):
        return
    if isinstance(entry_point, str) and entry_point == gym.registry[env_id].entry_point.entry_point:
        return
    raise InvalidValue(f"{env_id} is one of agent-gym's suite envs; registering over it would replace it for "
                       "every later gym.make in this process. Pick another id (e.g. My-Env-v0), or pass "
                       "override=True to replace it on purpose")


def register_suite_env(
    env_id: str,
    entry_point: str | Callable[..., ToolEnv],
    *,
    description: str,
    kwargs: dict[str, Any] | None = None,
    override: bool = False,
) -> gym.envs.registration.EnvSpec:
    """Register an env whose entry point builds a :class:`ToolEnv` from plain keyword settings.

    An id registered before is replaced (as in a notebook), except a suite id: that needs ``override=True``."""
    _refuse_replacing_a_suite_id(env_id, entry_point, override)
    if env_id in gym.registry:
        del gym.registry[env_id]
    creator = SuiteEnvCreator(env_id, entry_point) if isinstance(entry_point, str) else entry_point
    gym.register(
        id=env_id,
        entry_point=creator,
        vector_entry_point=VectorEnvCreator(creator),
        kwargs=dict(kwargs or {}),
    )
    ENV_DESCRIPTIONS[env_id] = description
    return gym.spec(env_id)


def registered_envs() -> dict[str, str]:
    """The ids registered through agent-gym, with their one-line descriptions."""
    return {env_id: ENV_DESCRIPTIONS[env_id] for env_id in sorted(ENV_DESCRIPTIONS) if env_id in gym.registry}
