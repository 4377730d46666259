"""Deprecated path, kept for one release with a DeprecationWarning; the module is now
:mod:`agent_gym.agents.model_naive_rag`."""

import sys
import warnings

from agent_gym.agents import model_naive_rag as _moved

warnings.warn(
    "agent_gym.trainers.model_naive_rag moved to "
    "agent_gym.agents.model_naive_rag; import it from there (the old path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved  # the same module object: its names, private ones and monkeypatching included
