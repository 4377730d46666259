"""A native batched vector env for tool environments (docs/DESIGN.md §2, "Vectorised use").

All N environments share their tool objects (one retriever in memory), and each step sends the tool calls
of every environment that calls the same tool as one batch (``agent_gym.env.step_turns``): N searches become
one ``Retriever.search`` call.
Autoreset follows Gymnasium 1.x ``NEXT_STEP`` semantics: the step after an episode ends resets that env and
ignores its action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, create_shared_memory

from agent_gym.env import ToolEnv, step_turns
from agent_gym.env_batch import EnvLost, LocalEnvBatch, ResetResult, StepResult, TruncateResult
from agent_gym.error import InvalidType, InvalidValue
from agent_gym.spaces import UnicodeText

__all__ = ["ToolVectorEnv"]


@create_shared_memory.register(UnicodeText)
def _no_shared_memory_for_text(space: UnicodeText, n: int = 1, ctx: Any = None) -> Any:
    """``AsyncVectorEnv``'s default ``shared_memory=True`` meets a text observation: say why, and what works.

    Without it Gymnasium says only that shared memory "caused an error"."""
    raise InvalidValue(
        "a tool env's observations are text, which Gymnasium's shared memory cannot hold, so "
        "gym.make_vec(..., vectorization_mode='async') fails with its default shared_memory=True. Use the native "
        "vector env, gym.make_vec(ID, num_envs=N) (tool calls batched across the envs, one retriever), or "
        "vectorization_mode='async' with vector_kwargs={'shared_memory': False} for one process per env"
    )


class ToolVectorEnv(VectorEnv):
    """N :class:`ToolEnv` instances stepped together, with tool calls batched across them.

    Observations are tuples of ``str``; infos follow Gymnasium's vector convention (a dict of arrays with
    ``_key`` masks), each env's keys those of its own info (``new_messages`` included).

    It is also an `agent_gym.env_batch.EnvBatch`: ``reset_batch``/``step_batch``/``truncate_batch`` address its
    envs by index with no autoreset, so the rollout collector drives it as it is.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, env_fns: Sequence[Callable[[], ToolEnv]]) -> None:
        if not env_fns:
            raise InvalidValue("ToolVectorEnv needs at least one environment")
        self.envs: list[ToolEnv] = [fn() for fn in env_fns]
        for env in self.envs:
            if not isinstance(env.unwrapped, ToolEnv):
                raise InvalidType(f"ToolVectorEnv batches ToolEnv instances, got {type(env.unwrapped).__name__}")
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._needs_reset = np.zeros(self.num_envs, dtype=bool)
        self._batch = LocalEnvBatch(self.envs)

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        seeds = self._seeds(seed)
        per_env_options = self._split_options(options)
        observations: list[str] = []
        infos: dict[str, Any] = {}
        for index, (env, env_seed) in enumerate(zip(self.envs, seeds, strict=True)):
            observation, info = env.reset(seed=env_seed, options=per_env_options[index])
            observations.append(observation)
            infos = self._add_info(infos, info, index)
        self._needs_reset[:] = False
        return tuple(observations), infos

    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise InvalidValue(f"expected {self.num_envs} actions, got {len(actions)}")
        observations: list[str] = [""] * self.num_envs
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        infos: dict[str, Any] = {}
        stepping = [index for index in range(self.num_envs) if not self._needs_reset[index]]
        for index in np.flatnonzero(self._needs_reset):
            observations[index], info = self.envs[index].reset()
            infos = self._add_info(infos, info, int(index))
        outcomes = step_turns([self.envs[index] for index in stepping], [actions[index] for index in stepping])
        for index, (observation, reward, terminated, truncated, info) in zip(stepping, outcomes, strict=True):
            observations[index] = observation
            rewards[index], terminations[index], truncations[index] = reward, terminated, truncated
            infos = self._add_info(infos, info, index)
        self._needs_reset = terminations | truncations
        return tuple(observations), rewards, terminations, truncations, infos

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int | np.integer):
            return [int(seed) + index for index in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise InvalidValue(f"expected {self.num_envs} seeds, got {len(seeds)}")
        return seeds

    def _split_options(self, options: dict[str, Any] | None) -> list[dict[str, Any] | None]:
        """``options={"task_id": [id_0, ..., id_N-1]}`` gives each env its own task; scalars apply to all."""
        if not options:
            return [None] * self.num_envs
        per_env: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for key, value in options.items():
            if isinstance(value, list | tuple | np.ndarray) and len(value) == self.num_envs:
                for index in range(self.num_envs):
                    per_env[index][key] = value[index]
            else:
                for index in range(self.num_envs):
                    per_env[index][key] = value
        return list(per_env)

    # ------------------------------------------------------------------------------------------ EnvBatch

    def reset_batch(self, indices: Sequence[int], kwargs: Sequence[Mapping[str, Any]]) -> list[ResetResult | EnvLost]:
        """``reset(**kwargs[i])`` of each env named in ``indices`` (the env then steps without autoreset)."""
        results = self._batch.reset_batch(indices, kwargs)
        self._needs_reset[list(indices)] = False
        return results

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[StepResult | EnvLost]:
        """One turn of each env named in ``indices``, their tool calls batched (`step_turns`)."""
        results = self._batch.step_batch(indices, actions)
        for index, (_, _, terminated, truncated, _) in zip(indices, results, strict=True):
            self._needs_reset[index] = terminated or truncated
        return results

    def truncate_batch(self, indices: Sequence[int]) -> list[TruncateResult | None | EnvLost]:
        """Each env's ``truncate()``: the episode ends, paid what the env's own limit pays."""
        results = self._batch.truncate_batch(indices)
        self._needs_reset[list(indices)] = True
        return results

    def env_name(self, index: int) -> str:
        return self._batch.env_name(index)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
