"""The envs a rollout plays on, driven by index in batches: the interface between the collector and its envs.

`RolloutCollector` asks an `EnvBatch` to reset, step and truncate many envs at once, by index. Three kinds
implement it: `LocalEnvBatch` (the envs of this process; its `ToolEnv`s step together through
`agent_gym.env.step_turns`, one search for all their calls), `agent_gym.vector.ToolVectorEnv` (the native vector
env, a `LocalEnvBatch` of its sub-envs) and `agent_gym.distributed.RayEnvPool` (shards of envs in Ray actors, one
call per actor per batch, each actor holding a `LocalEnvBatch`). `as_env_batch` takes any of them, a list of
envs, or a Gymnasium vector env that exposes its sub-envs.

A batch answers each index with its result, or with `EnvLost` when the env's worker died or timed out: the
collector drops that episode and counts it, and the next reset of the index starts on a fresh env.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

from agent_gym.env import ToolEnv, step_turns
from agent_gym.error import AgentGymError, InvalidType, InvalidValue

ResetResult = tuple[Any, dict[str, Any]]
StepResult = tuple[Any, float, bool, bool, dict[str, Any]]
TruncateResult = tuple[float, dict[str, Any]]


class RolloutError(AgentGymError, RuntimeError):
    """An env broke its contract during a rollout (raised on step, or returned no messages)."""


@dataclass(frozen=True)
class EnvLost:
    """The answer for an env whose worker died or did not answer in time; its episode cannot go on."""

    reason: str


@runtime_checkable
class EnvBatch(Protocol):
    """Envs addressed by index ``0 .. num_envs - 1``; every call takes many indices and answers in their order."""

    @property
    def num_envs(self) -> int: ...

    def reset_batch(
        self, indices: Sequence[int], kwargs: Sequence[Mapping[str, Any]]
    ) -> list[ResetResult | EnvLost]:
        """``env.reset(**kwargs[i])`` of each env."""

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[StepResult | EnvLost]:
        """``env.step(actions[i])`` of each env."""

    def truncate_batch(self, indices: Sequence[int]) -> list[TruncateResult | None | EnvLost]:
        """The env's optional ``truncate() -> (reward, info)``; None for an env that has none."""

    def env_name(self, index: int) -> str:
        """The env's class name, for messages."""

    def close(self) -> None:
        """Close every env (idempotent)."""


# Wrappers that `gymnasium.make` adds and that change no step: an env under only these joins the turn batch.
_PASS_THROUGH_WRAPPERS = (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)


def _turn_batch_member(env: Any) -> ToolEnv | None:
    """The `ToolEnv` under `env` if it can step in a turn batch; None for any other env, or for one under a
    wrapper that might change its steps."""
    while isinstance(env, _PASS_THROUGH_WRAPPERS):
        env = env.env
    return env if isinstance(env, ToolEnv) else None


class LocalEnvBatch:
    """The envs of this process as an `EnvBatch`: the `ToolEnv`s among them step as one turn batch (one
    ``call_validated`` per shared tool), any other env steps alone. Never answers `EnvLost`."""

    def __init__(self, envs: Sequence[Any]) -> None:
        self.envs = list(envs)
        self._turn_batch_envs = [_turn_batch_member(env) for env in self.envs]

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset_batch(
        self, indices: Sequence[int], kwargs: Sequence[Mapping[str, Any]]
    ) -> list[ResetResult | EnvLost]:
        return [self.envs[index].reset(**options) for index, options in zip(indices, kwargs, strict=True)]

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[StepResult | EnvLost]:
        results: dict[int, StepResult] = {}
        batch = [(index, action) for index, action in zip(indices, actions, strict=True)
                 if self._turn_batch_envs[index] is not None]
        if batch:
            members = [self._turn_batch_envs[index] for index, _ in batch]
            try:
                steps = step_turns(members, [action for _, action in batch])
            except Exception as error:  # the contract says envs never raise on actions; say which ones did
                raise RolloutError(f"one of envs {[index for index, _ in batch]} raised on step: {error!r}") from error
            results.update((index, step) for (index, _), step in zip(batch, steps, strict=True))
        for index, action in zip(indices, actions, strict=True):
            if index in results:
                continue
            try:
                results[index] = self.envs[index].step(action)
            except Exception as error:
                raise RolloutError(f"env {index} raised on step: {error!r}") from error
        return [results[index] for index in indices]

    def truncate_batch(self, indices: Sequence[int]) -> list[TruncateResult | None | EnvLost]:
        results: list[TruncateResult | None | EnvLost] = []
        for index in indices:
            env = self.envs[index]
            truncate = getattr(getattr(env, "unwrapped", env), "truncate", None)
            results.append(truncate() if callable(truncate) else None)
        return results

    def env_name(self, index: int) -> str:
        return type(self.envs[index]).__name__

    def close(self) -> None:
        for env in self.envs:
            env.close()


def as_env_batch(envs: Any) -> EnvBatch:
    """``envs`` as an `EnvBatch`: an `EnvBatch` itself (`ToolVectorEnv`, `RayEnvPool`, `LocalEnvBatch`), a list of
    envs, or a Gymnasium vector env that exposes its sub-envs (``SyncVectorEnv``: its autoreset step cannot address
    one env, so its sub-envs are batched by index)."""
    if isinstance(envs, EnvBatch):
        return envs
    if isinstance(envs, gym.vector.VectorEnv) or hasattr(envs, "num_envs"):
        sub_envs = getattr(envs, "envs", None)
        if sub_envs is None:
            raise InvalidType(f"{type(envs).__name__} does not expose its sub-envs (.envs); pass a list of envs, "
                              "a SyncVectorEnv or an agent_gym ToolVectorEnv")
        return LocalEnvBatch(sub_envs)
    envs = list(envs)
    if not envs:
        raise InvalidValue("an env batch needs at least one env")
    return LocalEnvBatch(envs)
