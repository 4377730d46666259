"""Deprecated path, kept for one release with a DeprecationWarning; the module is now
:mod:`agent_gym.retrieval_index.engines.dense_faiss`."""

import sys
import warnings

from agent_gym.retrieval_index.engines import dense_faiss as _moved

warnings.warn(
    "agent_gym.retrieval_index.dense moved to "
    "agent_gym.retrieval_index.engines.dense_faiss; import it from there (the old path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved  # the same module object: its names, private ones and monkeypatching included
