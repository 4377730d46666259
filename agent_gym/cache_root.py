"""The one cache root that models, datasets, search kernels and embeddings share.

``$AGENT_GYM_CACHE`` if set, else ``~/.cache/agent-gym``. Data may live elsewhere (``$AGENT_GYM_DATA_DIR``); versions
before 0.1 kept data and embeddings in ``~/.cache/agent_gym``, which is still read where the new root has nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "AGENT_GYM_CACHE"
DATA_DIR_ENV = "AGENT_GYM_DATA_DIR"


def cache_root() -> Path:
    """``$AGENT_GYM_CACHE``, else ``~/.cache/agent-gym``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "agent-gym"


def data_root(kind: str) -> Path:
    """The root that holds ``kind`` (``datasets``, ``embeddings``): ``$AGENT_GYM_DATA_DIR``, else the cache root;
    the legacy ``~/.cache/agent_gym`` while it holds ``kind`` and the cache root does not (nothing downloaded or
    encoded before is made again)."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    root, legacy = cache_root(), Path.home() / ".cache" / "agent_gym"
    if not os.environ.get(CACHE_ENV) and (legacy / kind).is_dir() and not (root / kind).is_dir():
        return legacy
    return root
