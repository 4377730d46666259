"""Tools: the :class:`Tool` core, the ``calculate`` tool and the sandboxed ``run_python`` tool (docs/DESIGN.md §1, §3).

Code that runs model output lives here: :mod:`agent_gym.tools.sandbox` runs Python in a separate, limited
process, and :mod:`agent_gym.tools.calculator` evaluates arithmetic without ``eval``.
"""

from agent_gym.tools.core import DEFAULT_TIMEOUT_S, FunctionTool, Tool, ToolResult, tool, validate_arguments

__all__ = ["Tool", "ToolResult", "FunctionTool", "tool", "validate_arguments", "DEFAULT_TIMEOUT_S"]
