"""Deprecated path, kept for one release with a DeprecationWarning; the module is now
:mod:`agent_gym.retrieval_index.service.client`."""

import sys
import warnings

from agent_gym.retrieval_index.service import client as _moved

warnings.warn(
    "agent_gym.retrieval_index.client moved to "
    "agent_gym.retrieval_index.service.client; import it from there (the old path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved  # the same module object: its names, private ones and monkeypatching included
