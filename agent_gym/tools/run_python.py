"""The ``run_python`` tool: the agent runs a Python program in the sandbox and reads how it went.

Each call is a fresh process in a fresh directory (:class:`~agent_gym.tools.sandbox.Sandbox`): nothing carries
over from an earlier call, so a program must define what it uses. The observation starts with one status line
(finished, exit code, exception, timeout, memory limit, crash) followed by the clipped stdout and stderr.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

from agent_gym.error import InvalidValue
from agent_gym.tools.core import Tool, ToolResult
from agent_gym.tools.sandbox import Sandbox, SandboxError

__all__ = ["PythonTool"]


class PythonTool(Tool):
    """``run_python(code)``: run a program in a sandbox and return its status line, stdout and stderr.

    Args:
        sandbox: where programs run (:class:`~agent_gym.tools.sandbox.Sandbox` with its default limits).
        workers: programs of one batch (the calls of a vector env's turn) that run at once.
        count_asserts: report how many of the program's module-level ``assert`` statements that call something
            passed, as ``metadata["progress"]``; the env pays a process reward when that count beats the
            episode's best (see :meth:`~agent_gym.env.ToolEnv` and the coding envs).
    """

    name = "run_python"
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a complete Python 3 program; print what you "
                                                                 "want to see"}},
        "required": ["code"],
    }
    timeout_s = None  # the sandbox enforces its own wall-clock limit on every program

    def __init__(self, sandbox: Sandbox | None = None, *, workers: int = 2, count_asserts: bool = False) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidValue(f"workers must be a positive int, got {workers!r}")
        self.sandbox = sandbox or Sandbox()
        self.workers = workers
        self.count_asserts = count_asserts
        limits = self.sandbox.limits
        self.description = (
            "Run a Python 3 program in a sandbox and get its output. Each call is a fresh process: define "
            f"everything you use. Limits: {limits.wall_s:g} s, {limits.memory_mb} MiB of memory, no network, no "
            "subprocesses, files only in the working directory. Print the values you want to see."
        )

    def run(self, code: str) -> ToolResult:
        if len(code) > self.sandbox.limits.code_chars:
            return ToolResult.error(f"the program has {len(code):,} characters; the limit is "
                                    f"{self.sandbox.limits.code_chars:,}")
        try:
            outcome = self.sandbox.run(code, count_asserts=self.count_asserts)
        except SandboxError as error:
            return ToolResult.error(f"the sandbox could not run the program: {error}")
        metadata: dict[str, Any] = {"status": outcome.status, "exit_code": outcome.exit_code,
                                    "isolation": outcome.isolation}
        if self.count_asserts:
            metadata["progress"] = sum(1 for record in outcome.reports if record.get("kind") == "assert_passed")
        return ToolResult(text=outcome.observation(), metadata=metadata)

    def run_batch(self, calls: Sequence[dict[str, Any]]) -> list[ToolResult]:
        if len(calls) <= 1 or self.workers == 1:
            return [self.run(**arguments) for arguments in calls]
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="run-python") as pool:
            return list(pool.map(lambda arguments: self.run(**arguments), calls))
