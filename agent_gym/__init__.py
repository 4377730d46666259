"""agent-gym: Gymnasium environments and an RL trainer for tool-using LLM agents (Agent-R1).

Importing this package registers every environment id, so ``gym.make("AgentR1-SynthHop-v0")`` works after
``import agent_gym``, and ``gym.make("agent_gym:AgentR1-SynthHop-v0")`` works with no prior import.
"""

from agent_gym.env import ToolEnv
from agent_gym.envs import register_suite
from agent_gym.error import AgentGymError
from agent_gym.formats import ToolCall, ToolFormat, get_format
from agent_gym.make import make_env
from agent_gym.registration import register_tool_env, registered_envs
from agent_gym.rewards import RewardSpec, exact_match, f1_score, normalize_answer, score_answer
from agent_gym.spaces import UnicodeText
from agent_gym.tasks import CheckResult, Hop, Task, TaskSet
from agent_gym.tools import Tool, ToolResult, tool
from agent_gym.vector import ToolVectorEnv

__version__ = "0.1.0"

__all__ = [
    "ToolEnv",
    "ToolVectorEnv",
    "UnicodeText",
    "Tool",
    "ToolResult",
    "tool",
    "ToolCall",
    "ToolFormat",
    "get_format",
    "RewardSpec",
    "normalize_answer",
    "exact_match",
    "f1_score",
    "score_answer",
    "Task",
    "TaskSet",
    "Hop",
    "CheckResult",
    "AgentGymError",
    "make_env",
    "register_tool_env",
    "registered_envs",
    "Trainer",
    "TrainConfig",
    "SFTTrainer",
    "SFTConfig",
    "Pretrainer",
    "PretrainConfig",
    "__version__",
]

# The three training loops, each run as ``Trainer(config).train()``. They live above this package's front room
# (trainers/, warmstart/) and import torch, so they load on first use (PEP 562), never at ``import agent_gym``.
_TRAINERS = {
    "Trainer": "agent_gym.trainers.trainer",
    "TrainConfig": "agent_gym.trainers.config",
    "SFTTrainer": "agent_gym.warmstart.sft",
    "SFTConfig": "agent_gym.warmstart.sft",
    "Pretrainer": "agent_gym.warmstart.pretrain",
    "PretrainConfig": "agent_gym.warmstart.pretrain",
}


def __getattr__(name: str) -> object:
    if name in _TRAINERS:
        import importlib

        return getattr(importlib.import_module(_TRAINERS[name]), name)
    raise AttributeError(f"module 'agent_gym' has no attribute {name!r}")

register_suite()


def _register_remote_env() -> None:
    """``AgentGym-Remote-v0`` (kwarg ``base_url``): an env served by ``agent-gym env serve``, by id, so the CLI can
    evaluate a model on it. ``agent-gym envs`` lists it; it holds no env of its own, so it needs a server."""
    import gymnasium as gym

    from agent_gym.registration import ENV_DESCRIPTIONS

    gym.register(id=REMOTE_ENV_ID, entry_point="agent_gym.adapters.openenv:RemoteEnv")
    ENV_DESCRIPTIONS[REMOTE_ENV_ID] = ("any env served by `agent-gym env serve` (OpenEnv protocol), reached over "
                                       "the network: kwarg base_url=http://HOST:PORT")


REMOTE_ENV_ID = "AgentGym-Remote-v0"
_register_remote_env()
