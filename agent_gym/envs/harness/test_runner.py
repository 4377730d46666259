"""The tests' side of a hidden-test check: run each test, calling the solution's function in its own process.

Reads ``tests.json`` (the task's code prompt, entry point, test setup and test statements). The entry point
and ``candidate`` are stubs that send each call to the solution's process (descriptor 5) and read back the
value (descriptor 4), which ``codec`` admits only as a built-in value. The results go to the report pipe
(descriptor 3), which only this process holds: the solution's code never runs here, so it cannot write them.
"""

import json
import os
import sys

import codec

REPORT_FD, ANSWERS_FD, CALLS_FD = 3, 4, 5
MAX_ANSWER_BYTES = 16 << 20


def _emit(record):
    os.write(REPORT_FD, (json.dumps(record) + "\n").encode())


def _text(message):
    """Text from the solution's process as valid UTF-8 (it may hold lone surrogates)."""
    return str(message)[:300].encode("utf-8", "replace").decode("utf-8")


class _SolutionError(Exception):
    """The solution raised, returned a value that is not built-in, or its process is gone."""


class Solution:
    """The solution's process, seen from here: one request, one answer line."""

    def __init__(self):
        self.answers = os.fdopen(ANSWERS_FD, "rb")
        self.calls = os.fdopen(CALLS_FD, "wb", buffering=0)
        self.broken = None

    def receive(self):
        if self.broken:
            raise _SolutionError(self.broken)
        line = self.answers.readline(MAX_ANSWER_BYTES)
        if not line.endswith(b"\n"):
            self.broken = "the solution's process ended" if not line else "the solution's answer is too large"
            raise _SolutionError(self.broken)
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if type(message) is not dict:
            self.broken = "the solution's process answered garbage"
            raise _SolutionError(self.broken)
        return message

    def call(self, args, kwargs):
        if self.broken:
            raise _SolutionError(self.broken)
        request = {"args": codec.encode(list(args), objects=True), "kwargs": codec.encode(kwargs, objects=True)}
        try:
            self.calls.write((json.dumps(request) + "\n").encode())
        except OSError:
            self.broken = "the solution's process ended"
            raise _SolutionError(self.broken) from None
        message = self.receive()
        if "error" in message:
            raise _SolutionError(_text(message["error"]))
        try:
            return codec.decode(message.get("value"))
        except (ValueError, RecursionError) as error:
            raise _SolutionError(_text(error)) from None


def main():
    sys.set_int_max_str_digits(0)
    with open("tests.json", encoding="utf-8") as handle:
        problem = json.load(handle)
    solution = Solution()
    try:
        ready = solution.receive()
    except _SolutionError as error:
        ready = {"error": str(error)}
    if ready.get("ready") is not True:
        _emit({"kind": "solution_error", "error": _text(ready.get("error", "the solution did not load"))})
        return

    def candidate(*args, **kwargs):
        return solution.call(args, kwargs)

    namespace = {"__name__": "__tests__"}
    steps = [(problem["code_prompt"], False), (problem["test_setup"], False)]
    steps += [(source, is_test) for source, is_test in problem["tests"]]
    index = 0
    for number, (source, is_test) in enumerate(steps):
        try:
            exec(compile(source, "tests.py", "exec"), namespace)
            error = None
        except BaseException as caught:  # noqa: BLE001 - a failing test is a result
            error = _text(f"{type(caught).__name__}: {caught}") or type(caught).__name__
            if not is_test:
                _emit({"kind": "setup_error", "error": error})
                return
        if number == 0:  # the prompt defines a stub of the function: the tests call the solution's instead
            namespace[problem["entry_point"]] = namespace["candidate"] = candidate
        if is_test:
            _emit({"kind": "test", "index": index, "passed": error is None, "error": error})
            index += 1
    _emit({"kind": "done"})


main()
