"""The solution's side of a hidden-test check: run the agent's program, then answer calls of its function.

Reads ``solution.json`` (the solution, the task's code prompt, entry point and test setup). Writes one JSON
line to descriptor 5 when it is ready (or why the solution failed to load), then, for each call read from
descriptor 4, one line with the value returned (encoded by ``codec``) or the error raised. Nothing written here
is a verdict: the test process decides, from the values alone.
"""

import ast
import json
import os
import sys
import textwrap
import traceback

import codec

CALLS_FD, ANSWERS_FD = 4, 5


def _defines(source, name):
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
               for node in tree.body)


def _programs(problem):
    solution, prompt = problem["solution"], problem["code_prompt"]
    if not prompt or _defines(solution, problem["entry_point"]):
        return [(prompt, "prompt.py"), (solution, "solution.py")]
    body = textwrap.indent(textwrap.dedent(solution), "    ")  # a completion: the body of the prompt's function
    return [(prompt + solution if _defines(prompt + solution, problem["entry_point"]) else prompt + body,
             "solution.py")]


def _error(error):
    return f"{type(error).__name__}: {error}"[:300]


def _setup_classes(problem):
    """The classes the tests define, to rebuild objects the tests pass as arguments."""
    namespace = {"__name__": "__tests__"}
    try:
        exec(compile(problem["code_prompt"] + "\n" + problem["test_setup"], "tests_setup.py", "exec"), namespace)
    except BaseException:  # noqa: BLE001 - the test process reports setup errors
        pass
    return {name: value for name, value in namespace.items() if isinstance(value, type)}


def main():
    sys.set_int_max_str_digits(0)
    with open("solution.json", encoding="utf-8") as handle:
        problem = json.load(handle)
    calls, answers = os.fdopen(CALLS_FD, "rb"), os.fdopen(ANSWERS_FD, "wb", buffering=0)

    def send(message):
        answers.write((json.dumps(message) + "\n").encode())

    namespace = {"__name__": "__solution__"}
    try:
        for source, filename in _programs(problem):
            exec(compile(source, filename, "exec"), namespace)
        function = namespace[problem["entry_point"]]
    except BaseException as error:  # noqa: BLE001 - the solution's own failure is the answer
        traceback.print_exc()
        send({"error": _error(error)})
        return
    classes = _setup_classes(problem)
    send({"ready": True})
    for line in calls:
        try:
            request = json.loads(line)
            args = codec.decode(request["args"], classes)
            kwargs = codec.decode(request["kwargs"], classes)
            reply = {"value": codec.encode(function(*args, **kwargs))}
        except BaseException as error:  # noqa: BLE001 - an exception in the solution fails that test only
            reply = {"error": _error(error)}
        send(reply)


main()
