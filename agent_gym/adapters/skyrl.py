"""A SkyRL-Gym ``BaseTextEnv`` view of any agent-gym env (tested with skyrl-gym 0.4.0).

SkyRL builds an env as ``Env(env_config, extras)``: ``env_config`` is the env class's section of its config
(here ``env_id`` and ``env_kwargs``), ``extras`` a dataset row (``extra_info`` and ``reward_spec``, where SkyRL
keeps a row's task). ``init(prompt)`` returns the first chat messages and metadata; each ``step(action)`` returns
a ``BaseTextEnvStepOutput``: the *new* messages to append to the chat history, the turn's reward, ``done``
and metadata. The env underneath owns the prompt and the context, so ``init`` answers with the env's own
``info["messages"]`` (its system prompt and question) whatever the dataset's prompt says, and ``step`` answers
with the messages the env appended after the agent's turn (tool results, or feedback on a malformed turn), with
the roles the env gave them.

Which task an episode plays: ``extras["extra_info"]`` (or ``extras``) may name ``task_id``, ``task_index`` or
``seed``; the rest of ``extras`` is SkyRL's and is ignored. ``register_skyrl_env()`` registers the class with
``skyrl_gym`` under ``agent_gym`` (``skyrl_gym.make("agent_gym", env_config={"env_id": ...}, extras=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from agent_gym.contract import (
    ANSWER,
    GOLD_ANSWERS,
    MESSAGES,
    REWARD_COMPONENTS,
    REWARD_SCORES,
    REWARD_TERMS,
    STOP_STRINGS,
    TASK_ID,
    TOOL_CALLS,
    TOOLS,
    TURN,
    check_tool_env_contract,
    new_messages,
)
from agent_gym.episode_summary import EpisodeSummary
from agent_gym.error import InvalidType, InvalidValue

__all__ = ["AgentGymTextEnv", "register_skyrl_env", "SKYRL_ENV_ID"]

SKYRL_ENV_ID = "agent_gym"
_TASK_KEYS = ("task_id", "task_index")


def _plain(config: Any) -> dict[str, Any]:
    """A SkyRL config section (an OmegaConf ``DictConfig`` in SkyRL-train, or a dict) as a plain dict."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        try:
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(config, resolve=True)
        except (ImportError, ValueError) as error:
            raise InvalidType(f"env_config must be a mapping such as {{'env_id': ...}}, got {type(config).__name__}") \
                from error
    return dict(config)


class AgentGymTextEnv(BaseTextEnv):
    """SkyRL-Gym's text-env protocol over an agent-gym env (any env that follows the README's contract).

    Args:
        env_config: ``{"env_id": ID, "env_kwargs": {...}}`` (SkyRL's per-env config section).
        extras: the dataset row: ``extra_info`` may hold ``task_id`` / ``task_index`` / ``seed``.
        env: an already made env to wrap instead of ``env_config["env_id"]``.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, *,
                 env: gym.Env | None = None) -> None:
        super().__init__()
        config = _plain(env_config)
        extras = dict(extras or {})
        if env is None:
            env_id = config.get("env_id")
            if not env_id:
                raise InvalidValue("AgentGymTextEnv needs env_config={'env_id': 'AgentR1-SynthHop-v0', "
                                 "'env_kwargs': {...}} (or env=...)")
            from agent_gym.make import make_env

            env = make_env(env_id, config.get("env_kwargs"))
        else:  # a user's env: held to the env contract before SkyRL steps it
            check_tool_env_contract(env)
        self.env = env
        where = dict(extras.get("extra_info") or {})
        where.update({key: extras[key] for key in (*_TASK_KEYS, "seed") if key in extras})
        options = {key: where[key] for key in _TASK_KEYS if key in where}
        self._reset_kwargs = {"seed": where.get("seed"), "options": options or None}
        self.max_turns = int(extras.get("max_turns") or getattr(env.unwrapped, "max_turns", 1) or 1)
        self.chat_history: list[dict[str, Any]] = []
        self.total_reward = 0.0
        self.summary = EpisodeSummary()

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the episode; return the env's first messages (system prompt and question) and metadata."""
        _, info = self.env.reset(**self._reset_kwargs)
        self.turns = 0
        self.total_reward = 0.0
        self.chat_history = [dict(message) for message in info[MESSAGES]]
        self.summary = EpisodeSummary.from_reset(info)
        metadata = {TASK_ID: info.get(TASK_ID), TOOLS: info.get(TOOLS, []), STOP_STRINGS: info.get(STOP_STRINGS, [])}
        return [dict(message) for message in self.chat_history], metadata

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One agent turn: the env's new messages, the turn's reward, and whether the episode is over."""
        self.turns += 1
        _, reward, terminated, truncated, info = self.env.step(action)
        self.total_reward += float(reward)
        self.summary.add_step(reward, terminated, truncated, info)
        observations = [] if terminated or truncated else [dict(message) for message in new_messages(info)]
        self.chat_history.append({"role": "assistant", "content": action})
        self.chat_history.extend(observations)
        metadata = {key: info[key] for key in (REWARD_TERMS, REWARD_SCORES, REWARD_COMPONENTS, TOOL_CALLS, TURN,
                                                TASK_ID, ANSWER, GOLD_ANSWERS) if key in info}
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward),
                                     done=bool(terminated or truncated), metadata=metadata,
                                     postprocessed_action=None)

    def get_metrics(self) -> dict[str, Any]:
        """The episode's turns and return, and the `EpisodeSummary` metrics it reports (EM, F1, tool-call
        validity)."""
        metrics: dict[str, Any] = {"turns": self.turns, "return": self.total_reward}
        for key in ("em", "f1", "tool_call_validity"):
            if (value := getattr(self.summary, key)) is not None:
                metrics[key] = value
        return metrics

    def close(self) -> None:
        self.env.close()


def register_skyrl_env(skyrl_id: str = SKYRL_ENV_ID) -> str:
    """Register :class:`AgentGymTextEnv` with ``skyrl_gym`` (once; a repeat is a no-op). Returns the id."""
    import skyrl_gym

    if skyrl_id not in skyrl_gym.registry:
        skyrl_gym.register(id=skyrl_id, entry_point="agent_gym.adapters.skyrl:AgentGymTextEnv")
    return skyrl_id
