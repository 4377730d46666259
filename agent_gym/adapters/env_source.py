"""Where an adapter gets its env from: an env id with ``gymnasium.make`` kwargs, a factory, or an env.

Every adapter takes one of these instead of importing a concrete env (``adapters/__init__.py``), and they all
read it the same way, here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

__all__ = ["EnvSource", "make_env"]

EnvSource = str | Callable[[], gym.Env] | gym.Env


def make_env(env: EnvSource, env_kwargs: dict[str, Any] | None = None, *, instance_ok: bool = True) -> gym.Env:
    """The env that ``env`` names: ``gym.make(env, **env_kwargs)`` for an id, ``env()`` for a factory, or ``env``.

    ``instance_ok=False`` refuses an env instance, for adapters that make several envs from one source.
    """
    if isinstance(env, str):
        import agent_gym  # noqa: F401 - registers the ids

        return gym.make(env, **dict(env_kwargs or {}))
    if env_kwargs:
        raise TypeError("env kwargs are used only with an env id; bind them into the factory instead")
    if isinstance(env, gym.Env):
        if not instance_ok:
            raise TypeError("pass an env id or a factory, not an env: this adapter makes one env per rollout")
        return env
    if callable(env):
        return env()
    raise TypeError(f"expected an env id, a factory or a gymnasium.Env, got {type(env).__name__}")
