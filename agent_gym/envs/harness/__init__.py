"""Programs that check a coding answer, run in two sandboxes so that the verdict is not the solution's.

``solution_server.py`` runs the agent's solution and answers calls of its function; ``test_runner.py`` runs
the hidden tests, calls the function through a pipe, and alone reports the results. Both are plain scripts
(the standard library and ``codec.py`` only) that :mod:`agent_gym.envs.hidden_tests` copies into each run's
directory; the solution's directory holds neither the tests nor the test runner's report pipe.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["source"]


def source(name: str) -> str:
    """The text of one of this package's scripts (``codec.py``, ``solution_server.py``, ``test_runner.py``)."""
    return Path(__file__).with_name(name).read_text(encoding="utf-8")
