"""Every error agent-gym raises on purpose derives from one base, and keeps the base it had before."""

from __future__ import annotations

import pytest

from agent_gym.agents.model_policy import ModelPolicyError
from agent_gym.envs.datasets.download import DatasetChecksumError, DatasetNotAvailable
from agent_gym.envs.datasets.files import DatasetFormatError
from agent_gym.error import AgentGymError
from agent_gym.formats import JSONProblem
from agent_gym.models.chat_template import ChatTemplateError
from agent_gym.models.model_init import ModelInitError
from agent_gym.policies import PolicyError
from agent_gym.retrieval_index.base import RetrievalError
from agent_gym.retrieval_index.engines.pyserini_bm25 import PyseriniUnavailableError
from agent_gym.retrieval_index.manifest import IndexMismatchError, IndexNotFoundError
from agent_gym.tools.calculator import CalculatorError
from agent_gym.tools.sandbox import SandboxError, SandboxUnavailable
from agent_gym.trainers.backends.base import GenerationError
from agent_gym.trainers.checkpoint import CheckpointError
from agent_gym.trainers.config import ConfigError
from agent_gym.trainers.rollout import RolloutError

ERRORS_AND_OLD_BASES = [
    (CalculatorError, ValueError),
    (DatasetFormatError, ValueError),
    (DatasetNotAvailable, FileNotFoundError),
    (DatasetChecksumError, ValueError),
    (PolicyError, ValueError),
    (JSONProblem, ValueError),
    (RetrievalError, RuntimeError),
    (PyseriniUnavailableError, ImportError),
    (IndexNotFoundError, FileNotFoundError),
    (IndexMismatchError, RetrievalError),
    (SandboxError, RuntimeError),
    (SandboxUnavailable, RuntimeError),
    (GenerationError, RuntimeError),
    (ChatTemplateError, ValueError),
    (CheckpointError, RuntimeError),
    (ConfigError, ValueError),
    (ModelInitError, ValueError),
    (ModelPolicyError, RuntimeError),
    (RolloutError, RuntimeError),
]


@pytest.mark.parametrize(("error", "old_base"), ERRORS_AND_OLD_BASES, ids=lambda item: item.__name__)
def test_each_error_derives_from_agent_gym_error_and_keeps_its_old_base(error: type, old_base: type) -> None:
    assert issubclass(error, AgentGymError)
    assert issubclass(error, old_base)


def test_one_except_clause_catches_errors_from_different_modules() -> None:
    caught = []
    for error in (CalculatorError("bad expression"), DatasetNotAvailable("no file")):
        try:
            raise error
        except AgentGymError as exc:
            caught.append(type(exc))
    assert caught == [CalculatorError, DatasetNotAvailable]


def _exception_classes_in_the_package() -> dict[str, list[str]]:
    """Public classes of agent_gym that derive (by name, read from the source) from an exception."""
    import ast
    import builtins
    from pathlib import Path

    import agent_gym

    bases_of: dict[str, list[str]] = {}
    for path in Path(agent_gym.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                names = [base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases]
                bases_of[node.name] = names
    builtin_exceptions = {name for name, value in vars(builtins).items()
                          if isinstance(value, type) and issubclass(value, BaseException)}
    exceptions = set(builtin_exceptions)
    while True:  # a class is an exception if one of its bases is, in the package or builtins
        grown = exceptions | {name for name, bases in bases_of.items() if exceptions.intersection(bases)}
        if grown == exceptions:
            break
        exceptions = grown
    return {name: bases for name, bases in bases_of.items() if name in exceptions}


def _derives_from_exception(name: str, found: dict[str, list[str]]) -> bool:
    """Whether a package exception class derives (by base names) from ``Exception``, not only ``BaseException``."""
    import builtins

    for base in found.get(name, []):
        builtin = getattr(builtins, base, None)
        if isinstance(builtin, type) and issubclass(builtin, Exception):
            return True
        if base in found and base != name and _derives_from_exception(base, found):
            return True
    return False


def test_every_public_exception_class_in_the_package_derives_from_agent_gym_error() -> None:
    # Found from the source, so an error added later cannot be missed by a hand-kept list.
    found = _exception_classes_in_the_package()
    ours = {"AgentGymError"}
    while True:
        grown = ours | {name for name, bases in found.items() if ours.intersection(bases)}
        if grown == ours:
            break
        ours = grown
    # Stop signals are not errors: UsageError is the CLI's exit-2 SystemExit (argparse's convention), and the
    # Ctrl-C/SIGTERM stops (KeyboardInterrupt, BaseException) must not be caught by an `except Exception`.
    signals = {name for name, bases in found.items() if not _derives_from_exception(name, found)}
    assert {"UsageError", "TrainingInterrupted", "EvaluationInterrupted", "StopRequested"} <= signals
    outside = sorted(set(found) - ours - signals)
    assert {"RemoteEnvError", "RayClusterError", "EnvPoolError", "SandboxError"} <= ours
    assert outside == [], f"exceptions not derived from AgentGymError: {outside}"


#: The modules that check what a user gives gym.make, reset and step (settings, options, task ids, datasets,
#: tool formats, reward specs, retrievers): every error they raise on purpose must be an AgentGymError.
VALIDATING_MODULES = ("env.py", "tasks.py", "validation.py", "registration.py", "rewards.py", "spaces.py",
                      "vector.py", "formats.py", "context_summary.py", "envs", "retrieval_index/build.py")
VALIDATION_BUILTINS = {"ValueError", "TypeError", "KeyError", "IndexError", "LookupError"}


def _raised_builtins(relative_paths: tuple[str, ...]) -> list[str]:
    """``path:line name`` of each ``raise ValueError(...)`` (or another built-in validation error) in the modules."""
    import ast
    from pathlib import Path

    import agent_gym

    root = Path(agent_gym.__file__).parent
    paths = []
    for relative in relative_paths:
        path = root / relative
        paths += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # IndexError out of __getitem__ is the sequence protocol (iteration stops on it), not a validation error.
        protocol = {id(node) for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
                    and function.name == "__getitem__" for node in ast.walk(function)}
        for node in ast.walk(tree):
            if id(node) in protocol:
                continue
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(raised, ast.Name) and raised.id in VALIDATION_BUILTINS:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {raised.id}")
    return found


def test_the_scan_finds_a_raised_builtin(tmp_path, monkeypatch) -> None:
    import agent_gym

    package = tmp_path / "agent_gym"
    package.mkdir()
    (package / "env.py").write_text("def f(x):\n    if x:\n        raise ValueError('bad x')\n")
    monkeypatch.setattr(agent_gym, "__file__", str(package / "__init__.py"))
    assert _raised_builtins(("env.py",)) == ["env.py:3 ValueError"]


def test_validation_errors_are_agent_gym_errors_that_keep_their_builtin_base() -> None:
    assert _raised_builtins(VALIDATING_MODULES) == []


@pytest.mark.parametrize(
    ("call", "builtin"),
    [
        (lambda gym: gym.make("AgentR1-SynthHop-v0", hops=9, num_pages=200, num_questions=5), ValueError),
        (lambda gym: gym.make("AgentR1-SynthHop-v0", context="bogus", num_pages=200, num_questions=5), ValueError),
        (lambda gym: gym.make("AgentR1-SynthHop-v0", hop=2), TypeError),
        (lambda gym: gym.make("AgentR1-Calculator-v0").reset(options={"bogus": 1}), ValueError),
        (lambda gym: gym.make("AgentR1-Calculator-v0").reset(options={"task_id": "nope"}), KeyError),
    ],
    ids=["hops=9", "context=bogus", "hop=2", "unknown reset option", "unknown task_id"],
)
def test_a_validation_error_is_caught_by_agent_gym_error_and_by_its_builtin(call, builtin: type) -> None:
    import gymnasium as gym

    import agent_gym  # noqa: F401  (registers the ids)

    with pytest.raises(AgentGymError) as caught:
        call(gym)
    assert isinstance(caught.value, builtin)


def test_no_module_of_the_package_raises_a_bare_builtin_validation_error() -> None:
    """Beyond the validating modules: trainers, adapters, tools, the CLI... (the sandbox's child is left out: it
    runs model-written code with the standard library alone, and imports nothing of agent_gym)."""
    from pathlib import Path

    import agent_gym

    root = Path(agent_gym.__file__).parent
    modules = tuple(str(path.relative_to(root)) for path in sorted(root.rglob("*.py"))
                    if path.name != "sandbox_child.py")
    assert _raised_builtins(modules) == []
