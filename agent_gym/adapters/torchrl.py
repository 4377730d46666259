"""TorchRL's ``GymWrapper`` on agent-gym envs (tested with torchrl 0.14.1, tensordict 0.14.3).

TorchRL maps each Gymnasium space to a spec through a registry keyed by the space's type, and has no entry for
our ``UnicodeText``, so ``GymWrapper(gym.make(ID))`` fails. Importing this module registers the conversion:
a ``UnicodeText`` becomes a ``NonTensor`` spec (strings ride in the tensordict as non-tensor data, as TorchRL's
own ``Text`` conversion does). :func:`make_torchrl_env` also reads ``info["messages"]`` (and the other info
keys named) into each tensordict, so an LLM policy sees the env's whole chat context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from tensordict import NonTensorData
from torchrl.data import Composite, NonTensor
from torchrl.envs.gym_like import BaseInfoDictReader
from torchrl.envs.libs.gym import GymWrapper, register_gym_spec_conversion

from agent_gym.make import make_env
from agent_gym.spaces import UnicodeText

__all__ = ["NonTensorInfoReader", "make_torchrl_env", "unicode_text_to_spec"]

DEFAULT_INFO_KEYS = ("messages",)


def unicode_text_to_spec(space: UnicodeText, dtype: Any = None, device: Any = None, **_: Any) -> NonTensor:
    """The TorchRL spec of a ``UnicodeText`` space: one string per env, as non-tensor data."""
    return NonTensor((), device=device, example_data="")


register_gym_spec_conversion(UnicodeText)(unicode_text_to_spec)


class NonTensorInfoReader(BaseInfoDictReader):
    """Copies the named info keys into the tensordict as non-tensor data (lists of chat messages, dicts).

    TorchRL's ``default_info_dict_reader`` stacks values into arrays, which a list of message dicts is not.
    A key the info lacks (``messages`` is in every info of the contract) is left out of that tensordict.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = list(keys)
        self._spec = Composite({key: NonTensor((), example_data=[]) for key in self.keys}, shape=())

    def __call__(self, info_dict: dict[str, Any], tensordict: Any) -> Any:
        for key in self.keys:
            if key in info_dict:
                tensordict.set(key, NonTensorData(info_dict[key]))
        return tensordict

    @property
    def info_spec(self) -> Composite:
        return self._spec


def make_torchrl_env(
    env: str | Callable[[], gym.Env] | gym.Env, info_keys: Sequence[str] = DEFAULT_INFO_KEYS, **env_kwargs: Any
) -> GymWrapper:
    """A ``GymWrapper`` over an agent-gym env (an id with ``gym.make`` kwargs, a factory, or an env).

    Each tensordict carries ``info_keys`` of the env's info (default ``messages``, the chat context) as
    non-tensor entries beside ``observation`` (the env's text) and the reward and done flags.
    """
    wrapped = GymWrapper(make_env(env, env_kwargs))
    if info_keys:
        wrapped.set_info_dict_reader(NonTensorInfoReader(info_keys))
    return wrapped
