"""One front door to every env: ``make_env`` takes a registered id, a factory or an instance.

Every part of agent-gym that needs an env (trainers, warm-start workshop, adapters, benchmarks, the CLI) comes
in here, so none of them imports a concrete env and an unknown id reads the same everywhere. Importing this
module imports the ``agent_gym`` package, which registers every env id first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from agent_gym.error import AgentGymError, InvalidType

__all__ = ["EnvMakeError", "EnvSource", "make_env"]

# An env id (``"AgentR1-HotpotQA-v0"``), a zero-argument factory, or an env instance.
EnvSource = str | Callable[[], gym.Env] | gym.Env


class EnvMakeError(AgentGymError, gym.error.Error):
    """An env id that is not registered; also a ``gymnasium.error.Error``, so Gymnasium-style handlers catch it."""


def make_env(env: EnvSource, env_kwargs: dict[str, Any] | None = None, *, instance_ok: bool = True) -> gym.Env:
    """The env that ``env`` names: ``gym.make(env, **env_kwargs)`` for an id, ``env()`` for a factory, or ``env``.

    ``instance_ok=False`` refuses an env instance, for callers that make several envs from one source.
    An unknown id raises :class:`EnvMakeError`; a keyword the env refuses raises the env's own error
    (``agent_gym.error.InvalidType`` for our envs), unchanged.
    """
    if isinstance(env, str):
        try:
            return gym.make(env, **dict(env_kwargs or {}))
        except gym.error.Error as error:
            if isinstance(error, EnvMakeError):
                raise
            raise EnvMakeError(f"{' '.join(str(error).split())} (`agent-gym envs` lists the ids)") from error
    if env_kwargs:
        raise InvalidType("env kwargs are used only with an env id; bind them into the factory instead")
    if isinstance(env, gym.Env):
        if not instance_ok:
            raise InvalidType("pass an env id or a factory, not an env: this adapter makes one env per rollout")
        return env
    if callable(env):
        return env()
    raise InvalidType(f"expected an env id, a factory or a gymnasium.Env, got {type(env).__name__}")
