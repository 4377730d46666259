"""MBPP (Austin et al., 2021) from its official files, where a user has one (no copy is bundled).

Both layouts of the google-research/mbpp repository load: ``mbpp.jsonl`` (``text``, ``code``,
``test_setup_code``, ``test_list``, ``challenge_test_list``) and ``sanitized-mbpp.json`` (``prompt``, ``code``,
``test_imports``, ``test_list``). As in the MBPP paper's prompt, the task shows the problem and its
``test_list`` asserts; the hidden tests are those asserts plus any ``challenge_test_list``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from agent_gym.envs.datasets.files import DatasetFormatError, read_json_records
from agent_gym.envs.hidden_tests import CodeProblem, TestStatement
from agent_gym.error import InvalidValue

__all__ = ["load_mbpp", "problem_from_record"]

_LAYOUT = "MBPP records with task_id, text (or prompt), code and test_list"


def _called_function(test: str) -> str:
    """The name of the function an MBPP assert calls first (``assert remove_Occ("hello","l") == "heo"``)."""
    for node in ast.walk(ast.parse(test)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return node.func.id
    raise InvalidValue(f"no function call in the test {test!r}")


def problem_from_record(record: dict[str, Any]) -> CodeProblem:
    """A :class:`CodeProblem` from one MBPP record (either official layout)."""
    try:
        text = record["text"] if "text" in record else record["prompt"]
        tests = [str(test) for test in record["test_list"]]
        hidden = tests + [str(test) for test in record.get("challenge_test_list") or []]
        setup = record.get("test_setup_code") or "\n".join(record.get("test_imports") or [])
        entry_point = _called_function(tests[0])
        statements = tuple(TestStatement(ast.unparse(ast.parse(test)), True) for test in hidden)
        task_id = f"MBPP/{record['task_id']}"
        solution = str(record["code"])
    except (KeyError, IndexError, TypeError, SyntaxError, ValueError) as error:
        raise DatasetFormatError(f"MBPP record {record.get('task_id')!r}: {error}; expected {_LAYOUT}") from error
    shown = "\n".join(tests)
    prompt = f"{text}\nYour code should pass these tests:\n\n{shown}\n"
    return CodeProblem(id=task_id, prompt=prompt, entry_point=entry_point, solution=solution,
                       stub=f"def {entry_point}(*args):\n    pass\n", test_setup=setup, tests=statements)


def load_mbpp(data_path: str | Path) -> list[CodeProblem]:
    """The MBPP problems of an official file (``mbpp.jsonl`` or ``sanitized-mbpp.json``, plain, gzip or xz)."""
    return [problem_from_record(record) for record in read_json_records(data_path, _LAYOUT)]
